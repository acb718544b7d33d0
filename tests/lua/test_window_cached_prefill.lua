-- test_window_cached_prefill.lua — sliding-window models (Mistral, Phi-3, Gemma 3's interleaved
-- local layers) prefilling several tokens after keys and values a slot already holds: the
-- decoder's append and extend_many (one row and a ragged batch, also batch-invariant), and the
-- prefix cache serving a prompt's first blocks, past the window (Mistral and Phi-3: Gemma 3's
-- cache stays off, test_prefix_cache.lua). The log-probabilities must be
-- the independent PyTorch reference's (tests/reference/make_model_fixtures.py,
-- make_gemma3_fixtures.py) and the full recompute's, and greedy decoding after a served prefix
-- must give the reference's continuation. A first chunk alone never crosses the window here,
-- so a cached prefill that saw every key (or one key too many or too few) fails.
local T = require("clrt.test")
local ffi = require("ffi")
local C = require("clrt.core.ffi").C
local PC = require("clrt.gen.prefix_cache")
local json = require("clrt.json")
local fixtures = T.source_dir() .. "/tests/fixtures/model/"
local WINDOWED = { "mistral_window", "phi3_fused", "gemma3_tiny", "gemma3_softcap" }

local function log_softmax(z, V)
  local mx, s, out = -math.huge, 0, {}
  for v = 0, V - 1 do mx = math.max(mx, z[v]) end
  for v = 0, V - 1 do s = s + math.exp(z[v] - mx) end
  for v = 0, V - 1 do out[v + 1] = z[v] - mx - math.log(s) end
  return out
end

-- log p(v | seq) for every v, by scoring seq..v for all v in one full (uncached) forward.
local function full_next_logprobs(m, seq)
  local V, rows = m.config.vocab_size, {}
  for v = 0, V - 1 do
    rows[v + 1] = { unpack(seq) }
    rows[v + 1][#seq + 1] = v
  end
  local lp = m:logprobs(rows, { grad = false })
  local out = {}
  for v = 0, V - 1 do out[v + 1] = lp:get(v + 1, #seq) end
  return out
end

-- The reference's rows as Lua lists (each cut to its length), and its log-probs:
-- lp[b][t] = log p(tokens[b][t + 1] | tokens[b][1..t]).
local function reference(name)
  local e = clrt.safetensors.load(fixtures .. name .. "/expected.safetensors")
  local B, Tn = e.tokens:size(1), e.tokens:size(2)
  local toks, lps, lens = e.tokens:totable(), T.floats(e.lp), e.lengths:totable()
  local rows, lp = {}, {}
  for b = 1, B do
    rows[b], lp[b] = {}, {}
    for t = 1, lens[b] do rows[b][t] = toks[b][t] end
    for t = 1, lens[b] - 1 do lp[b][t] = lps[(b - 1) * (Tn - 1) + t] end
  end
  return e, rows, lp
end

local function window_of(name)
  return json.decode(clrt.files.read(fixtures .. name .. "/config.json")).sliding_window
end

local function slice(t, a, b)
  local out = {}
  for i = a, b do out[#out + 1] = t[i] end
  return out
end

for _, name in ipairs(WINDOWED) do
  local W = window_of(name)
  local e, rows, ref = reference(name)
  local long = 1
  for b = 2, #rows do if #rows[b] > #rows[long] then long = b end end
  local row = rows[long]
  assert(#row >= W + 4, name .. ": the reference's longest row outgrows the window")
  -- the row in chunks: a first prefill shorter than the window, then chunks of several tokens
  -- whose queries reach back past the window into what the slot already holds
  local cuts = { W - 1 }
  while cuts[#cuts] + 3 < #row - 1 do cuts[#cuts + 1] = cuts[#cuts] + 3 end
  if cuts[#cuts] < #row - 1 then cuts[#cuts + 1] = #row - 1 end

  for _, invariant in ipairs({ false, true }) do
    local how = invariant and " (batch-invariant)" or ""
    T.case(name .. ": chunks appended after the slot's keys give PyTorch's log-probs past the window" .. how, function()
      local m = clrt.model.load(fixtures .. name)
      if invariant then m:set_batch_invariant(true) end
      local V = m.config.vocab_size
      local d = m:decoder(3, 40)
      local logits = ffi.new("float[?]", 3 * V)
      local done = 0
      for i, cut in ipairs(cuts) do
        local chunk = slice(row, done + 1, cut)
        local buf = ffi.new("int32_t[?]", #chunk, chunk)
        if i == 1 then
          d:prefill(2, buf, #chunk, logits)
        else
          T.eq(C.clrt_decoder_append(d.ptr, 2, buf, #chunk, logits), 0, "append")
        end
        done = cut
        T.eq(d:length(2), done)
        local lp = log_softmax(logits + 2 * V, V)
        T.near(lp[row[done + 1] + 1], ref[long][done], { atol = 1e-4 },
          ("%s: log p(token %d) after a chunk of %d on %d cached"):format(name, done + 1, #chunk, done - #chunk))
        T.near(lp, full_next_logprobs(m, slice(row, 1, done)), { atol = 1e-4 }, "the full forward's distribution at " .. done)
      end
    end)

    T.case(name .. ": a ragged extend_many over cached prefixes equals PyTorch and the full forward" .. how, function()
      local m = clrt.model.load(fixtures .. name)
      if invariant then m:set_batch_invariant(true) end
      local V = m.config.vocab_size
      local d = m:decoder(4, 40)
      local logits = ffi.new("float[?]", 4 * V)
      -- slot 3 holds the long row's first W - 1 tokens, slot 1 all but its last 3 (past the
      -- window already), slot 0 another row's first token; then one extend_many of up to 5, 2
      -- and 2 tokens
      local other = long == 1 and 2 or 1
      T.ok(#row - 3 > W, "slot 1's prefix outgrows the window")
      local plan = { { slot = 3, r = long, have = W - 1, add = math.min(5, #row - W) },
        { slot = 1, r = long, have = #row - 3, add = 2 },
        { slot = 0, r = other, have = 1, add = math.min(2, #rows[other] - 2) } }
      local all, slots, lens = {}, {}, {}
      for i, p in ipairs(plan) do
        local pre = slice(rows[p.r], 1, p.have)
        d:prefill(p.slot, ffi.new("int32_t[?]", #pre, pre), #pre, logits)
        for _, x in ipairs(slice(rows[p.r], p.have + 1, p.have + p.add)) do all[#all + 1] = x end
        slots[i], lens[i] = p.slot, p.add
      end
      d:extend_many(#plan, ffi.new("int32_t[?]", #plan, slots), ffi.new("int32_t[?]", #all, all),
        ffi.new("int32_t[?]", #plan, lens), logits)
      for _, p in ipairs(plan) do
        local n = p.have + p.add
        T.eq(d:length(p.slot), n)
        local lp = log_softmax(logits + p.slot * V, V)
        T.near(lp[rows[p.r][n + 1] + 1], ref[p.r][n], { atol = 1e-4 }, ("slot %d: PyTorch's log p at %d"):format(p.slot, n))
        T.near(lp, full_next_logprobs(m, slice(rows[p.r], 1, n)), { atol = 1e-4 }, ("slot %d: the full forward"):format(p.slot))
      end
      -- and the caches they left: one decode step of every slot is the full forward's too
      local toks = { 7, 11, 13 }
      d:decode(3, ffi.new("int32_t[3]", slots), ffi.new("int32_t[3]", toks), logits)
      for i, p in ipairs(plan) do
        local seq = slice(rows[p.r], 1, p.have + p.add)
        seq[#seq + 1] = toks[i]
        T.near(log_softmax(logits + p.slot * V, V), full_next_logprobs(m, seq), { atol = 1e-4 }, "decode after extend, slot " .. p.slot)
      end
    end)
  end

  -- (Gemma 3 keeps its prefix cache off: test_prefix_cache.lua)
  if not name:find("^gemma3") then T.case(name .. ": a prompt served its first blocks from the prefix cache decodes PyTorch's greedy continuation", function()
    local prompt = (e.greedy_prompt or e.prompt):totable()
    local greedy = e.greedy:totable()
    local m = clrt.model.load(fixtures .. name)
    if C.clrt_model_kv_reusable(m.ptr) == 0 then
      T.skip("this CPU or build has no AVX-512: the model cannot promise bit-identical reuse, the cache stays off")
    end
    PC.configure(m, { block_tokens = 2 })
    -- first the prompt and the reference's first W tokens, prefilled (exact, so cached); then a
    -- longer prompt, served that prefix's whole blocks and prefilling the next 3 tokens after it
    local a = #prompt + W
    local first = slice(greedy, 1, W)
    local want_a = slice(greedy, W + 1, #greedy)
    local pa = {}
    for _, x in ipairs(prompt) do pa[#pa + 1] = x end
    for _, x in ipairs(first) do pa[#pa + 1] = x end
    local r = m:generate({ pa }, { temperature = 0, max_new_tokens = #want_a })
    T.eq(r[1].tokens, want_a, "the continuation of " .. a .. " prompt tokens")
    local pb = slice(pa, 1, #pa)
    for _, x in ipairs(slice(greedy, W + 1, W + 3)) do pb[#pb + 1] = x end
    local want_b = slice(greedy, W + 4, #greedy)
    T.ok(#want_b >= 2, "the reference leaves tokens to decode")
    local before = PC.of(m):stats().cached_tokens
    r = m:generate({ pb }, { temperature = 0, max_new_tokens = #want_b })
    local served = PC.of(m):stats().cached_tokens - before
    T.ok(served > W and served < #pb, ("served %d of %d prompt tokens: past the window, with a chunk left to prefill"):format(served, #pb))
    T.eq(r[1].tokens, want_b, "PyTorch's greedy continuation after a served prefix")
    PC.configure(m, { mb = 0 })
    local r2 = m:generate({ pb }, { temperature = 0, max_new_tokens = #want_b })
    T.eq(r[1].logprobs, r2[1].logprobs, "the same log-probabilities bit for bit without the cache")
  end) end
end

T.run()
