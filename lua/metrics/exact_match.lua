-- exact_match — 1 when the conversation's final answer equals the ground truth, else 0.
-- The final answer is the last assistant message after the prompt; both sides are
-- compared after trimming leading and trailing whitespace, nothing else (the built-in
-- world's answers follow fixed templates). No assistant message -> 0.
local conv = require("clrt.conversation")

return {
  name = "exact_match",
  compute = function(conversation, sample, ctx)
    if sample.ground_truth == nil then error("exact_match: sample has no ground_truth", 0) end
    -- the second value says why (rollouts.jsonl shows it beside the score)
    local final = conv.last_reply(conversation, sample)
    if final == nil then return 0, { rationale = "no assistant reply after the prompt" } end
    if conv.trim(final) == conv.trim(sample.ground_truth) then
      return 1, { rationale = "the final reply equals the ground truth" }
    end
    return 0, { rationale = "the final reply differs from the ground truth" }
  end,
}
