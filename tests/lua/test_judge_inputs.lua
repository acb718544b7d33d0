-- What each judge is shown, checked at the HTTP boundary: a Medium-shaped row (the
-- published schema, whose single_turn_prompt carries the whole reference article, as the
-- authors' dataset builder writes it) goes through process_dataset.lua and the recipe's
-- sample reader; its conversation is scored by Medium's metrics (bleu_score with its
-- extractor, interactivity, token_amount) through the recipe's own ctx against a local fake
-- endpoint that records every request body (tests/support/fake_collab_endpoint.py). No judge
-- or extractor request may contain the article; the simulated user's request does (the
-- references show it the goal), which also shows the check can see it. A code row's
-- extractor is shown the task, the entry point, the extraction requirement, the
-- rename-to-entry-point rule and the quote note, and its whole reply is the code.
local T = require("clrt.test")
local json = require("clrt.json")
local data = require("clrt.data")
local config = require("clrt.config")
local train = require("clrt.train")

local PY = "/usr/bin/python3"
if os.execute(PY .. " -c 'import http.server' >/dev/null 2>&1") ~= 0 then
  io.write("skip: /usr/bin/python3 is needed for the fake endpoint\n")
  os.exit(77)
end

local src = T.source_dir()
local dir = T.tmpdir()
local reqlog = dir .. "/requests.jsonl"
local p = assert(io.popen(("%s %s/tests/support/fake_collab_endpoint.py %s --lifetime 300"):format(PY, src, reqlog)))
local port, pid = (p:read("*l") or ""):match("^(%d+) (%d+)$")
T.cleanup(function() if pid then os.execute("kill " .. pid .. " 2>/dev/null") end p:close() end)
assert(port, "the fake endpoint did not start")
local url = ("http://127.0.0.1:%s/v1"):format(port)

local ARTICLE = table.concat({
  "Urban beekeeping has quietly spread across rooftops in dense cities.",
  "Hives on office towers produce honey with a flavour shaped by street trees and balcony gardens.",
  "Keepers say the hardest part is not the bees but the neighbours, who need reassurance about stings.",
  "A single colony can hold fifty thousand workers at the height of summer.",
}, " ")
local TITLE = "Why Cities Are Full of Bees"

local function requests()
  local out = {}
  local f = io.open(reqlog, "rb")
  if not f then return out end
  for line in f:lines() do out[#out + 1] = json.decode(line) end
  f:close()
  return out
end

local function role_of(body)
  local props = ((((body.response_format or {}).json_schema or {}).schema or {}).properties) or {}
  if props.response then return "user" end
  if props.final_completion then return "extractor" end
  if props.interactivity then return "interactivity" end
  if props.accuracy then return "accuracy" end
  return "?"
end

local function ctx_for()
  local rl = require("recipes.collabllm_rl")
  local cfg = config.parse(rl.defaults, { "sim=llm", "sim_cfg.base_url=" .. url, "judge.base_url=" .. url,
    "sim_cfg.max_retries=0", "judge.max_retries=0" })
  return train.context{ config = cfg }
end

T.case("a Medium row's article reaches the simulated user only, never a judge or the extractor", function()
  -- the published row: prompt/completion per turn, the single-turn task with the article
  local row = {
    prompt = { { role = "user", content = "Could you help me write a piece about bees in cities?" } },
    completion = "Sure! What angle would you like: history, practical tips, or the people who keep them?",
    conv_id = 0, turn_id = 1, score = 0.4,
    single_turn_prompt = ("Please write an article in around 60 words with the following title: %s\n\n%s"):format(TITLE, ARTICLE),
    single_turn_completion = ARTICLE,
    single_turn_metadata = { title = TITLE }, sessions = {}, rewards = { bleu = { 0.3 } },
  }
  local input = dir .. "/collabllm-multiturn-medium.jsonl"
  data.write_jsonl(input, { row })
  local pd = require("recipes.process_dataset")
  local real_print = print
  print = function() end
  local ok, err = pcall(pd.main, config.parse(pd.defaults, { "input=" .. input, "out=" .. dir .. "/ds", "test_fraction=0" }))
  print = real_print
  assert(ok, err)
  local samples = train.prompts.dataset_samples(dir .. "/ds/rl_train.jsonl")
  T.eq(#samples, 1)
  local s = samples[1]
  T.ok(s.single_turn_prompt:find(ARTICLE, 1, true), "the sample carries the article in single_turn_prompt")
  T.eq(s.ground_truth, ARTICLE)

  local ctx, user = ctx_for()
  local conv = {}
  for _, m in ipairs(s.prompt) do conv[#conv + 1] = m end
  conv[#conv + 1] = { role = "assistant", content = "Here is a first draft: Bees now live on many city roofs." }
  local said = user.respond(conv, s, ctx)
  conv[#conv + 1] = { role = "user", content = said }
  conv[#conv + 1] = { role = "assistant", content = "Revised: Bees now live on many city roofs, and keepers talk to neighbours." }
  local metrics = train.reward.load_metrics({ bleu_score = 1, interactivity = 1, token_amount = -0.0001 })
  local scores = train.reward.score_conversation(conv, s, metrics, ctx)
  for name, v in pairs(scores) do T.ok(type(v) == "number", name .. " scored: " .. tostring(v)) end

  local reqs = requests()
  local seen = {}
  for _, body in ipairs(reqs) do
    local role = role_of(body)
    seen[role] = (seen[role] or 0) + 1
    local text = json.encode(body.messages)
    local plain = table.concat((function() local t = {} for i, m in ipairs(body.messages) do t[i] = m.content end return t end)(), "\n")
    if role == "user" then
      T.ok(plain:find(ARTICLE, 1, true), "the simulated user is shown the goal (the check can see the article)")
    else
      T.ok(not plain:find("fifty thousand workers", 1, true) and not plain:find(TITLE, 1, true),
        role .. " request contains the article: " .. text:sub(1, 300))
      -- and it is shown the conversation
      T.ok(plain:find("keepers talk to neighbours", 1, true), role .. " sees the conversation")
    end
  end
  T.eq(seen.user, 1); T.eq(seen.extractor, 1); T.eq(seen.interactivity, 1); T.eq(seen["?"], nil)
end)

T.case("a code row's extractor is shown the task, the entry point, the requirement, the rename rule and the quote note", function()
  os.remove(reqlog)
  local ctx = ctx_for()
  local judge = require("metrics.lib.judge")
  local s = { prompt = { { role = "user", content = "Write the stats helper." } },
    single_turn_prompt = "Compute mean and std of values. TASK-STATEMENT-MARKER",
    single_turn_metadata = json.encode({ entry_point = "task_func", extraction_requirement = "Start the code with `import numpy as np`.",
      canonical_solution = "CANONICAL-SOLUTION-TEXT", test = "import unittest" }) }
  local conv = { s.prompt[1], { role = "assistant", content = "```python\ndef stats(v):\n    return 0, 0\n```" } }
  -- the endpoint's reply (an unfenced program) is used whole, as the references run it
  local code = judge.final_completion(conv, s, ctx, "pass_rate", "code")
  local good = "import numpy as np\n\ndef task_func(values):\n    arr = np.asarray(values, dtype=float)\n"
    .. "    return float(arr.mean()), float(arr.std())\n"
  T.ok(code == good or code == "def task_func(values):\n    return 0, 0\n", "the whole final_completion: " .. code)
  local reqs = requests()
  T.eq(#reqs, 1)
  local p = reqs[1].messages[1].content
  T.ok(p:find("TASK-STATEMENT-MARKER", 1, true), "the code task (single_turn_prompt)")
  T.ok(p:find("Start the code with `import numpy as np`.", 1, true), "the extraction requirement")
  T.ok(p:find("Additional requirement:", 1, true), "the requirement in the authors' form")
  T.ok(p:find("`task_func`", 1, true), "the entry point")
  T.ok(p:find("rename it to `task_func`", 1, true), "the rename-to-entry-point rule")
  T.ok(p:find(judge.QUOTE_NOTE, 1, true), "the quote-swap note")
  T.ok(p:find("def stats(v):", 1, true), "the conversation")
  T.ok(not p:find("CANONICAL-SOLUTION-TEXT", 1, true), "never the metadata's solution")
  -- quote_note=false leaves the note out; a document is never shown its task
  os.remove(reqlog)
  ctx.metric_options = { pass_rate = { quote_note = false } }
  judge.final_completion(conv, s, ctx, "pass_rate", "code")
  T.ok(not requests()[1].messages[1].content:find(judge.QUOTE_NOTE, 1, true), "quote_note=false")
  os.remove(reqlog)
  ctx.metric_options = {}
  judge.final_completion(conv, s, ctx, "bleu_score", "document")
  local d = requests()[1].messages[1].content
  T.ok(not d:find("TASK-STATEMENT-MARKER", 1, true) and not d:find("rename it", 1, true), "a document's extractor: no task, no rename")
  T.ok(d:find(judge.QUOTE_NOTE, 1, true), "the quote note for documents too (the authors' prompt has one text)")
end)

T.run()
