-- Writes tests/fixtures/collabllm/multiturn_small.jsonl: a small file in the published
-- CollabLLM multiturn schema (one row per conversation x turn x candidate), with the
-- cases process_dataset must handle: several candidates per prompt (RL dedup), several
-- turns per conversation (SFT keeps the last turn), score ties broken by file order, a
-- numeric and a string conv_id, and metadata with tests.
--   clrt tests/reference/make_collabllm_fixture.lua
local data = require("clrt.data")
local rows = {}
local function row(conv, turn, cand, score, extra)
  local prompt = { { role = "user", content = ("Question %s, please help."):format(conv) } }
  if turn >= 2 then
    prompt[2] = { role = "assistant", content = ("What exactly about %s?"):format(conv) }
    prompt[3] = { role = "user", content = ("The details of %s."):format(conv) }
  end
  if turn >= 3 then
    prompt[4] = { role = "assistant", content = "Anything else?" }
    prompt[5] = { role = "user", content = "Yes, be brief." }
  end
  local r = {
    prompt = prompt, completion = ("answer %s t%d c%d"):format(conv, turn, cand),
    conv_id = conv, turn_id = turn, score = score,
    single_turn_prompt = ("Question %s, full version."):format(conv),
    single_turn_completion = ("Reference answer %s."):format(conv),
    single_turn_metadata = { test = ("assert True  # %s"):format(conv) },
    sessions = { { { role = "user", content = "future" } } },
    rewards = { accuracy = { 1, 0 }, interactivity = { 0.7, 0.3 } },
  }
  for k, v in pairs(extra or {}) do r[k] = v end
  rows[#rows + 1] = r
end
-- conv "a": turns 1-2, two candidates each; best at turn 2 is c2 (0.9)
row("a", 1, 1, 0.95); row("a", 1, 2, 0.1); row("a", 2, 1, 0.4); row("a", 2, 2, 0.9)
-- conv "b": turns 1-3; turn 3 has a tie (0.5, 0.5): the first in file order wins
row("b", 1, 1, 0.3); row("b", 3, 1, 0.5); row("b", 3, 2, 0.5); row("b", 2, 1, 0.99)
-- conv 7 (numeric id): one turn, three candidates, a negative score
row(7, 1, 1, -0.2); row(7, 1, 2, 0.05); row(7, 1, 3, 0.0)
-- conv "d": empty single_turn_completion: RL ground truth falls back to the completion
row("d", 1, 1, 0.6, { single_turn_completion = "" })
-- convs e..n: one row each, to make the split sizes visible
for i, c in ipairs({ "e", "f", "g", "h", "i", "j", "k", "l", "m", "n" }) do row(c, 1, 1, i / 10) end
data.write_jsonl(T_OUT or "tests/fixtures/collabllm/multiturn_small.jsonl", rows)
print(#rows .. " rows")
