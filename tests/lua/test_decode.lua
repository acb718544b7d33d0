-- KV-cache decoding against the slow path (a full recompute through m:logprobs) on every
-- fixture model: next-token distributions after prefill and after each decode step, greedy
-- sequences token for token, ragged batches, n > 1 sharing one prefill, seeds, limits.
local T = require("clrt.test")
local root = T.source_dir() .. "/tests/fixtures/model/"
local configs = { "llama_gqa", "qwen2_tied", "qwen3_qknorm", "odd", "mistral_window", "phi3_fused" }

-- log p(v | seq) for every v, by scoring seq..v for all v in one batch.
local function slow_next_logprobs(m, seq)
  local V = m.config.vocab_size
  local rows = {}
  for v = 0, V - 1 do
    local r = { unpack(seq) }
    r[#r + 1] = v
    rows[#rows + 1] = r
  end
  local lp = m:logprobs(rows, { grad = false })
  local out = {}
  for v = 0, V - 1 do out[v + 1] = lp:get(v + 1, #seq) end
  return out
end

local function argmax(t)
  local best, arg = -math.huge, nil
  for i, x in ipairs(t) do if x > best then best, arg = x, i - 1 end end
  return arg
end

local function slow_greedy(m, prompt, steps)
  local seq, out = { unpack(prompt) }, {}
  for _ = 1, steps do
    local a = argmax(slow_next_logprobs(m, seq))
    out[#out + 1] = a
    seq[#seq + 1] = a
  end
  return out
end

local function log_softmax(logits, V)
  local mx = -math.huge
  for v = 0, V - 1 do if logits[v] > mx then mx = logits[v] end end
  local z = 0
  for v = 0, V - 1 do z = z + math.exp(logits[v] - mx) end
  local out = {}
  for v = 0, V - 1 do out[v + 1] = logits[v] - mx - math.log(z) end
  return out
end

for _, name in ipairs(configs) do
  T.case(name .. ": prefill and decode logits equal the full recompute", function()
    local ffi = require("ffi")
    local m = clrt.model.load(root .. name)
    local V = m.config.vocab_size
    local d = m:decoder(3, 40)
    local logits = ffi.new("float[?]", 3 * V)
    local seq = { 3, 17, 5, 9, 11, 2, 40 }
    d:prefill(1, ffi.new("int32_t[7]", seq), #seq, logits)
    T.near(log_softmax(logits + V, V), slow_next_logprobs(m, seq), { atol = 1e-4 }, "after prefill")
    for _, tok in ipairs({ 7, 30, 1 }) do
      seq[#seq + 1] = tok
      d:decode(1, ffi.new("int32_t[1]", { 1 }), ffi.new("int32_t[1]", { tok }), logits)
      T.near(log_softmax(logits + V, V), slow_next_logprobs(m, seq), { atol = 1e-4 }, "after decoding " .. tok)
    end
    T.eq(d:length(1), #seq)
  end)

  T.case(name .. ": one batched prefill of ragged prompts equals a prefill each", function()
    -- to float rounding: the CPU kernels' sums depend on how many rows a call has (a decode
    -- step of 8 rows already differs from 8 steps of one by ~1e-6), so not bit for bit
    local ffi = require("ffi")
    local m = clrt.model.load(root .. name)
    local V = m.config.vocab_size
    local lens = { 3, 60, 1, 17, 41 }
    local prompts, all = {}, {}
    for i, n in ipairs(lens) do
      prompts[i] = {}
      for t = 1, n do prompts[i][t] = (i * 31 + t * 7) % V; all[#all + 1] = prompts[i][t] end
    end
    local slots = { 4, 0, 2, 1, 3 }
    local one, many = ffi.new("float[?]", 5 * V), ffi.new("float[?]", 5 * V)
    local d1, d2 = m:decoder(5, 64), m:decoder(5, 64)
    for i, p in ipairs(prompts) do d1:prefill(slots[i], ffi.new("int32_t[?]", #p, p), #p, one) end
    d2:prefill(0, ffi.new("int32_t[1]", { 9 }), 1, many)   -- a slot that held something before
    d2:prefill_many(5, ffi.new("int32_t[5]", slots), ffi.new("int32_t[?]", #all, all), ffi.new("int32_t[5]", lens), many)
    local function same(what)
      for r = 0, 4 do
        local a, b = {}, {}
        for v = 0, V - 1 do a[v + 1], b[v + 1] = one[r * V + v], many[r * V + v] end
        T.near(b, a, { atol = 2e-5 }, what .. " row " .. r)
      end
    end
    same("after prefill")
    for i = 1, 5 do T.eq(d2:length(slots[i]), lens[i]) end
    -- and the caches agree: one decode step of every slot gives the same logits
    local toks = ffi.new("int32_t[5]", { 1, 2, 3, 4, 5 })
    d1:decode(5, ffi.new("int32_t[5]", slots), toks, one)
    d2:decode(5, ffi.new("int32_t[5]", slots), toks, many)
    same("after a decode step")
  end)

  T.case(name .. ": greedy generate equals the slow path on a ragged batch", function()
    local m = clrt.model.load(root .. name)
    local prompts = { { 1, 2, 3, 4, 5 }, { 9 }, { 20, 21, 22, 23, 24, 25, 26, 27, 28 } }
    local res = m:generate(prompts, { temperature = 0, max_new_tokens = 12 })
    for i, p in ipairs(prompts) do
      T.eq(res[i].tokens, slow_greedy(m, p, 12), "prompt " .. i)
      T.eq(res[i].finish_reason, "length")
    end
  end)
end

T.case("requests that arrive together (one batched prefill) sample what each samples alone", function()
  local gen = require("clrt.gen.engine")
  local options = require("clrt.gen.options")
  local m = clrt.model.load(root .. "qwen2_tied")
  local prompts = { { 5, 6, 7 }, { 8 }, { 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19 }, { 3, 3 } }
  local function run(list, opts_of)
    local eng = gen.engine(m:decoder(8, 64))
    local rows = {}
    for _, i in ipairs(list) do rows[i] = eng:add(prompts[i], options.check(opts_of(i), m.config.vocab_size), nil, i) end
    while eng:busy() do eng:step() end
    return rows
  end
  for _, temp in ipairs({ 0, 1 }) do
    local function opts_of(i) return { temperature = temp, seed = 40 + i, n = i == 2 and 2 or 1, max_new_tokens = 10 } end
    local together = run({ 1, 2, 3, 4 }, opts_of)
    for i = 1, 4 do
      local alone = run({ i }, opts_of)[i]
      for s, row in ipairs(alone) do
        T.eq(together[i][s].tokens, row.tokens, ("temperature %g prompt %d sample %d"):format(temp, i, s))
      end
    end
  end
end)

T.case("n samples share a prefill; the same seed gives the same samples", function()
  local m = clrt.model.load(root .. "qwen2_tied")
  local prompts = { { 5, 6, 7 }, { 8, 9 } }
  local a = m:generate(prompts, { n = 4, temperature = 1.0, top_p = 0.95, max_new_tokens = 10, seed = 3 })
  local b = m:generate(prompts, { n = 4, temperature = 1.0, top_p = 0.95, max_new_tokens = 10, seed = 3 })
  T.eq(#a, 8)
  for i = 1, 8 do T.eq(a[i].tokens, b[i].tokens) end
  local distinct = {}
  for i = 1, 4 do distinct[table.concat(a[i].tokens, ",")] = true end
  local count = 0
  for _ in pairs(distinct) do count = count + 1 end
  T.ok(count > 1, "4 samples at temperature 1 should not all be equal")
  -- each sample's logprob is that of its token under the sampled (nucleus) distribution
  for _, r in ipairs(a) do for _, lp in ipairs(r.logprobs) do T.ok(lp <= 0 and lp > -30) end end
end)

T.case("stop token ids end rows; max_new_tokens 0 and 1", function()
  local m = clrt.model.load(root .. "llama_gqa")
  local ref = slow_greedy(m, { 4, 4, 4 }, 6)
  local r = m:generate({ { 4, 4, 4 } }, { temperature = 0, max_new_tokens = 6, stop = { ref[3] } })
  local first
  for i, t in ipairs(ref) do if t == ref[3] then first = i break end end
  T.eq(r[1].tokens, { unpack(ref, 1, first) })
  T.eq(r[1].finish_reason, "stop")
  T.eq(m:generate({ { 4 } }, { max_new_tokens = 0 })[1].tokens, {})
  T.eq(m:generate({ { 4 } }, { max_new_tokens = 1, temperature = 0 })[1].tokens, { slow_greedy(m, { 4 }, 1)[1] })
end)

T.case("a full cache and bad input are clear errors, never an overflow", function()
  local ffi = require("ffi")
  local m = clrt.model.load(root .. "odd")
  local V = m.config.vocab_size
  local d = m:decoder(2, 8)
  local logits = ffi.new("float[?]", 2 * V)
  d:prefill(0, ffi.new("int32_t[8]", { 1, 2, 3, 4, 5, 6, 7, 8 }), 8, logits)
  T.raises(function() d:decode(1, ffi.new("int32_t[1]", { 0 }), ffi.new("int32_t[1]", { 1 }), logits) end, "slot 0 is full (8 tokens)")
  T.raises(function() d:prefill(1, ffi.new("int32_t[9]"), 9, logits) end, "exceed its context of 8")
  T.raises(function() d:decode(1, ffi.new("int32_t[1]", { 1 }), ffi.new("int32_t[1]", { 1 }), logits) end, "slot 1 is empty")
  T.raises(function() d:decode(1, ffi.new("int32_t[1]", { 5 }), ffi.new("int32_t[1]", { 1 }), logits) end, "slot 5 out of range")
  T.raises(function() d:prefill(1, ffi.new("int32_t[1]", { V }), 1, logits) end, "outside the vocabulary")
  T.raises(function() m:generate({ { 1 } }, { max_new_tokens = 100 }) end, "more than the context of 64")
end)

-- set_matmul("bf16") on the CPU: decode steps read bf16 copies of the linear layers' weights
-- and round their inputs to bf16 (norms, biases and the embedding lookup stay f32). Their
-- logits must follow the f32 decode of a model whose linear weights were rounded to bf16 up
-- front (to the inputs' bf16 rounding, ~1e-2 here; a misplaced copy would be off by O(1)) and
-- the f32 model; test_model_kernels checks the kernel's products exactly. A tied model's
-- output layer is its embedding, which the lookup reads in f32, so the comparison with the
-- rounded weights runs on the untied models.
-- The logits [V] (an FFI buffer) after prefilling seq into a fresh decoder and decoding `more`.
local function decoded_logits(m, seq, more)
  local ffi = require("ffi")
  local d = m:decoder(1, 40)
  local out = ffi.new("float[?]", m.config.vocab_size)
  d:prefill(0, ffi.new("int32_t[?]", #seq, seq), #seq, out)
  for _, tok in ipairs(more or {}) do d:decode(1, ffi.new("int32_t[1]", { 0 }), ffi.new("int32_t[1]", { tok }), out) end
  return out
end

-- CPU decoding reads a packed copy of the weights (where the CPU has AVX-512); it must follow
-- every change to the weights: a write through a params() view, an optimizer step.
T.case("packed decode weights follow writes to the weights and the optimizer", function()
  local m = clrt.model.load(root .. "llama_gqa")
  local V = m.config.vocab_size
  local seq = { 3, 17, 5, 9, 11, 2, 40 }
  local function decode_logprobs(model) return log_softmax(decoded_logits(model, seq), V) end
  local before = m:memory().params
  T.near(decode_logprobs(m), slow_next_logprobs(m, seq), { atol = 1e-4 }, "fresh model")
  -- the copy is as large as the weights (none on a CPU without AVX-512)
  local grew = m:memory().params - before
  T.ok(grew == before or grew == 0, "the packed copy counts in the parameter memory: " .. grew)
  m:params()["model.layers.0.mlp.down_proj.weight"]:mul_(3)
  m:params()["model.layers.1.self_attn.q_proj.weight"]:fill_(0.05)
  local changed = slow_next_logprobs(m, seq)
  T.ok(math.abs(changed[1] - decode_logprobs(clrt.model.load(root .. "llama_gqa"))[1]) > 1e-3,
       "the writes change the distribution")
  T.near(decode_logprobs(m), changed, { atol = 1e-4 }, "after writes through params() views")
  local opt = clrt.optim.adamw(m, { lr = 1e-2 })
  m:zero_grad()
  local rows = { { 1, 2, 3, 4, 5, 6 } }
  local lp = m:logprobs(rows)
  m:backward(clrt.tensor.full(lp:shape(), -1))
  opt:step()
  T.near(decode_logprobs(m), slow_next_logprobs(m, seq), { atol = 1e-4 }, "after an optimizer step")
  m:set_decode_pack(false)
  T.near(decode_logprobs(m), slow_next_logprobs(m, seq), { atol = 1e-4 }, "without the packed copy")
  T.eq(m:memory().params, before, "set_decode_pack(false) frees the copy")
  T.raises(function() m:set_decode_pack("yes") end, "true or false", "a bad argument")
end)

T.case("bf16 decode weights on the CPU follow the f32 path over bf16-rounded weights", function()
  for _, name in ipairs(configs) do
    local m16 = clrt.model.load(root .. name):set_matmul("bf16")
    local mr = clrt.model.load(root .. name)
    local tied = mr.config.tie_word_embeddings
    for pname, p in pairs(mr:params()) do
      if pname:match("proj%.weight$") or pname == "lm_head.weight" then p:copy_(p:to("bf16"):to("f32")) end
    end
    local mf = clrt.model.load(root .. name)
    local V = mr.config.vocab_size
    local seq = { 3, 17, 5, 9, 11, 2, 40 }
    local function last_logits(m)
      local out = decoded_logits(m, seq, { 7, 30 })
      local t = {}
      for v = 0, V - 1 do t[v + 1] = out[v] end
      return t
    end
    local a, b, f = last_logits(m16), last_logits(mr), last_logits(mf)
    if not tied then T.near(a, b, { atol = 2e-2 }, name .. ": bf16 copies vs rounded weights") end
    -- Where the CPU has AVX512-BF16 the copies are packed for decode; without the packing the
    -- copies are laid out again and the unpacked kernel gives the same products (summed in
    -- another order).
    m16:set_decode_pack(false)
    T.near(last_logits(m16), a, { atol = 1e-4 }, name .. ": bf16 decode with and without packing")
    m16:set_decode_pack(true)
    T.near(last_logits(m16), a, { atol = 1e-4 }, name .. ": bf16 decode packed again")
    local worst = 0
    for i = 1, V do worst = math.max(worst, math.abs(a[i] - f[i])) end
    T.ok(worst > 0 and worst < 0.05, name .. ": bf16 logits differ from f32 by " .. worst)
    local prompts = { { 1, 2, 3, 4, 5 }, { 9 } }
    local g16 = m16:generate(prompts, { temperature = 0, max_new_tokens = 10 })
    local gr = mr:generate(prompts, { temperature = 0, max_new_tokens = 10 })
    for i = 1, #prompts do
      -- equal up to a step where the reference's best two tokens are within bf16's rounding
      -- (mistral_window's second row meets one, 2e-4 apart); the rows may part there
      local seq = { unpack(prompts[i]) }
      for s = 1, tied and 0 or #gr[i].tokens do
        if g16[i].tokens[s] ~= gr[i].tokens[s] then
          local lp = slow_next_logprobs(mr, seq)
          table.sort(lp, function(x, y) return x > y end)
          T.ok(lp[1] - lp[2] < 1e-2, ("%s greedy row %d step %d: bf16 picked %d, f32 %d, %.4g apart"):format(
            name, i, s, g16[i].tokens[s], gr[i].tokens[s], lp[1] - lp[2]))
          break
        end
        seq[#seq + 1] = gr[i].tokens[s]
      end
    end
  end
end)

T.run()
