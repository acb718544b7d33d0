-- test_sampler_trainer.lua — the policy that samples is the policy that trains, to the bit,
-- with batch invariance on (the RL default): responses sampled together through the
-- continuous-batching engine, then scored by the training forward (m:logprobs) in
-- length-sorted micro-batches of 4 as train.update runs them, with the packed copy of the
-- weights (the default), without it (set_decode_pack(false)), with LoRA adapters, and on Gemma 3
-- (gemma3_tiny: its scaled attention and windowed local layers; gemma3_softcap: with both soft
-- caps, the decode logits capped as the sampler reads them). For every response token the
-- decode step's logits, put through the training forward's own output kernel
-- (clrt_logsoftmax_gather_forward over an identity head, which copies the logits exactly),
-- give the training forward's log-probability bit for bit: the logits are the same. The
-- log-probability the sampler records (sample.c: log-softmax in double) then differs from the
-- trainer's float log-softmax by rounding only; its bound is asserted (measured 9.5e-7 here).
local T = require("clrt.test")
local ffi = require("ffi")
local gen = require("clrt.gen.engine")
local options = require("clrt.gen.options")
pcall(ffi.cdef, [[
void clrt_logsoftmax_gather_forward(float *lp, float *lse, const float *x, const float *w, const float *wp, int fast,
                                    const int32_t *target, int64_t N, int C, int V, float *scratch, int chunk);
]])

local CFG = { architectures = { "Qwen2ForCausalLM" }, vocab_size = 301, hidden_size = 96,
  intermediate_size = 200, num_hidden_layers = 2, num_attention_heads = 4, num_key_value_heads = 2,
  max_position_embeddings = 256, rms_norm_eps = 1e-6, tie_word_embeddings = true }
local V = CFG.vocab_size
local PROMPTS, N, NEW, MICRO = 4, 4, 16, 4
local SAMPLER_BOUND = 4e-6

local identities = {}   -- [n * n] identity heads by vocabulary size
local lp1, target = ffi.new("float[1]"), ffi.new("int32_t[1]")

-- The training forward's output kernel on one row of n logits: log p(t) as m:logprobs forms it
-- (one vocabulary block: the training forward's shape for these few rows too).
local function trainer_formula(logits, t, n)
  n = n or V
  if not identities[n] then
    local id = ffi.new("float[?]", n * n)
    for i = 0, n - 1 do id[i * n + i] = 1 end
    identities[n] = { id = id, scratch = ffi.new("float[?]", n) }
  end
  target[0] = t
  ffi.C.clrt_logsoftmax_gather_forward(lp1, nil, logits, identities[n].id, nil, 0, target, 1, n, n, identities[n].scratch, 1)
  return lp1[0]
end

local function f32_bits(x)
  local f = ffi.new("float[1]", x)
  return ffi.cast("uint32_t *", f)[0]
end

-- One RL step's shape: sample, then score; per response token (decode-logits lp through the
-- trainer's kernel, the trainer's lp, the sampler's recorded lp).
local function step(invariant, kind)
  local m = kind:find("^gemma3") and clrt.model.load(T.source_dir() .. "/tests/fixtures/model/" .. kind)
    or clrt.model.new(CFG, { seed = 4 })
  local V = m.config.vocab_size
  m:set_batch_invariant(invariant)
  m:set_decode_pack(kind ~= "nopack")
  if kind == "lora" then   -- B random: the adapters move every product
    m:add_lora{ r = 4, alpha = 8, dropout = 0, targets = { "q_proj", "v_proj", "o_proj", "down_proj" }, seed = 3 }
    local g = clrt.tensor.generator(9)
    for _, name in ipairs(m.lora_names) do
      local t = m:lora_params()[name]
      if name:find("lora_B") then t:copy_(clrt.tensor.randn(t:shape(), { generator = g }) * 0.2) end
    end
  end
  local s = 3
  local function rnd(n)
    s = (s * 1103515245 + 12345) % 2147483648
    return s % n
  end
  local E = gen.engine(m:decoder(PROMPTS * N, 64 + NEW))
  local rows = {}
  for p = 1, PROMPTS do
    local prompt = {}
    for t = 1, 10 + rnd(30) do prompt[t] = rnd(V) end
    local o = options.check({ n = N, max_new_tokens = NEW, temperature = 1, seed = 1 }, V)
    for _, row in ipairs(E:add(prompt, o, nil, p)) do rows[#rows + 1] = { prompt = prompt, row = row } end
  end
  while E:busy() do E:step() end
  -- the decode logits of every response token, replayed alone through a fresh decoder
  local dec = m:decoder(1, 64 + NEW)
  local logits = ffi.new("float[?]", V)
  for _, r in ipairs(rows) do
    r.ids = { unpack(r.prompt) }
    local buf = ffi.new("int32_t[?]", #r.prompt, r.prompt)
    dec:prefill(0, buf, #r.prompt, logits)
    r.decoded = {}
    for j, t in ipairs(r.row.tokens) do
      r.decoded[j] = trainer_formula(logits, t, V)
      r.ids[#r.ids + 1] = t
      if j < #r.row.tokens then dec:decode(1, ffi.new("int32_t[1]", 0), ffi.new("int32_t[1]", t), logits) end
    end
  end
  table.sort(rows, function(a, b) return #a.ids < #b.ids end)
  local out = {}
  for i = 1, #rows, MICRO do
    local part, ids = {}, {}
    for j = i, math.min(#rows, i + MICRO - 1) do part[#part + 1], ids[#ids + 1] = rows[j], rows[j].ids end
    local lp = m:logprobs(ids, { grad = false })
    for b, r in ipairs(part) do
      for j, sampled in ipairs(r.row.logprobs) do
        out[#out + 1] = { decoded = r.decoded[j], trained = lp:get(b, #r.prompt + j - 1), sampled = sampled }
      end
    end
  end
  return out
end

for _, kind in ipairs({ "packed", "nopack", "lora", "gemma3_tiny", "gemma3_softcap" }) do
  T.case(("batch-invariant, %s: the decode logits are the training forward's, bit for bit"):format(kind), function()
    local tokens = step(true, kind)
    T.ok(#tokens >= PROMPTS * N * 4, "enough response tokens to compare (" .. #tokens .. ")")
    local worst = 0
    for i, e in ipairs(tokens) do
      T.ok(f32_bits(e.decoded) == f32_bits(e.trained), ("token %d: the decode logits give %.9g, the training forward %.9g")
        :format(i, e.decoded, e.trained))
      worst = math.max(worst, math.abs(e.sampled - e.trained))
    end
    T.ok(worst <= SAMPLER_BOUND, ("the sampler's recorded log-probabilities are within %g of the trainer's (largest %.3g)")
      :format(SAMPLER_BOUND, worst))
    io.write(("  sampler vs trainer: largest |difference| %.3g over %d tokens\n"):format(worst, #tokens))
  end)
end

T.run()
