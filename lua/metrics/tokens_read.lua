-- tokens_read — the authors' efficiency metric (Wuyxin/collabllm examples/metrics/
-- efficiency.py, registered there as "token_amount", reported as "num_tokens_read(k)"):
-- the thousands of tokens the user has to read, i.e. the assistant's text in the whole
-- conversation (prompt turns included, system message excluded), the assistant messages
-- joined by one space and tokenized once, divided by 1000. The authors count with tiktoken's
-- cl100k_base; clrt counts with the policy's own tokenizer (ctx.tokenizer, no special
-- tokens), so the number is in the policy's tokens. The paper's "tokens read" and the
-- authors' reward cost (their MR weight -0.5 on it) use this quantity.
--
-- Not verl's token_amount (lua/metrics/token_amount.lua: whitespace words of every message
-- after the prompt, user turns included, weight -0.0001 in verl's recipe). With
-- reward.mode=mean and the authors' weights, use this metric: -0.5 per thousand tokens,
-- where token_amount would charge -0.5 per word.
-- A conversation with no tokenizer in ctx is a failed metric (an error), never a 0.
local conv = require("clrt.conversation")

local M = { name = "tokens_read" }

function M.compute(conversation, sample, ctx)
  local tok = ctx and ctx.tokenizer
  if not tok then error("tokens_read: no tokenizer in ctx.tokenizer (the policy's tokenizer counts the tokens)", 0) end
  local parts = {}
  for _, m in ipairs(conversation) do
    if m.role == "assistant" then parts[#parts + 1] = tostring(m.content or "") end
  end
  if #parts == 0 then return 0 end
  return #tok:encode(table.concat(parts, " "), { add_special_tokens = false }) / 1000
end

return M
