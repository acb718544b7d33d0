-- accuracy — an LLM judge decides whether the conversation's FINAL answer to the target
-- question (sample.single_turn_prompt) is correct against the ground truth
-- (sample.ground_truth). JSON reply: {"thought": "...", "accuracy": 0 or 1}.
-- The judge sees the conversation without the system message, the question and the
-- ground truth (as verl's and the authors' accuracy judges do). true/false and "0"/"1"
-- are accepted; a reply with any other value or a missing key is asked again
-- ctx.judge_options.parse_retries times (default 1), then the metric raises and the recipe
-- records it as failed. ctx: see metrics/lib/judge.lua.
local judge = require("metrics.lib.judge")
local conv = require("clrt.conversation")
local pf = require("clrt.prompt_file")

local M = { name = "accuracy", uses_judge = true }   -- uses_judge: the run checks the judge's endpoint before its first step

-- The prompt: lua/prompts/judge_accuracy.txt (its header lists what it carries from which
-- reference and its placeholders); reward.metric_options.accuracy.prompt_file=PATH runs
-- another text, e.g. verl's or the authors' own.
M.PROMPT_FILE = "judge_accuracy"
M.PROMPT = pf.read(M.PROMPT_FILE)

function M.check(obj)
  local v = obj.accuracy
  if v == true then return 1 end
  if v == false then return 0 end
  if type(v) == "string" then v = tonumber(v) end
  if v == 0 or v == 1 then return v end
  return nil, "accuracy is not 0 or 1: " .. tostring(obj.accuracy)
end

function M.compute(conversation, sample, ctx)
  if sample.single_turn_prompt == nil or sample.ground_truth == nil then
    error("accuracy: sample needs single_turn_prompt and ground_truth", 0)
  end
  local tmpl, file = judge.prompt_text(ctx, "accuracy", M.PROMPT_FILE)
  local gt = tostring(sample.ground_truth)
  local text = pf.fill(tmpl, { single_turn_prompt = tostring(sample.single_turn_prompt), ground_truth = gt, groundtruth = gt,
    chat_history = conv.chat_history(conversation),
    completion = require("clrt.json").encode(conv.without_system(conversation)) }, file)
  -- the judge's thought goes with the score (clrt.train.reward.score_conversation's note)
  local v, obj = judge.ask(ctx, "accuracy", { { role = "user", content = text } }, { "accuracy" }, M.check)
  return v, judge.note(obj)
end

return M
