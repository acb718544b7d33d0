-- test_batch_invariance.lua — with m:set_batch_invariant(true) a request's logits are the same
-- bits whatever shares its forwards: decoded alone or among 2, 7, 33 and 64 rows, first, in
-- the middle or last, prefilled alone or with longer and shorter prompts, and a position
-- prefilled at once gets the bits a decode step gives it. Checked on the packed f32 weights
-- (the default), without the packed copy, over the bf16 copies, and with LoRA adapters; then
-- through the continuous-batching engine: the same seeded request samples the same tokens and
-- log-probabilities alone and among 33 others. Gemma 3 too (its score scale, soft-capped scores
-- and windowed local layers, on the gemma3_tiny and gemma3_softcap fixtures), its per-query
-- log-probabilities checked against the PyTorch reference (tests/reference/gemma3_ref.py).
-- Bits are compared, not values.
local T = require("clrt.test")
local ffi = require("ffi")
local tensor = clrt.tensor
local gen = require("clrt.gen.engine")
local options = require("clrt.gen.options")
pcall(ffi.cdef, "int memcmp(const void *a, const void *b, size_t n);")

-- Shapes that leave partial panels (48-wide) and odd tails everywhere: K = 96 and 200 for the
-- products, outputs 96, 48, 200 and 301, head_dim 24.
local CFG = { architectures = { "Qwen2ForCausalLM" }, vocab_size = 301, hidden_size = 96,
  intermediate_size = 200, num_hidden_layers = 2, num_attention_heads = 4, num_key_value_heads = 2,
  max_position_embeddings = 128, rms_norm_eps = 1e-6, tie_word_embeddings = false }
local V, SLOTS, MAXLEN = CFG.vocab_size, 64, 96

local function lcg(seed)
  local s = seed
  return function(n)
    s = (s * 1103515245 + 12345) % 2147483648
    return s % n
  end
end

local rnd = lcg(11)
local function random_tokens(n)
  local t = {}
  for i = 1, n do t[i] = rnd(V) end
  return t
end

local PROMPT = random_tokens(13)
local FEED = random_tokens(6)   -- the target's next tokens, fed in order (the same inputs everywhere)

local function model(kind)
  local m = clrt.model.new(CFG, { seed = 5 })
  if kind == "lora" then
    m:add_lora{ r = 4, alpha = 8, dropout = 0, targets = { "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
      "up_proj", "down_proj" }, seed = 3 }
    local g = tensor.generator(99)
    for _, name in ipairs(m.lora_names) do
      local t = m:lora_params()[name]
      if name:find("lora_B") then t:copy_(tensor.randn(t:shape(), { generator = g }) * 0.2) end
    end
  elseif kind == "nopack" then
    m:set_decode_pack(false)
  elseif kind == "bf16" then
    m:set_matmul("bf16")
  end
  m:set_batch_invariant(true)
  return m
end

-- The target's logits after its prompt and after each fed token ({[0] = prefill, 1 .. #FEED}),
-- as copies of the [V] rows. company: how many other rows share every forward; at: the
-- target's place among them (1 .. company + 1); long: the others' prompt lengths. w: the
-- model's vocabulary and the target's tokens ({V =, prompt =, feed =}; default this file's).
local function run(dec, company, at, seed, w)
  local V, PROMPT, FEED = w and w.V or V, w and w.prompt or PROMPT, w and w.feed or FEED
  local r = lcg(seed)
  local n = company + 1
  local prompts, slots = {}, ffi.new("int32_t[?]", n)
  for i = 1, n do
    if i == at then prompts[i] = PROMPT
    else
      local len = 1 + r(40)   -- shorter and longer than the target's 13: the batch is padded to the longest
      local p = {}
      for j = 1, len do p[j] = r(V) end
      prompts[i] = p
    end
    slots[i - 1] = (i * 37 + seed) % SLOTS   -- slots scattered over the cache
  end
  local seen = {}
  for i = 0, n - 1 do
    while seen[slots[i]] do slots[i] = (slots[i] + 1) % SLOTS end
    seen[slots[i]] = true
  end
  local total = 0
  for _, p in ipairs(prompts) do total = total + #p end
  local buf, lengths, k = ffi.new("int32_t[?]", total), ffi.new("int32_t[?]", n), 0
  for i, p in ipairs(prompts) do
    lengths[i - 1] = #p
    for _, t in ipairs(p) do buf[k] = t; k = k + 1 end
  end
  local logits = ffi.new("float[?]", SLOTS * V)
  local mine = slots[at - 1]
  local out = {}
  local function keep(step)
    local row = ffi.new("float[?]", V)
    ffi.copy(row, logits + mine * V, 4 * V)
    out[step] = row
  end
  dec:prefill_many(n, slots, buf, lengths, logits)
  keep(0)
  local toks = ffi.new("int32_t[?]", n)
  for step = 1, #FEED do
    for i = 1, n do toks[i - 1] = i == at and FEED[step] or r(V) end
    dec:decode(n, slots, toks, logits)
    keep(step)
  end
  return out
end

local function same(a, b, n) return ffi.C.memcmp(a, b, 4 * (n or V)) == 0 end

local function first_difference(ref, got, n)
  for step = 0, #ref do
    if not same(ref[step], got[step], n) then
      local worst = 0
      for v = 0, (n or V) - 1 do worst = math.max(worst, math.abs(ref[step][v] - got[step][v])) end
      return ("step %d (largest difference %.3g)"):format(step, worst)
    end
  end
end

for _, kind in ipairs({ "packed", "nopack", "bf16", "lora" }) do
  T.case("decode and prefill, " .. kind .. ": a row's logits do not depend on its company", function()
    local m = model(kind)
    local dec = m:decoder(SLOTS, MAXLEN)
    local ref = run(dec, 0, 1, 1)
    for _, company in ipairs({ 1, 6, 32, 63 }) do
      for _, at in ipairs({ 1, math.floor(company / 2) + 1, company + 1 }) do
        local d = first_difference(ref, run(dec, company, at, company * 7 + at))
        T.ok(not d, ("%s: among %d rows at place %d the logits differ from alone at %s"):format(kind,
          company + 1, at, tostring(d)))
      end
    end
    -- the prompt and three fed tokens prefilled at once: the last position's logits are the
    -- bits the third decode step gave (a conversation's next turn is prefilled whole)
    local whole = { unpack(PROMPT) }
    for i = 1, 3 do whole[#whole + 1] = FEED[i] end
    local logits = ffi.new("float[?]", SLOTS * V)
    local toks = ffi.new("int32_t[?]", #whole, whole)
    dec:prefill(5, toks, #whole, logits)
    T.ok(same(logits + 5 * V, ref[3]), kind .. ": a prefilled position differs from the decode step's")
  end)
end

-- Through the engine: sampling at temperature 1 with the request's own seed and stream, so
-- its random numbers are the same in every run; tokens and log-probabilities must match too.
T.case("engine: the same request samples the same tokens and log-probabilities among 33 others", function()
  local m = model("packed")
  local function sample(company, at)
    local E = gen.engine(m:decoder(SLOTS, MAXLEN))
    local r = lcg(company + at)
    local target
    for i = 1, company + 1 do
      if i == at then
        target = E:add(PROMPT, options.check({ max_new_tokens = 12, temperature = 1, seed = 9 }, V), nil, 1, 4)[1]
      else
        local p = {}
        for j = 1, 1 + r(30) do p[j] = r(V) end
        E:add(p, options.check({ max_new_tokens = 1 + r(16), temperature = 1, seed = i }, V), nil, i, i)
      end
    end
    while E:busy() do E:step() end
    return target
  end
  local alone = sample(0, 1)
  T.eq(#alone.tokens, 12, "the target ran its 12 tokens")
  for _, at in ipairs({ 1, 17, 34 }) do
    local got = sample(33, at)
    T.eq(got.tokens, alone.tokens, "tokens among 34 rows at place " .. at)
    for i, lp in ipairs(alone.logprobs) do
      T.ok(lp == got.logprobs[i], ("log-probability %d among 34 rows at place %d: %.9g vs %.9g alone"):format(i, at,
        got.logprobs[i], lp))
    end
  end
end)

-- Gemma 3: the reference's row of 150 tokens (past the window of 5 and the blocked kernel's
-- 64-query blocks). Decoded alone or among others, prefilled whole or reached by decode steps
-- from any cut: the same bits; and each step's log p(next token) is PyTorch's.
local function log_softmax(z, n)
  local mx, s, out = -math.huge, 0, {}
  for v = 0, n - 1 do mx = math.max(mx, z[v]) end
  for v = 0, n - 1 do s = s + math.exp(z[v] - mx) end
  for v = 0, n - 1 do out[v + 1] = z[v] - mx - math.log(s) end
  return out
end

for _, name in ipairs({ "gemma3_tiny", "gemma3_softcap" }) do
  local fdir = T.source_dir() .. "/tests/fixtures/model/" .. name
  local function gemma()
    local m = clrt.model.load(fdir)
    m:set_batch_invariant(true)
    return m
  end
  local e = clrt.safetensors.load(fdir .. "/expected.safetensors")
  local row, ref_lp = e.long_tokens:totable()[1], T.floats(e.long_lp)   -- ref_lp[t] = log p(row[t + 1] | row[1..t])
  local GV = 96
  local function tokens(a, b)
    local t = {}
    for i = a, b do t[#t + 1] = row[i] end
    return t
  end

  T.case(name .. ": the training forward's per-query attention gives PyTorch's log-probs", function()
    local m = gemma()
    T.eq(m.config.vocab_size, GV)
    local got = T.floats(m:logprobs(e.long_tokens, { grad = false }))
    local worst = 0
    for t = 1, #ref_lp do worst = math.max(worst, math.abs(got[t] - ref_lp[t])) end
    T.ok(worst <= 1e-4, name .. ": max |lp - ref| = " .. worst)
  end)

  T.case(name .. ": prefilled whole or decoded from any cut, the same bits, PyTorch's log-probs", function()
    local m = gemma()
    local d = m:decoder(2, 160)
    local L = ffi.new("float[?]", 2 * GV)
    local whole = tokens(1, 149)
    d:prefill(0, ffi.new("int32_t[?]", #whole, whole), #whole, L)
    T.near(log_softmax(L, GV)[row[150] + 1], ref_lp[149], { atol = 1e-4 }, name .. ": prefilled log p(token 150)")
    for _, cut in ipairs({ 3, 33, 64, 65, 70, 143, 148 }) do
      local first = tokens(1, cut)
      d:prefill(1, ffi.new("int32_t[?]", #first, first), #first, L)
      for i = cut + 1, 149 do
        T.near(log_softmax(L + GV, GV)[row[i] + 1], ref_lp[i - 1], { atol = 1e-4 },
          ("%s: decoded log p(token %d) after a prefill of %d"):format(name, i, cut))
        d:decode(1, ffi.new("int32_t[1]", 1), ffi.new("int32_t[1]", row[i]), L)
      end
      T.ok(same(L, L + GV, GV), ("%s: 149 tokens prefilled whole differ from %d prefilled and the rest decoded"):format(name, cut))
    end
  end)

  T.case(name .. ": decode and prefill, a row's logits do not depend on its company", function()
    local m = gemma()
    local dec = m:decoder(SLOTS, MAXLEN)
    local w = { V = GV, prompt = tokens(1, 70), feed = tokens(71, 76) }
    local ref = run(dec, 0, 1, 1, w)
    for step = 1, #w.feed do
      T.near(log_softmax(ref[step - 1], GV)[w.feed[step] + 1], ref_lp[70 + step - 1], { atol = 1e-4 },
        ("%s: log p(token %d) alone"):format(name, 70 + step))
    end
    for _, company in ipairs({ 1, 6, 32, 63 }) do
      for _, at in ipairs({ 1, math.floor(company / 2) + 1, company + 1 }) do
        local d = first_difference(ref, run(dec, company, at, company * 7 + at, w), GV)
        T.ok(not d, ("%s: among %d rows at place %d the logits differ from alone at %s"):format(name,
          company + 1, at, tostring(d)))
      end
    end
  end)
end

-- Off (the default): the model says so, and turning it on changes nothing for one row.
T.case("the switch", function()
  local m = clrt.model.new(CFG, { seed = 5 })
  T.eq(m:batch_invariant(), false, "off by default")
  m:set_batch_invariant(true)
  T.eq(m:batch_invariant(), true, "on")
  T.raises(function() m:set_batch_invariant(1) end, "true or false", "a bad argument")
end)

T.run()
