-- Rows in the published CollabLLM multiturn schema (one row per conversation, turn and
-- candidate: prompt, completion, conv_id, turn_id, score, single_turn_prompt,
-- single_turn_completion, single_turn_metadata, sessions, rewards), as the datasets on the
-- Hugging Face hub export them: a math-hard file (accuracy) and a medium one (bleu_score).
--   local path, refs = require("support.published_rows").write(dir, "math", 10)
local M = {}

M.KINDS = {
  math = { file = "collabllm-multiturn-math-hard.jsonl", what = "Compute %d + %d.", ref = "The answer is %d." },
  medium = { file = "collabllm-multiturn-medium.jsonl", what = "Please write an article about garden number %d (%d).",
    ref = "Garden %d is a quiet place with old trees and a pond." },
}

local function msg(role, content) return { role = role, content = content } end

-- `conversations` conversations of two turns and two candidates each; returns the file's
-- path, the references, and the single-turn tasks (a set).
function M.write(dir, kind, conversations)
  local k = assert(M.KINDS[kind], "published_rows: kind is math or medium")
  local rows, refs, tasks = {}, {}, {}
  for c = 1, conversations do
    local stp = k.what:format(c, c * 3)
    local ref = k.ref:format(c * 4)
    refs[#refs + 1] = ref
    tasks[stp] = true
    for t = 0, 1 do
      for cand = 1, 2 do
        local p = { msg("user", "help with task " .. c) }
        if t == 1 then p[2] = msg("assistant", "which part?"); p[3] = msg("user", "all of it") end
        rows[#rows + 1] = { prompt = p, completion = "cand " .. cand, conv_id = c, turn_id = t, score = cand / 2,
          single_turn_prompt = stp, single_turn_completion = ref, single_turn_metadata = { id = c },
          sessions = {}, rewards = {} }
      end
    end
  end
  local path = dir .. "/" .. k.file
  require("clrt.data").write_jsonl(path, rows)
  return path, refs, tasks
end

return M
