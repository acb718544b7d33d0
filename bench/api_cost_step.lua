-- bench/api_cost_step.lua — what one CollabLLM RL step at verl's defaults spends on the
-- simulated user and the judges, measured by clrt's own accounting (clrt.api.usage) on a real
-- collabllm_rl step against the local endpoint tests/support/fake_billing_endpoint.py, next
-- to estimate=true for the same config. Token counts, not timings: the figure of
-- docs/api_cost.md.
--   clrt bench/api_cost_step.lua [steps=1] [per_kind=16] [reply=ok|question] [cache=false|true]
-- cache=false (default) sends every judge request, as the estimate assumes; the tiny policy's
-- identical replies make many futures identical, which a real policy's sampled replies do not.
-- The step: 16 prompts x n=8 x 3 futures, 2 user turns each, max 2048 tokens a turn, the
-- reward verl's (accuracy, interactivity, token_amount), the user and the judges gpt-4o-mini
-- at their published prices. What is real: the recipe, its prompts and conversations, every
-- request the user and judges send (their templates and the conversation as it grew), the
-- accounting. What is not: the policy is a tiny model taught one short reply (a 7B policy
-- writes hundreds of tokens a turn); the data are synthetic rows shaped like the three
-- CollabLLM sets (math, document, code: per_kind of each); the endpoint counts a token per 4
-- bytes of the messages' JSON and answers with short fixed replies (gpt-4o-mini's user and
-- judge replies are longer). So the measured dollars are the floor of a step (templates and
-- prompts); estimate=true with its stated reply lengths gives the step with real-length turns,
-- and an estimate with the measured turn length is printed to check the estimator.
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/[^/]+$") or "bench"
local src = here .. "/.."
package.path = src .. "/tests/?.lua;" .. package.path
local opts = dofile(here .. "/args.lua").parse({ steps = 1, per_kind = 16, reply = "question", cache = "false" }, arg)
local json, data, config, files = require("clrt.json"), require("clrt.data"), require("clrt.config"), require("clrt.files")
local rl = require("recipes.collabllm_rl")

local root = os.tmpname()
os.remove(root)
files.mkdir_p(root)
local policy = require("support.tiny_model")(root .. "/policy", { seed = 5, max_position = 4096 })

-- rows shaped like the three sets: a vague first turn, the full request behind it, a reference
local MATH = "A triangle has sides of length %d, %d and 13. The angle between the first two sides is obtuse. Point P lies on the longest side so that the two smaller triangles formed have equal perimeters. Find the length of the segment from P to the opposite vertex, rounded to the nearest integer, and explain each step of the computation."
local DOC = "Write a blog post of about 600 words for the newsletter of a small design agency (%d staff) about what we learned in our first year of working remotely: how we run meetings, how we keep critique sessions useful over video, the tools we dropped, and one mistake we made with time zones. The tone should be warm and practical, with a short list of takeaways at the end, and it should not read like an advertisement."
local CODE = [[Write a function task_func(csv_path, column, window=%d) that reads a CSV file with pandas, computes the rolling mean and rolling standard deviation of the given numeric column over the given window, drops the rows where either is undefined, and returns a tuple (DataFrame, matplotlib Axes) where the DataFrame has the columns 'value', 'rolling_mean' and 'rolling_std' and the Axes shows the three series against the row index with a legend and the title 'Rolling statistics of <column>'. The function should raise ValueError if the column is missing or not numeric, and FileNotFoundError if the file does not exist.
You should write self-contained code starting with:
```
import pandas as pd
import matplotlib.pyplot as plt
def task_func(csv_path, column, window=%d):
```]]
local rows = {}
for i = 1, opts.per_kind do
  rows[#rows + 1] = { prompt = { { role = "user", content = "I'm stuck on a triangle problem, can you help?" } },
    ground_truth = tostring(6 + i % 5), interaction_kwargs = { single_turn_prompt = MATH:format(5 + i, 7 + i), task_desc = "question answering" } }
  rows[#rows + 1] = { prompt = { { role = "user", content = "Can you help me write a blog post about remote work for our agency?" } },
    ground_truth = ("Our first year of remote work taught us more than we expected. "):rep(40),
    interaction_kwargs = { single_turn_prompt = DOC:format(5 + i), task_desc = "document editing" } }
  rows[#rows + 1] = { prompt = { { role = "user", content = "I need a pandas function for rolling statistics of a CSV column." } },
    ground_truth = "import pandas as pd\nimport matplotlib.pyplot as plt\ndef task_func(csv_path, column, window=3):\n" .. ("    pass\n"):rep(30),
    interaction_kwargs = { single_turn_prompt = CODE:format(i + 2, i + 2), task_desc = "code generation" } }
end
local data_path = root .. "/rl_train.jsonl"
data.write_jsonl(data_path, rows)

-- a random policy never ends its turn: teach the tiny one a short reply that asks back
do
  local sft = require("clrt.sft")
  local m, tok = clrt.model.load(policy), clrt.tokenizer.load(policy)
  local reply = opts.reply == "ok" and "ok" or "Could you tell me a bit more about what you need?"
  local convs = {}
  for i, r in ipairs(rows) do convs[i] = { r.prompt[1], { role = "assistant", content = reply } } end
  sft.train(m, sft.encode(tok, convs, 512), nil, { steps = 60, batch_size = 16, lr = 1e-2, seed = 1 })
  m:save(policy)
end

local srv = dofile(src .. "/tests/support/fake_billing.lua").start(root, {})
local args = { "model=" .. policy, "data=" .. data_path, "run_dir=" .. root .. "/rl", "steps=" .. opts.steps, "sim=llm",
  "sim_cfg.base_url=" .. srv.base_url, "judge.base_url=" .. srv.base_url, "eval.before=false", "eval.after=false",
  "save_every=0", "sample_every=1", "judge.cache=" .. tostring(opts.cache) }
local cfg = config.parse(rl.defaults, args)
local ok, err = pcall(rl.main, cfg)
srv.stop()
if not ok then error(err, 0) end

-- the measured step(s), per role
local rows_out = data.read_jsonl(root .. "/rl/metrics.jsonl")
local roles = {}
for _, r in ipairs(rows_out) do
  for k, v in pairs(r) do
    local role, f = k:match("^api/(.+)/([%a_]+)$")
    if role and type(v) == "number" then
      roles[role] = roles[role] or {}
      roles[role][f] = (roles[role][f] or 0) + v / #rows_out
    end
  end
end
local names = {}
for role in pairs(roles) do names[#names + 1] = role end
table.sort(names)
local tab, tot = {}, { 0, 0, 0, 0, 0 }
for _, role in ipairs(names) do
  local t = roles[role]
  tab[#tab + 1] = { role, t.calls, t.prompt_tokens, t.cached_tokens, t.completion_tokens, ("$%.4f"):format(t.usd),
    ("%.0f"):format(t.prompt_tokens / math.max(1, t.calls - (t.cache_hits or 0))) }
  for i, f in ipairs({ "calls", "prompt_tokens", "cached_tokens", "completion_tokens", "usd", "cache_hits" }) do tot[i] = (tot[i] or 0) + t[f] end
end
tab[#tab + 1] = { "total", tot[1], tot[2], tot[3], tot[4], ("$%.4f"):format(tot[5]), ("%.0f"):format(tot[2] / math.max(1, tot[1] - tot[6])) }
print(("\nmeasured: %d step(s) of collabllm_rl at verl's defaults (means per step), gpt-4o-mini prices of %s"):format(#rows_out,
  require("clrt.api.prices").READ_ON))
io.write(clrt.log.format_table({ "role", "calls", "prompt tok", "cached", "completion tok", "dollars", "prompt tok/sent call" }, tab))
local r1 = rows_out[1]
print(("reply cache hits %s, misses %s per step"):format(r1["api/cache_hits"], r1["api/cache_misses"]))

-- the policy's measured turn length (4 characters a token, the estimate's rule)
local chars, turns = 0, 0
for _, s in ipairs(data.read_jsonl(root .. "/rl/samples.jsonl")) do
  for _, m in ipairs(s.conversation or {}) do
    if m.role == "assistant" then chars, turns = chars + #m.content, turns + 1 end
  end
end
local measured_turn = math.max(1, math.floor(chars / math.max(1, turns) / 4 + 0.5))
print(("\nestimate=true with the measured policy turn (%d tokens) and the endpoint's reply sizes:"):format(measured_turn))
local fake_replies = { assistant_turn = measured_turn, user_message = 12, user_reply = 30, judge_reply = 20 }
local check = require("clrt.train.estimate").run(cfg, "rl", { assume = fake_replies })
print("\nestimate=true at its stated reply lengths (a real policy's turns):")
local real = require("clrt.train.estimate").run(cfg, "rl")
print("\nprompt tokens per request, measured vs estimated with the measured turn length:")
for _, role in ipairs(names) do
  local t, e = roles[role], check.step_roles[role]
  if e then
    print(("  %-20s %6.0f  %6.0f  (%+.0f%%)"):format(role, t.prompt_tokens / math.max(1, t.calls - (t.cache_hits or 0)),
      e.prompt_tokens / e.calls, 100 * ((e.prompt_tokens / e.calls) / (t.prompt_tokens / math.max(1, t.calls - (t.cache_hits or 0))) - 1)))
  end
end
print(("\nsummary: measured $%.4f/step (%d calls); estimate with the measured turns $%.4f/step; "
  .. "estimate with %d-token policy turns $%.4f/step, $%.2f for %d steps"):format(tot[5], tot[1], check.step_usd,
  require("clrt.train.estimate").ASSUME.assistant_turn, real.step_usd, real.run_usd, real.steps))
files.remove_tree(root)
