-- answer_attempt — Lost in Conversation's strategy judge (arXiv 2505.06120; the authors'
-- system_agent.py turn classification): 1 when the conversation's last assistant reply is a
-- complete answer attempt, else 0; its note names which of the paper's seven response types
-- the judge chose (answer_attempt, clarification, interrogation, discussion, hedge, refuse,
-- missing). collabllm_eval.lua protocol=sharded asks it after every assistant turn and scores
-- the task's metric on the attempts. The judge is shown the task's shards (sample.shards:
-- the first, the intent, and the others), what a complete answer is
-- (sample.answer_description) and the last reply only (the authors' "last turn"). A reply
-- that names no known type is asked again (clrt.llm_reply), then the metric raises.
local judge = require("metrics.lib.judge")
local conv = require("clrt.conversation")
local json = require("clrt.json")
local pf = require("clrt.prompt_file")

local M = { name = "answer_attempt", uses_judge = true }   -- uses_judge: the run checks the judge's endpoint first

-- The prompt: lua/prompts/sharded_strategy.txt (its header: what it carries and its
-- placeholders); reward.metric_options.answer_attempt.prompt_file=PATH runs another text.
M.PROMPT_FILE = "sharded_strategy"
M.PROMPT = pf.read(M.PROMPT_FILE)

M.TYPES = {}
for _, t in ipairs(judge.KEY_TYPES.response_type.enum) do M.TYPES[t] = true end

function M.check(obj)
  local t = obj.response_type
  if type(t) == "string" and M.TYPES[t] then return t end
  return nil, "response_type is not one of the seven types: " .. tostring(t)
end

function M.compute(conversation, sample, ctx)
  local shards = sample.shards
  if type(shards) ~= "table" or not shards[1] then error("answer_attempt: sample has no shards", 0) end
  local rest = {}
  for i = 2, #shards do rest[#rest + 1] = { shard_id = shards[i].id, shard = shards[i].text } end
  local tmpl, file = judge.prompt_text(ctx, "answer_attempt", M.PROMPT_FILE)
  local text = pf.fill(tmpl, { initial_shard = shards[1].text, shards = json.encode(json.array(rest)),
    answer_description = tostring(sample.answer_description or "a complete, final response to the user's request"),
    last_turn = conv.last_reply(conversation, sample) or "" }, file)
  local t, obj = judge.ask(ctx, "answer_attempt", { { role = "user", content = text } }, { "response_type" }, M.check)
  local note = judge.note(obj, { "response_type" })
  return t == "answer_attempt" and 1 or 0, note
end

return M
