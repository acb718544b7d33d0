-- process_dataset.lua on a small file in the published multiturn schema: system prompt
-- added, 90/10 split, RL rows deduplicated by prompt, SFT rows = each conversation's last
-- turn with the best score; bad rows are errors naming the line.
local T = require("clrt.test")
local data = require("clrt.data")
local pd = require("recipes.process_dataset")
local src = T.source_dir() .. "/tests/fixtures/collabllm/multiturn_small.jsonl"

T.case("RL and SFT files as the spec says", function()
  local out = T.tmpdir()
  local cfg = clrt.config.parse(pd.defaults, { "input=" .. src, "out=" .. out, "task_desc=question answering" })
  local res = pd.main(cfg)
  local rows = data.read_jsonl(src)
  T.eq(#rows, 48)
  -- 48 rows split 43/5; every prompt comes with two candidates, so each split holds each of
  -- its prompts once and the 24 distinct prompts are all there
  local distinct = {}
  for _, part in ipairs({ res.rl_train, res.rl_test }) do
    for _, r in ipairs(part) do distinct[require("cjson").encode(r.prompt)] = true end
  end
  local nd = 0
  for _ in pairs(distinct) do nd = nd + 1 end
  T.eq(nd, 24)
  T.ok(#res.rl_train < 43, "RL rows are deduplicated by prompt")
  local seen = {}
  for _, r in ipairs(res.rl_train) do
    T.eq(r.prompt[1].role, "system")
    T.eq(r.prompt[1].content, pd.SYSTEM_PROMPT)
    local key = require("cjson").encode(r.prompt)
    T.ok(not seen[key], "duplicate RL prompt")
    seen[key] = true
    local conv = r.prompt[2].content:match("task (%d+)")
    T.eq(r.ground_truth, "answer " .. conv)
    T.eq(r.interaction_kwargs, { single_turn_prompt = "full request " .. conv, task_desc = "question answering" })
  end
  -- SFT: one row per conversation present in the split, its last turn's best candidate
  for _, r in ipairs(res.sft_train) do
    local m = r.messages
    T.eq(m[1].role, "system")
    T.eq(m[#m].role, "assistant")
    if r.turn_id == 1 then
      T.eq(m[#m].content, ("final %d best"):format(r.conv_id))
      T.eq(#m, 5)
    end
  end
  local files = data.read_jsonl(out .. "/sft_train.jsonl")
  T.eq(#files, #res.sft_train)
  -- the split is reproducible with the seed
  local again = pd.main(clrt.config.parse(pd.defaults, { "input=" .. src, "out=" .. T.tmpdir() }))
  T.eq(#again.rl_train, #res.rl_train)
  T.eq(again.rl_train[1].prompt, res.rl_train[1].prompt)
end)

T.case("SFT picks the largest turn first, then the best score", function()
  local rows = {
    { prompt = { { role = "user", content = "a" } }, completion = "t0 great", conv_id = 1, turn_id = 0, score = 0.99, single_turn_prompt = "x" },
    { prompt = { { role = "user", content = "a" } }, completion = "t2 ok", conv_id = 1, turn_id = 2, score = 0.3, single_turn_prompt = "x" },
    { prompt = { { role = "user", content = "a" } }, completion = "t2 best", conv_id = 1, turn_id = 2, score = 0.6, single_turn_prompt = "x" },
    { prompt = { { role = "user", content = "b" } }, completion = "other", conv_id = 2, turn_id = 0, score = 0.1, single_turn_prompt = "y" },
  }
  local sft = pd.sft_rows(rows)
  T.eq(#sft, 2)
  T.eq(sft[1].messages[#sft[1].messages].content, "t2 best")
  T.eq(sft[2].messages[#sft[2].messages].content, "other")
end)

T.case("bad rows are errors naming the line", function()
  local dir = T.tmpdir()
  local bad = dir .. "/bad.jsonl"
  local f = io.open(bad, "w")
  f:write('{"prompt": [{"role": "user", "content": "x"}], "completion": "c", "conv_id": 1, "turn_id": 0, "single_turn_prompt": "s"}\n')
  f:write('{"prompt": "not a list", "completion": "c", "conv_id": 1, "turn_id": 0, "single_turn_prompt": "s"}\n')
  f:close()
  T.raises(function() pd.main(clrt.config.parse(pd.defaults, { "input=" .. bad, "out=" .. dir })) end,
    "bad.jsonl line 2: 'prompt' must be a non-empty list")
  local notjson = dir .. "/nj.jsonl"
  f = io.open(notjson, "w"); f:write("{oops\n"); f:close()
  T.raises(function() pd.main(clrt.config.parse(pd.defaults, { "input=" .. notjson, "out=" .. dir })) end, "nj.jsonl")
end)

T.run()
