-- token_amount — the length cost of a conversation: the number of whitespace-separated
-- words in every message after the prompt (the first response A1, the simulated user's
-- turns including a termination-marker message, and the later assistant turns). This is
-- verl's rule (`len(content.split())` over the messages after the prompt, recipe/collabllm/
-- metrics/token_amount.py; weight -0.0001 in its train_rl_collabllm.sh). The authors'
-- efficiency metric, assistant tokens / 1000, is lua/metrics/tokens_read.lua. Give it a
-- negative weight to make it a cost.
local conv = require("clrt.conversation")

return {
  name = "token_amount",
  compute = function(conversation, sample, ctx)
    local n = 0
    for _, m in ipairs(conv.after_prompt(conversation, sample)) do n = n + conv.word_count(m.content) end
    return n
  end,
}
