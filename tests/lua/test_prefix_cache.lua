-- The prefix cache (clrt.gen.prefix_cache, docs/prefix_cache.md): conversations of several
-- turns with shared prefixes and futures, greedy and seeded sampling, give the same tokens and
-- log-probabilities bit for bit with the cache off, on, and on under a bound so small that it
-- evicts, on every fixture architecture; a later turn is served its earlier turns, and prompts
-- arriving together share what they have in common; after an optimizer step or an adapter
-- change the same prompt misses the cache and matches a cache-off run under the new weights.
local T = require("clrt.test")
local PC = require("clrt.gen.prefix_cache")
local ffi = require("ffi")
local C = require("clrt.core.ffi").C

local function model(seed)
  return clrt.model.new({ architectures = { "Qwen2ForCausalLM" }, vocab_size = 97, hidden_size = 64,
    intermediate_size = 96, num_hidden_layers = 2, num_attention_heads = 4, num_key_value_heads = 2,
    max_position_embeddings = 1024, rms_norm_eps = 1e-6, rope_theta = 10000, tie_word_embeddings = true },
    { seed = seed or 5 })
end

local function reusable(m)
  if C.clrt_model_kv_reusable(m.ptr) == 0 then
    T.skip("this CPU or build has no AVX-512: the model cannot promise bit-identical reuse, the cache stays off")
  end
end

local function floats(p, n)
  local out = {}
  for i = 0, n - 1 do out[i + 1] = p[i] end
  return out
end

local function seq(n, a, b)
  local t = {}
  for i = 1, n do t[i] = (i * a + b) % 89 end   -- below every test model's vocabulary
  return t
end

local function cat(...)
  local out = {}
  for _, t in ipairs({ ... }) do for _, x in ipairs(t) do out[#out + 1] = x end end
  return out
end

-- Three conversations sharing a system prefix, each answered with three futures that share
-- the prompt and the first response, every future two more turns; all in one scheduler run,
-- so their requests batch together. Returns every reply (tokens, log-probabilities) in order.
local function conversations(m, temperature)
  local system = seq(40, 7, 3)
  local fns = {}
  for c = 1, 3 do
    fns[c] = function()
      local opts = { max_new_tokens = 12, temperature = temperature, seed = 11 }
      local prompt = cat(system, seq(9 + c, 5, c))
      local first = clrt.sched.generate(m, prompt, opts)[1]
      local futures = {}
      for f = 1, 3 do
        futures[f] = function()
          local ctx, replies = cat(prompt, first.tokens), {}
          for turn = 1, 2 do
            ctx = cat(ctx, seq(5 + f + turn, 3 + f, turn))   -- the user's turn
            local r = clrt.sched.generate(m, ctx, opts)[1]
            replies[turn] = r
            ctx = cat(ctx, r.tokens)
          end
          return replies
        end
      end
      return { first = first, futures = futures }
    end
  end
  local firsts = clrt.sched.run(fns, { raise = true })
  local jobs = {}
  for c = 1, 3 do for f = 1, 3 do jobs[#jobs + 1] = firsts[c].futures[f] end end
  local later = clrt.sched.run(jobs, { raise = true })
  local out = {}
  for c = 1, 3 do out[#out + 1] = { firsts[c].first.tokens, firsts[c].first.logprobs } end
  for _, replies in ipairs(later) do
    for _, r in ipairs(replies) do out[#out + 1] = { r.tokens, r.logprobs } end
  end
  return out
end

local function same_bits(a, b, what)
  T.eq(#a, #b, what .. ": replies")
  for i = 1, #a do
    T.eq(a[i][1], b[i][1], ("%s: reply %d tokens"):format(what, i))
    for j = 1, #a[i][2] do
      if a[i][2][j] ~= b[i][2][j] then
        T.ok(false, ("%s: reply %d token %d log-probability %.9g vs %.9g"):format(what, i, j, a[i][2][j], b[i][2][j]))
      end
    end
  end
end

for _, temperature in ipairs({ 0, 1 }) do
  T.case(("turns, futures and shared prefixes are bit-identical with the cache off, on and evicting (temperature %g)")
    :format(temperature), function()
    local m = model()
    reusable(m)
    PC.configure(m, { mb = 0 })
    local off = conversations(m, temperature)
    T.ok(PC.of(m) == nil, "mb = 0 turns the cache off")

    PC.configure(m, { block_tokens = 8 })
    local on = conversations(m, temperature)
    local st = PC.of(m):stats()
    same_bits(on, off, "cache on")
    -- the futures' prompts start with the prompt and first response: most of what they
    -- prefill was computed by an earlier turn
    T.ok(st.cached_tokens > 0.5 * st.prompt_tokens,
      ("cached %d of %d prompt tokens"):format(st.cached_tokens, st.prompt_tokens))
    T.eq(st.evictions, 0, "a large bound evicts nothing")

    -- a bound of six blocks of 8 tokens: evictions all along
    local six = 6 * tonumber(C.clrt_kv_block_bytes(m.ptr, 8)) / 1048576
    PC.configure(m, { block_tokens = 8, mb = six })
    local tight = conversations(m, temperature)
    st = PC.of(m):stats()
    T.eq(st.capacity, 6, "the bound holds six blocks")
    T.ok(st.evictions > 0, "the tiny bound evicted")
    T.ok(st.blocks <= 6, "never more blocks than the bound")
    same_bits(tight, off, "tiny bound")
  end)
end

-- the fixture models' shapes (GQA, qk-norm, odd sizes, untied), random weights, longer context
T.case("every fixture architecture: bit-identical with the cache on", function()
  local cjson = require("cjson")
  for _, name in ipairs({ "llama_gqa", "qwen2_tied", "qwen3_qknorm", "odd", "mistral_window", "phi3_fused" }) do
    local cfg = cjson.decode(T.read(T.source_dir() .. "/tests/fixtures/model/" .. name .. "/config.json"))
    cfg.max_position_embeddings = 1024
    local m = clrt.model.new(cfg, { seed = 9 })
    reusable(m)
    PC.configure(m, { mb = 0 })
    local off = conversations(m, 1)
    PC.configure(m, { block_tokens = 4 })
    local on = conversations(m, 1)
    same_bits(on, off, name)
    local st = PC.of(m):stats()
    T.ok(st.cached_tokens > 0.5 * st.prompt_tokens, ("%s: cached %d of %d"):format(name, st.cached_tokens, st.prompt_tokens))
  end
end)

-- bf16 products (train.precision=bf16's policy) reuse keys and values only when batch
-- invariant: then the bf16 copy serves every row count, so a cached prefix is the bits a
-- prefill from the start computes; without it the cache stays off.
T.case("bf16 products: reused when batch invariant, bit-identical to the cache off", function()
  local m = model()
  reusable(m)
  m:set_matmul("bf16")
  T.eq(C.clrt_model_kv_reusable(m.ptr), 0, "bf16 without batch invariance: no reuse (sgemm past 32 rows)")
  m:set_batch_invariant(true)
  T.eq(C.clrt_model_kv_reusable(m.ptr), 1, "bf16, batch invariant: reuse")
  PC.configure(m, { mb = 0 })
  local off = conversations(m, 1)
  PC.configure(m, { block_tokens = 4 })
  local on = conversations(m, 1)
  same_bits(on, off, "bf16, batch invariant")
  local st = PC.of(m):stats()
  T.ok(st.cached_tokens > 0.5 * st.prompt_tokens, ("cached %d of %d"):format(st.cached_tokens, st.prompt_tokens))
end)

-- Gemma 3's attention (score scale, soft cap, windowed local layers) runs per query over the
-- KV cache as the others' does: its cache serves tokens, and replies keep their bits.
for _, name in ipairs({ "gemma3_tiny", "gemma3_softcap" }) do
  T.case(name .. ": the prefix cache serves Gemma 3's turns, replies bit-identical to the cache off", function()
    reusable(model())   -- this CPU can promise reuse at all; then Gemma 3 must promise it too
    local m = clrt.model.load(T.source_dir() .. "/tests/fixtures/model/" .. name)
    T.eq(C.clrt_model_kv_reusable(m.ptr), 1, name .. ": the model promises bit-identical reuse")
    PC.configure(m, { mb = 0 })
    local off = conversations(m, 1)
    PC.configure(m, { block_tokens = 4 })
    local on = conversations(m, 1)
    same_bits(on, off, name)
    local st = PC.of(m):stats()
    T.ok(st.cached_tokens > 0.5 * st.prompt_tokens, ("%s: cached %d of %d"):format(name, st.cached_tokens, st.prompt_tokens))
  end)
end

T.case("a next turn prefills only what is new; m:generate shares the model's cache", function()
  local m = model()
  reusable(m)
  PC.configure(m, { block_tokens = 16 })
  local prompt = seq(100, 13, 1)
  local r1 = m:generate({ prompt, prompt }, { max_new_tokens = 20, temperature = 0 })
  local nxt = cat(prompt, { unpack(r1[1].tokens, 1, 19) }, seq(30, 3, 2))
  local before = PC.of(m):stats().cached_tokens
  local r2 = m:generate({ nxt }, { max_new_tokens = 10, temperature = 0 })
  -- 100 prompt + 19 decoded positions in the slot, two rows decoding together: 7 whole blocks
  T.eq(PC.of(m):stats().cached_tokens - before, 112, "the prompt and the reply's whole blocks were served")
  PC.configure(m, { mb = 0 })
  local r3 = m:generate({ nxt }, { max_new_tokens = 10, temperature = 0 })
  T.eq(r2[1].tokens, r3[1].tokens, "same continuation without the cache")
  T.eq(r2[1].logprobs, r3[1].logprobs, "same log-probabilities without the cache")
end)

T.case("a reply decoded alone is not served (its one-row products sum in another order)", function()
  local m = model()
  reusable(m)
  PC.configure(m, { block_tokens = 16 })
  local prompt = seq(100, 13, 1)
  local r1 = m:generate({ prompt }, { max_new_tokens = 40, temperature = 0 })
  local nxt = cat(prompt, { unpack(r1[1].tokens, 1, 39) }, seq(30, 3, 2))
  local before = PC.of(m):stats().cached_tokens
  local r2 = m:generate({ nxt, seq(50, 7, 7) }, { max_new_tokens = 10, temperature = 1, seed = 2 })
  T.eq(PC.of(m):stats().cached_tokens - before, 96, "only the prompt's prefilled blocks were served")
  PC.configure(m, { mb = 0 })
  local r3 = m:generate({ nxt, seq(50, 7, 7) }, { max_new_tokens = 10, temperature = 1, seed = 2 })
  T.eq(r2[1].logprobs, r3[1].logprobs, "same log-probabilities without the cache")
end)

T.case("prompts arriving together that share a system prompt run it once", function()
  -- (only when that saves enough: two prompts sharing one block are not worth an extra forward)
  local m = model()
  reusable(m)
  local system = seq(83, 7, 3)
  local prompts = {}
  for c = 1, 3 do prompts[c] = cat(system, seq(6 + c, 5, c)) end
  PC.configure(m, { mb = 0 })
  local off = m:generate(prompts, { max_new_tokens = 8, temperature = 1, seed = 4 })
  PC.configure(m, { block_tokens = 8 })
  local on = m:generate(prompts, { max_new_tokens = 8, temperature = 1, seed = 4 })
  -- the first prompt runs the 80 tokens of whole blocks the three share; the other two are served them
  T.eq(PC.of(m):stats().cached_tokens, 160, "two prompts served the shared 80 tokens")
  for c = 1, 3 do
    T.eq(on[c].tokens, off[c].tokens, "prompt " .. c .. " tokens")
    T.eq(on[c].logprobs, off[c].logprobs, "prompt " .. c .. " log-probabilities")
  end
  PC.configure(m, { block_tokens = 8 })
  m:generate({ cat(seq(17, 7, 3), seq(9, 5, 1)), cat(seq(17, 7, 3), seq(9, 5, 2)) }, { max_new_tokens = 2 })
  T.eq(PC.of(m):stats().cached_tokens, 0, "16 shared tokens between two prompts: no extra forward")
end)

-- prompt -> (tokens, logprobs, cached prompt tokens of this request)
local function once(m, prompt)
  local pc = PC.of(m)
  local before = pc and pc:stats().cached_tokens or 0
  local r = m:generate({ prompt }, { max_new_tokens = 8, temperature = 1, seed = 3 })[1]
  return r, (pc and pc:stats().cached_tokens or 0) - before
end

local function check_new_weights(m, change, what)
  PC.configure(m, { block_tokens = 8 })
  local prompt = seq(60, 11, 4)
  local _, c1 = once(m, prompt)
  T.eq(c1, 0, "first sight: nothing cached")
  local _, c2 = once(m, prompt)
  T.eq(c2, 56, "the same prompt again: served from the cache")
  change()
  local r, c3 = once(m, prompt)
  T.eq(c3, 0, what .. ": the same prompt must miss the cache")
  PC.configure(m, { mb = 0 })
  local fresh = once(m, prompt)
  T.eq(r.tokens, fresh.tokens, what .. ": tokens equal a cache-off run under the new weights")
  T.eq(r.logprobs, fresh.logprobs, what .. ": log-probabilities equal a cache-off run")
end

T.case("an optimizer step invalidates the cache", function()
  local m = model()
  reusable(m)
  local opt = clrt.optim.adamw(m, { lr = 1e-2 })
  check_new_weights(m, function()
    m:zero_grad()
    local lp = m:logprobs({ seq(20, 3, 1) })
    m:backward(clrt.tensor.full(lp:shape(), -1))
    opt:step()
  end, "after an optimizer step")
end)

T.case("adapters turned off, changed or added invalidate the cache", function()
  local m = model()
  reusable(m)
  m:add_lora({ r = 4, alpha = 8 })
  local g = clrt.tensor.generator(7)
  for _, t in pairs(m:lora_params()) do t:copy_(clrt.tensor.randn(t:shape(), { generator = g })) end
  check_new_weights(m, function() m:set_adapters(false) end, "adapters off")
  check_new_weights(m, function() m:set_adapters(true) end, "adapters on again")
  check_new_weights(m, function()
    for _, t in pairs(m:lora_params()) do t:copy_(clrt.tensor.randn(t:shape(), { generator = g })) end
  end, "adapter weights written")
  local m2 = model(6)
  reusable(m2)
  check_new_weights(m2, function() m2:add_lora({ r = 2, alpha = 4 }) end, "adapters added")
end)

T.case("a row whose weights changed while it decoded puts nothing into the cache", function()
  local m = model()
  reusable(m)
  PC.configure(m, { block_tokens = 8 })
  local gen = require("clrt.gen.engine")
  local options = require("clrt.gen.options")
  local eng = gen.engine(m:decoder(2, 256))
  local rows = eng:add(seq(40, 3, 3), options.check({ n = 2, max_new_tokens = 30, temperature = 0 }, m.config.vocab_size))
  for _ = 1, 5 do eng:step() end
  T.eq(PC.of(m):stats().blocks, 5, "the prompt's five blocks are in")
  local w = m:params()["model.norm.weight"]
  w:copy_(clrt.tensor.full(w:shape(), 0.5))   -- new weights mid-reply
  while eng:busy() do eng:step() end
  T.eq(rows[1].finish_reason, "length")
  T.eq(PC.of(m):stats().blocks, 0, "the old blocks went and the mixed reply was not added")
end)

T.case("extend_many near the end of the context: a row whose padding would pass it runs alone", function()
  local m = model()
  reusable(m)
  local V, d = m.config.vocab_size, m:decoder(3, 64)
  local logits = ffi.new("float[?]", 3 * V)
  local a, b = seq(58, 5, 1), seq(40, 3, 2)
  -- slot 0: 48 positions already held, then 10 more; slot 1: 40 from empty. Padded to one
  -- width of 40, slot 0's chunk would reach position 88 of 64.
  d:prefill(0, ffi.new("int32_t[48]", { unpack(a, 1, 48) }), 48, logits)
  d:reset(1)
  local buf = ffi.new("int32_t[50]", cat({ unpack(a, 49, 58) }, b))
  d:extend_many(2, ffi.new("int32_t[2]", { 0, 1 }), buf, ffi.new("int32_t[2]", { 10, 40 }), logits)
  T.eq(d:length(0), 58, "slot 0 holds its 58 tokens")
  T.eq(d:length(1), 40, "slot 1 holds its 40")
  T.eq(d:exact_length(0), 58, "all exact")
  local got0, got1 = floats(logits, V), floats(logits + V, V)
  d:prefill(2, ffi.new("int32_t[58]", a), 58, logits)
  T.eq(got0, floats(logits + 2 * V, V), "slot 0's logits equal a prefill of all 58 at once")
  d:prefill(2, ffi.new("int32_t[40]", b), 40, logits)
  T.eq(got1, floats(logits + 2 * V, V), "slot 1's logits equal its own prefill")
  T.raises(function() d:extend_many(1, ffi.new("int32_t[1]", { 0 }), buf, ffi.new("int32_t[1]", { 7 }), logits) end,
    "after the 58 its slot holds")
end)

T.case("bad settings are named", function()
  local m = model()
  T.raises(function() PC.configure(m, { mb = -1 }) end, "mb must be a number >= 0")
  T.raises(function() PC.configure(m, { block_tokens = 0 }) end, "block_tokens must be an integer")
end)

-- quant=int8 reads other weights than f32 (their int8 copies): keys and values computed under
-- one are never served to the other, and an int8 model's own cache gives its cache-off bits.
T.case("quant=int8 turned on or off invalidates the cache; int8 reuse matches int8 without it", function()
  local m = model()
  reusable(m)
  check_new_weights(m, function() m:set_quant("int8") end, "int8 on")
  reusable(m)
  local prompts = {}
  for c = 1, 3 do prompts[c] = cat(seq(40, 7, 3), seq(6 + c, 5, c)) end
  PC.configure(m, { mb = 0 })
  local off = m:generate(prompts, { max_new_tokens = 8, temperature = 1, seed = 4 })
  PC.configure(m, { block_tokens = 8 })
  m:generate(prompts, { max_new_tokens = 8, temperature = 1, seed = 4 })   -- fills the cache
  local on = m:generate(prompts, { max_new_tokens = 8, temperature = 1, seed = 4 })
  T.ok(PC.of(m):stats().cached_tokens > 0, "int8 prompts were served from the cache")
  for c = 1, 3 do
    T.eq(on[c].tokens, off[c].tokens, "int8 prompt " .. c .. " tokens")
    T.eq(on[c].logprobs, off[c].logprobs, "int8 prompt " .. c .. " log-probabilities")
  end
  check_new_weights(m, function() m:set_quant("none") end, "int8 off")
  -- Gemma 3 with int8 weights: its scaled, soft-capped attention runs per query over the
  -- cache too, so the cache serves it and changes no bit
  local g = clrt.model.load(T.source_dir() .. "/tests/fixtures/model/gemma3_tiny")
  g:set_quant("int8")
  T.eq(C.clrt_model_kv_reusable(g.ptr), 1, "Gemma 3 with int8 weights reuses its keys")
  local gp = {}
  for c = 1, 3 do gp[c] = cat(seq(40, 5, 3), seq(4 + c, 3, c)) end
  PC.configure(g, { mb = 0 })
  local goff = g:generate(gp, { max_new_tokens = 8, temperature = 1, seed = 4 })
  PC.configure(g, { block_tokens = 8 })
  g:generate(gp, { max_new_tokens = 8, temperature = 1, seed = 4 })
  local gon = g:generate(gp, { max_new_tokens = 8, temperature = 1, seed = 4 })
  T.ok(PC.of(g):stats().cached_tokens > 0, "Gemma 3 int8 prompts were served from the cache")
  for c = 1, 3 do
    T.eq(gon[c].tokens, goff[c].tokens, "Gemma 3 int8 prompt " .. c .. " tokens")
    T.eq(gon[c].logprobs, goff[c].logprobs, "Gemma 3 int8 prompt " .. c .. " log-probabilities")
  end
  g:free()
end)

T.run()
