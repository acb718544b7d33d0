-- process_dataset.lua on a file in the published multiturn schema with several conversations,
-- turns and candidates per turn (and two conversations that open with the same prompt):
-- the split is by conversation with no conversation and no prompt on both sides; RL rows
-- are deduplicated by prompt and keep single_turn_metadata; SFT takes each conversation's
-- last turn, best score; DPO pairs per (conv, turn) with the gap rule; same seed, same files;
-- bad rows are errors naming the line.
local T = require("clrt.test")
local data = require("clrt.data")
local json = require("clrt.json")
local pd = require("recipes.process_dataset")

local function msg(role, content) return { role = role, content = content } end

-- Conversation c has (c % 3) + 1 turns; turn t's prompt is the first user message and t
-- (assistant, user) exchanges; each turn has three candidates with scores chosen so that some
-- groups are below the 0.1 gap. Conversations 100 and 101 open with the same user message.
local function opening(c) return (c == 100 or c == 101) and "shared opening request" or ("request number " .. c) end

local function prompt_of(c, t)
  local p = { msg("user", opening(c)) }
  for i = 1, t do
    p[#p + 1] = msg("assistant", ("clarifying question %d of conv %d"):format(i, c))
    p[#p + 1] = msg("user", ("answer %d of conv %d"):format(i, c))
  end
  return p
end

local SCORE_SETS = {
  { 0.2, 0.9, 0.5 },    -- gap 0.7
  { 0.50, 0.55, 0.58 }, -- gap 0.08 < 0.1: no pair at the default min_gap
  { -0.25, 0.25, 0.0 }, -- negative scores: gap 0.5
}

local function make_rows()
  local rows = {}
  local convs = {}
  for c = 0, 19 do convs[#convs + 1] = c end
  convs[#convs + 1] = 100
  convs[#convs + 1] = 101
  for _, c in ipairs(convs) do
    for t = 0, c % 3 do
      local scores = SCORE_SETS[(c + t) % 3 + 1]
      for k, s in ipairs(scores) do
        rows[#rows + 1] = {
          prompt = prompt_of(c, t), completion = ("conv %d turn %d cand %d"):format(c, t, k),
          conv_id = c, turn_id = t, score = s,
          single_turn_prompt = "full request " .. c, single_turn_completion = "reference " .. c,
          single_turn_metadata = { task_id = "Task/" .. c },
          sessions = {}, rewards = { accuracy = { s } },
        }
      end
    end
  end
  -- a turn with one candidate only: never a DPO pair
  rows[#rows + 1] = {
    prompt = prompt_of(7, 5), completion = "lonely", conv_id = 7, turn_id = 5, score = 1,
    single_turn_prompt = "full request 7", single_turn_completion = "reference 7",
    single_turn_metadata = { task_id = "Task/7" }, sessions = {}, rewards = {},
  }
  return rows
end

local function write_input(dir, rows)
  local path = dir .. "/collabllm-multiturn-math-hard.jsonl"
  data.write_jsonl(path, rows)
  return path
end

local function run(input, out, extra)
  local args = { "input=" .. input, "out=" .. out }
  for _, a in ipairs(extra or {}) do args[#args + 1] = a end
  local printed = {}
  local real_print = print
  print = function(...) printed[#printed + 1] = table.concat({ ... }, " ") end
  local ok, res = pcall(pd.main, clrt.config.parse(pd.defaults, args))
  print = real_print
  if not ok then error(res, 0) end
  return res, table.concat(printed, "\n")
end

local function key(msgs)
  local parts = {}
  for i, m in ipairs(msgs) do parts[i] = m.role .. "\0" .. m.content end
  return table.concat(parts, "\1")
end

local function without_system(msgs)
  T.eq(msgs[1].role, "system")
  T.eq(msgs[1].content, pd.SYSTEM_PROMPT)
  local out = {}
  for i = 2, #msgs do out[#out + 1] = msgs[i] end
  return out
end

local function slurp(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

T.case("split by conversation: no conversation and no prompt on both sides", function()
  local dir = T.tmpdir()
  local rows = make_rows()
  local input = write_input(dir, rows)
  local res, printed = run(input, dir .. "/out", { "test_fraction=0.25" })
  -- conversations: each on exactly one side, in every output
  local side = {}
  for _, name in ipairs(pd.OUTPUTS) do
    local s = name:match("_(%a+)$")
    for _, r in ipairs(res[name]) do
      local c = tostring(r.conv_id)
      T.ok(side[c] == nil or side[c] == s, ("conv %s on both sides (%s)"):format(c, name))
      side[c] = s
    end
  end
  local ntest, ntrain = 0, 0
  for _, s in pairs(side) do if s == "test" then ntest = ntest + 1 else ntrain = ntrain + 1 end end
  T.eq(ntrain + ntest, 22)
  T.ok(ntest >= 5 and ntest <= 7, "about a quarter of the 22 conversations are held out, got " .. ntest)
  T.eq(#res.sft_train, ntrain)
  T.eq(#res.sft_test, ntest)
  -- the two conversations that share their opening prompt are on the same side
  T.eq(side["100"], side["101"])
  -- prompts: disjoint, each once per side, and every prompt of the input is somewhere
  local seen = {}
  for _, name in ipairs({ "rl_train", "rl_test" }) do
    for _, r in ipairs(res[name]) do
      local k = key(without_system(r.prompt))
      T.ok(not seen[k], "prompt twice in RL rows: " .. r.prompt[2].content)
      seen[k] = name
    end
  end
  local distinct = 0
  local input_keys = {}
  for _, r in ipairs(rows) do
    local k = key(r.prompt)
    if not input_keys[k] then input_keys[k] = true; distinct = distinct + 1 end
    T.ok(seen[k] ~= nil, "a prompt of the input is in no RL file")
    T.eq(seen[k]:match("_(%a+)$"), side[tostring(r.conv_id)])
  end
  T.eq(#res.rl_train + #res.rl_test, distinct)
  for _, name in ipairs({ "dpo_train", "dpo_test" }) do
    for _, r in ipairs(res[name]) do
      T.eq(seen[key(without_system(r.prompt))], name:gsub("dpo", "rl"), "DPO prompt on the other side")
    end
  end
  -- the RL rows keep what the recipe and the metrics read
  for _, r in ipairs(res.rl_train) do
    local c = r.conv_id
    T.eq(r.ground_truth, "reference " .. c)
    T.eq(r.single_turn_metadata, { task_id = "Task/" .. c })
    T.eq(r.interaction_kwargs, { single_turn_prompt = "full request " .. c, task_desc = "question answering" })
  end
  -- over many seeds (one seed may put 100 and 101 together by chance), the split itself
  for seed = 1, 40 do
    local train, test = pd.split(rows, 0.25, seed)
    T.eq(#train + #test, #rows)
    local conv_side, prompt_side = {}, {}
    for s, part in pairs({ train = train, test = test }) do
      for _, r in ipairs(part) do
        local c, k = tostring(r.conv_id), key(r.prompt)
        T.ok(conv_side[c] == nil or conv_side[c] == s, ("seed %d: conv %s on both sides"):format(seed, c))
        T.ok(prompt_side[k] == nil or prompt_side[k] == s, ("seed %d: prompt of conv %s on both sides"):format(seed, c))
        conv_side[c], prompt_side[k] = s, s
      end
    end
  end
  -- the files are what main returned, and the counts are printed
  for _, name in ipairs(pd.OUTPUTS) do
    T.eq(#data.read_jsonl(dir .. "/out/" .. name .. ".jsonl"), #res[name])
    T.ok(printed:find(("%s%%s+%d rows"):format(name, #res[name])), "count of " .. name .. " printed: " .. printed)
  end
end)

T.case("SFT: per conversation the largest turn, then the best score", function()
  local dir = T.tmpdir()
  local rows = make_rows()
  local res = run(write_input(dir, rows), dir .. "/out")
  local want = {}
  for _, r in ipairs(rows) do
    local w = want[r.conv_id]
    if not w or r.turn_id > w.turn_id or (r.turn_id == w.turn_id and r.score > w.score) then want[r.conv_id] = r end
  end
  local n = 0
  for _, name in ipairs({ "sft_train", "sft_test" }) do
    for _, r in ipairs(res[name]) do
      n = n + 1
      local w = want[r.conv_id]
      local m = without_system(r.messages)
      T.eq(m[#m], msg("assistant", w.completion))
      table.remove(m)
      T.eq(m, w.prompt)
      T.eq(r.turn_id, w.turn_id)
      T.eq(r.score, w.score)
    end
  end
  T.eq(n, 22)
  T.eq(want[7].completion, "lonely")
  -- the unit rule on a hand-made list: a later turn beats a better score
  local sft = pd.sft_rows({
    { prompt = { msg("user", "a") }, completion = "t0 great", conv_id = 1, turn_id = 0, score = 0.99 },
    { prompt = { msg("user", "a") }, completion = "t2 ok", conv_id = 1, turn_id = 2, score = 0.3 },
    { prompt = { msg("user", "a") }, completion = "t2 best", conv_id = 1, turn_id = 2, score = 0.6 },
  })
  T.eq(sft[1].messages[#sft[1].messages].content, "t2 best")
end)

T.case("DPO: best vs worst candidate per (conversation, turn), gap at least min_gap", function()
  local dir = T.tmpdir()
  local rows = make_rows()
  local input = write_input(dir, rows)
  local function expected(min_gap)
    local groups, order = {}, {}
    for _, r in ipairs(rows) do
      local k = r.conv_id .. "/" .. r.turn_id
      if not groups[k] then groups[k] = {}; order[#order + 1] = k end
      table.insert(groups[k], r)
    end
    local out = {}
    for _, k in ipairs(order) do
      local g = groups[k]
      if #g >= 2 then
        table.sort(g, function(a, b) return a.score > b.score end)
        if g[1].score - g[#g].score >= min_gap then out[k] = { g[1], g[#g] } end
      end
    end
    return out
  end
  for _, case in ipairs({ { args = {}, gap = 0.1 }, { args = { "min_gap=0" }, gap = 0 }, { args = { "min_gap=0.6" }, gap = 0.6 } }) do
    local res = run(input, dir .. "/out", case.args)
    local want, nwant = expected(case.gap), 0
    for _ in pairs(want) do nwant = nwant + 1 end
    local got = 0
    for _, name in ipairs({ "dpo_train", "dpo_test" }) do
      for _, p in ipairs(res[name]) do
        got = got + 1
        local w = want[p.conv_id .. "/" .. p.turn_id]
        T.ok(w, ("unexpected pair %s/%s at min_gap %s"):format(p.conv_id, p.turn_id, case.gap))
        T.eq(p.chosen, w[1].completion)
        T.eq(p.rejected, w[2].completion)
        T.eq(p.score_chosen, w[1].score)
        T.eq(p.score_rejected, w[2].score)
        T.eq(without_system(p.prompt), w[1].prompt)
        T.ok(p.score_chosen - p.score_rejected >= case.gap)
      end
    end
    T.eq(got, nwant)
  end
  -- the gap sets: 0.7 and 0.5 kept at 0.1, the 0.08 set dropped; at 0.6 only the 0.7 set
  local all = run(input, dir .. "/out", { "min_gap=0" })
  local at_default = run(input, dir .. "/out")
  T.ok(#all.dpo_train + #all.dpo_test > #at_default.dpo_train + #at_default.dpo_test, "min_gap drops small gaps")
  for _, name in ipairs({ "dpo_train", "dpo_test" }) do
    for _, p in ipairs(at_default[name]) do T.ok(p.score_chosen ~= 0.58, "a 0.08 gap passed min_gap 0.1") end
  end
  -- one candidate is never a pair, even at min_gap 0
  for _, name in ipairs({ "dpo_train", "dpo_test" }) do
    for _, p in ipairs(all[name]) do T.ok(not (p.conv_id == 7 and p.turn_id == 5), "single candidate paired") end
  end
  -- ties: the first best and the last worst in file order, as a stable descending sort gives
  local tie = pd.dpo_rows({
    { prompt = { msg("user", "q") }, completion = "a", conv_id = 1, turn_id = 0, score = 1 },
    { prompt = { msg("user", "q") }, completion = "b", conv_id = 1, turn_id = 0, score = 0 },
    { prompt = { msg("user", "q") }, completion = "c", conv_id = 1, turn_id = 0, score = 1 },
    { prompt = { msg("user", "q") }, completion = "d", conv_id = 1, turn_id = 0, score = 0 },
  }, 0.1)
  T.eq(#tie, 1)
  T.eq(tie[1].chosen, "a")
  T.eq(tie[1].rejected, "d")
end)

T.case("the split is the seed's: same seed, same files; another seed, another split", function()
  local dir = T.tmpdir()
  local input = write_input(dir, make_rows())
  run(input, dir .. "/a")
  run(input, dir .. "/b")
  run(input, dir .. "/c", { "seed=7" })
  for _, name in ipairs(pd.OUTPUTS) do
    T.eq(slurp(dir .. "/a/" .. name .. ".jsonl"), slurp(dir .. "/b/" .. name .. ".jsonl"), name)
  end
  T.ok(slurp(dir .. "/a/sft_test.jsonl") ~= slurp(dir .. "/c/sft_test.jsonl"), "seed 7 holds out other conversations")
end)

T.case("bad rows and settings are errors naming what and where", function()
  local dir = T.tmpdir()
  local bad = dir .. "/bad.jsonl"
  local f = io.open(bad, "w")
  f:write('{"prompt": [{"role": "user", "content": "x"}], "completion": "c", "conv_id": 1, "turn_id": 0, "single_turn_prompt": "s"}\n')
  f:write('{"prompt": "not a list", "completion": "c", "conv_id": 1, "turn_id": 0, "single_turn_prompt": "s"}\n')
  f:close()
  T.raises(function() run(bad, dir) end, "bad.jsonl line 2: 'prompt' must be a non-empty list")
  f = io.open(bad, "w")
  f:write('{"prompt": [{"role": "user", "content": "x"}], "completion": "c", "conv_id": 1, "turn_id": 0, "single_turn_prompt": "s", "score": "high"}\n')
  f:close()
  T.raises(function() run(bad, dir) end, "bad.jsonl line 1: 'score' must be a number")
  local notjson = dir .. "/nj.jsonl"
  f = io.open(notjson, "w"); f:write("{oops\n"); f:close()
  T.raises(function() run(notjson, dir) end, "nj.jsonl")
  local good = write_input(dir, make_rows())
  T.raises(function() run(good, dir, { "test_fraction=1" }) end, "test_fraction must be a number in [0, 1)")
  T.raises(function() run(good, dir, { "min_gap=-1" }) end, "min_gap must be a number >= 0")
  -- a null score is no score: the row is kept, never paired
  local rows = { { prompt = { msg("user", "q") }, completion = "a", conv_id = 1, turn_id = 0, score = json.null, single_turn_prompt = "s" } }
  local res = run(write_input(dir, rows), dir .. "/null")
  T.eq(#res.rl_train + #res.rl_test, 1)
end)

T.case("sft_min_accuracy: the authors' filter on each conversation's chosen row", function()
  local dir = T.tmpdir()
  local rows = make_rows()
  local all = run(write_input(dir, rows), dir .. "/all", { "test_fraction=0" })
  local res, printed = run(write_input(dir, rows), dir .. "/out", { "test_fraction=0", "sft_min_accuracy=0.5" })
  -- the chosen row (largest turn, then best score) is picked first, then filtered: its
  -- rewards.accuracy mean (here its score) must be at least 0.5; conv 7's chosen row has none
  local want = {}
  for _, r in ipairs(all.sft_train) do
    local keep = r.conv_id ~= 7 and r.score >= 0.5
    if keep then want[#want + 1] = r end
  end
  T.ok(#want > 0 and #want < #all.sft_train, "the filter keeps some and drops some")
  T.eq(res.sft_train, want)
  T.ok(printed:find(("left out %d train / 0 test"):format(#all.sft_train - #want), 1, true), printed)
  -- the other files do not change
  T.eq(res.rl_train, all.rl_train); T.eq(res.dpo_train, all.dpo_train)
  -- the mean over a row's sessions, >= is kept, a missing or non-numeric value is dropped
  local function row(id, acc)
    return { prompt = { msg("user", "q" .. id) }, completion = "a" .. id, conv_id = id, turn_id = 0, score = 1, rewards = acc }
  end
  local out, dropped = pd.sft_rows({ row(1, { accuracy = { 0, 1 } }), row(2, { accuracy = { 0, 0.9 } }), row(3, { accuracy = 0.7 }),
    row(4, {}), row(5, nil), row(6, { accuracy = { "x" } }) }, 0.5)
  T.eq(dropped, 4)
  T.eq({ out[1].conv_id, out[2].conv_id }, { 1, 3 })
  T.eq(#pd.sft_rows({ row(4, {}) }), 1, "no filter: every conversation")
  T.raises(function() run(write_input(dir, rows), dir .. "/bad", { "sft_min_accuracy='x'" }) end, "sft_min_accuracy expects a number")
end)

T.case("the system prompt: lua/prompts/collabllm_system.txt, or system_prompt_file=", function()
  T.eq(pd.SYSTEM_PROMPT, require("clrt.prompt_file").read("collabllm_system"))
  T.ok(pd.SYSTEM_PROMPT:find("^You are an assistant built to be helpful, proactive and highly interactive%."))
  local dir = T.tmpdir()
  local mine = dir .. "/system.txt"
  local f = assert(io.open(mine, "wb")); f:write("Be {brief}.\n"); f:close()
  local res = run(write_input(dir, make_rows()), dir .. "/out", { "test_fraction=0", "system_prompt_file=" .. mine })
  for _, name in ipairs({ "rl_train", "dpo_train" }) do
    for _, r in ipairs(res[name]) do T.eq(r.prompt[1], msg("system", "Be {brief}.\n"), name) end
  end
  for _, r in ipairs(res.sft_train) do T.eq(r.messages[1], msg("system", "Be {brief}.\n")) end
  -- the next run without it is back to the default
  local res2 = run(write_input(dir, make_rows()), dir .. "/out2", { "test_fraction=0" })
  T.eq(res2.rl_train[1].prompt[1].content, pd.SYSTEM_PROMPT)
  T.raises(function() run(write_input(dir, make_rows()), dir .. "/out3", { "system_prompt_file=" .. dir .. "/none.txt" }) end,
    "cannot read prompt")
end)

T.run()
