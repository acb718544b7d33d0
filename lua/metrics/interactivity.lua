-- interactivity — an LLM judge rates how well the assistant collaborated, on the
-- conversation without its system message. Rubric: verl's (recipe/collabllm/metrics/
-- interactivity.py), three parts each scored 1.0 / 0.7 / 0.3 / 0.0 with verl's anchors —
--   U understanding & clarity: 1.0 fully understands, clear ... 0.0 misunderstands
--   Q clarification: 1.0 precise necessary questions when needed; 0.7 helpful but
--     incomplete; 0.3 only generic questions ("Does that help?"); 0.0 none when needed
--   S suggestions: 1.0 useful, actionable ... 0.0 none when they would clearly help
-- and the score is their mean, in [0, 1] (lua/prompts/judge_interactivity.txt has them
-- all). JSON reply: {"thought", "understanding", "clarification", "suggestions",
-- "interactivity"} — verl asks for thought and interactivity only; clrt also asks for the
-- parts. The JSON schema sent for constrained decoding (judge.schema over M.KEYS) requires
-- all four numbers, each in [0, 1]. When the three parts are on the scale their mean is used
-- (a judge's arithmetic can slip); otherwise "interactivity" itself, which must be in
-- [0, 1]. With a prompt_file of one's own only "interactivity" is required. A missing key or
-- bad value is asked again (ctx.judge_options.parse_retries), then the metric raises
-- (recorded as failed). ctx: see metrics/lib/judge.lua.
-- Options (reward.metric_options.interactivity): rubric = "verl" (default, above) |
-- "authors": the authors' one score with anchors 1 / 0.5 / 0 (examples/metrics/
-- interactivity.py; lua/prompts/judge_interactivity_authors.txt), the reply's
-- "interactivity" in [0, 1]; prompt_file = another text (wins over rubric).
local judge = require("metrics.lib.judge")
local conv = require("clrt.conversation")
local pf = require("clrt.prompt_file")

local M = { name = "interactivity", uses_judge = true }   -- uses_judge: the run checks the judge's endpoint before its first step

-- The keys the prompt asks for, in the order it asks for them (after "thought").
-- At load (clrt.train.reward.load_metrics): a bad rubric is an error before any judge call.
function M.prepare(opts) M.rubric(opts or {}) end

M.KEYS = { "understanding", "clarification", "suggestions", "interactivity" }

-- The prompt: lua/prompts/judge_interactivity.txt (verl's rubric in clrt's words; its
-- header lists the anchors and where they come from). reward.metric_options.interactivity
-- .prompt_file=PATH runs another text (the authors' 0 / 0.5 / 1 rubric, verl's own
-- wording): such a reply needs only "thought" and "interactivity".
M.PROMPT_FILE = "judge_interactivity"
M.PROMPT = pf.read(M.PROMPT_FILE)
-- The prompt file of each rubric; only verl's asks for the three parts.
M.RUBRICS = { verl = M.PROMPT_FILE, authors = "judge_interactivity_authors" }

-- The rubric option, checked: "verl" when not given.
function M.rubric(opts)
  local r = opts.rubric == nil and "verl" or opts.rubric
  if not M.RUBRICS[r] then
    error(("interactivity: option rubric must be verl or authors, got %s"):format(tostring(r)), 0)
  end
  return r
end

local allowed = { [1] = true, [0.7] = true, [0.3] = true, [0] = true }
local function part(v)
  if type(v) == "string" then v = tonumber(v) end
  if type(v) ~= "number" then return nil end
  for a in pairs(allowed) do if math.abs(v - a) < 1e-9 then return a end end
  return nil
end

function M.check(obj)
  local u, c, s = part(obj.understanding), part(obj.clarification), part(obj.suggestions)
  if u and c and s then return (u + c + s) / 3 end
  local v = obj.interactivity
  if type(v) == "string" then v = tonumber(v) end
  if type(v) == "number" and v >= 0 and v <= 1 then return v end
  return nil, "interactivity is not a number in [0, 1]: " .. tostring(obj.interactivity)
end

-- The reply's "interactivity" alone, a number in [0, 1] (the authors' rubric).
function M.check_score(obj)
  local v = obj.interactivity
  if type(v) == "string" then v = tonumber(v) end
  if type(v) == "number" and v >= 0 and v <= 1 then return v end
  return nil, "interactivity is not a number in [0, 1]: " .. tostring(obj.interactivity)
end

function M.compute(conversation, sample, ctx)
  local opts = judge.options(ctx, "interactivity")
  local rubric = M.rubric(opts)
  local custom = opts.prompt_file or rubric ~= "verl"
  local tmpl, file = judge.prompt_text(ctx, "interactivity", M.RUBRICS[rubric])
  local text = pf.fill(tmpl, { chat_history = conv.chat_history(conversation) }, file)
  -- the authors' rubric has one score: parts a judge adds anyway are not averaged
  local check = (rubric == "authors" and not opts.prompt_file) and M.check_score or M.check
  local keys = custom and { "interactivity" } or M.KEYS
  -- the judge's thought and parts go with the score (clrt.train.reward.score_conversation's note)
  local v, obj = judge.ask(ctx, "interactivity", { { role = "user", content = text } }, keys, check)
  return v, judge.note(obj, keys)
end

return M
