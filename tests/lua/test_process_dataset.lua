-- recipes/process_dataset.lua on a small file in the published CollabLLM multiturn schema
-- (tests/fixtures/collabllm/multiturn_small.jsonl, made by tests/reference/make_collabllm_fixture.lua).
local T = require("clrt.test")
local data = require("clrt.data")

local src = T.source_dir()
local bin = os.getenv("CLRT_BIN") or (src .. "/build/release/clrt")
local fixture = src .. "/tests/fixtures/collabllm/multiturn_small.jsonl"

local function run(args)
  local p = io.popen(("cd %s && %s lua/recipes/process_dataset.lua %s 2>&1; echo \"rc=$?\""):format(src, bin, args))
  local out = p:read("*a")
  p:close()
  return out
end

local function load(dir, kind)
  local train = data.read_jsonl(dir .. "/" .. kind .. "_train.jsonl")
  local val = data.read_jsonl(dir .. "/" .. kind .. "_validation.jsonl")
  local all = {}
  for _, r in ipairs(train) do all[#all + 1] = r end
  for _, r in ipairs(val) do all[#all + 1] = r end
  return train, val, all
end

T.case("rl and sft files as the spec says", function()
  local dir = T.tmpdir()
  local out = run(("input=%s out_dir=%s"):format(fixture, dir))
  T.ok(out:find("rc=0", 1, true), out)
  -- RL: 17 distinct prompts of 22 rows; ceil(0.1 * 17) = 2 validation rows
  local tr, va, all = load(dir, "rl")
  T.eq(#tr, 15); T.eq(#va, 2)
  local by_prompt = {}
  for _, r in ipairs(all) do
    T.eq(r.prompt[1].role, "system")
    T.ok(r.prompt[1].content:find("clarifying question", 1, true))
    T.eq(r.prompt[#r.prompt].role, "user")
    local key = data.json.encode(r.prompt)
    T.ok(not by_prompt[key], "RL prompts are unique"); by_prompt[key] = r
    T.eq(r.interaction_kwargs.name, "collabllm")
    T.eq(r.interaction_kwargs.single_turn_prompt, r.single_turn_prompt)
    T.eq(r.task_desc, "general ask-for-assistance task")
    T.eq(r.extra_info.sessions, nil); T.eq(r.extra_info.rewards, nil)
    T.ok(r.single_turn_metadata.test:find("assert True", 1, true))
    local conv = r.extra_info.conv_id
    if conv == "d" then T.eq(r.ground_truth, "answer d t1 c1")
    else T.eq(r.ground_truth, ("Reference answer %s."):format(tostring(conv))) end
  end
  -- dedup keeps the first candidate in file order
  for _, r in pairs(by_prompt) do
    if r.extra_info.conv_id == "a" and r.extra_info.turn_id == 1 then T.eq(r.extra_info.completion, "answer a t1 c1") end
  end
  -- SFT: one row per conversation: last turn, then best score, ties by file order
  local str, sva, sall = load(dir, "sft")
  T.eq(#str, 12); T.eq(#sva, 2)
  local want = { a = "answer a t2 c2", b = "answer b t3 c1", ["7"] = "answer 7 t1 c2", d = "answer d t1 c1" }
  local seen = 0
  for _, r in ipairs(sall) do
    local m = r.messages
    T.eq(m[1].role, "system"); T.eq(m[#m].role, "assistant"); T.eq(m[#m - 1].role, "user")
    local w = want[tostring(r.conv_id)]
    if w then T.eq(m[#m].content, w); seen = seen + 1 end
    if r.conv_id == "b" then T.eq(#m, 7) end   -- system + 5 prompt messages + completion
  end
  T.eq(seen, 4)
end)

T.case("the split is seeded and deterministic", function()
  local d1, d2, d3 = T.tmpdir(), T.tmpdir(), T.tmpdir()
  run(("input=%s out_dir=%s"):format(fixture, d1))
  run(("input=%s out_dir=%s"):format(fixture, d2))
  run(("input=%s out_dir=%s seed=7 type=sft"):format(fixture, d3))
  T.eq(T.read(d1 .. "/sft_validation.jsonl"), T.read(d2 .. "/sft_validation.jsonl"))
  T.eq(T.read(d1 .. "/rl_train.jsonl"), T.read(d2 .. "/rl_train.jsonl"))
  T.ok(T.read(d1 .. "/sft_train.jsonl") ~= T.read(d3 .. "/sft_train.jsonl"), "another seed, another order")
  T.eq(T.read(d3 .. "/rl_train.jsonl"), nil)
end)

T.case("bad input names file and line; bad config names the key", function()
  local dir = T.tmpdir()
  local bad = dir .. "/bad.jsonl"
  local f = io.open(bad, "w")
  f:write(T.read(fixture):match("^[^\n]*\n"), "{not json}\n")
  f:close()
  local out = run(("input=%s out_dir=%s"):format(bad, dir))
  T.ok(out:find(bad .. ":2:", 1, true), out); T.ok(out:find("rc=1", 1, true))
  f = io.open(bad, "w"); f:write('{"completion": "x", "conv_id": 1, "turn_id": 1, "score": 0}\n'); f:close()
  out = run(("input=%s out_dir=%s"):format(bad, dir))
  T.ok(out:find(bad .. ":1: row has no 'prompt'", 1, true), out)
  out = run(("input=%s out_dir=%s validaton_size=0.2"):format(fixture, dir))
  T.ok(out:find("did you mean 'validation_size'", 1, true), out)
  out = run("")
  T.ok(out:find("give input=", 1, true), out)
end)

T.case("library use without running main", function()
  PROCESS_DATASET_LIBRARY = true
  local pd = dofile(src .. "/lua/recipes/process_dataset.lua")
  PROCESS_DATASET_LIBRARY = nil
  local rows = {}
  for line, row in data.lines(fixture) do rows[#rows + 1] = { row = row, where = "f:" .. line } end
  local cfg = { system_prompt = "S", task_desc = "t", seed = 42, validation_size = 0.1 }
  T.eq(#pd.rl_rows(rows, cfg), 17); T.eq(#pd.sft_rows(rows, cfg), 14)
  local tr, va = pd.split(pd.sft_rows(rows, cfg), cfg)
  T.eq(#tr + #va, 14)
end)

T.run()
