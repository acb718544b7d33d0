-- bench/sampler_trainer.lua — how far the log-probabilities recorded while sampling are from
-- the training forward's (m:logprobs) for the same tokens, over one RL step's shape: prompts x
-- n responses sampled together at temperature 1 through the continuous-batching engine, then
-- scored in length-sorted micro-batches as train.update does. Prints the largest and mean
-- absolute difference per mode: deterministic=0 (the batch kernels) and 1
-- (m:set_batch_invariant(true), the RL default). A numeric measurement, not a timing.
--   clrt bench/sampler_trainer.lua [shape=tiny|0.5b-4l|0.5b] [prompts=4] [n=4] [new=32] [prompt=48]
--                                  [micro=4] [deterministic=0,1]
-- 0.5b is Qwen2.5-0.5B's shape (24 layers, 151,936 tokens); 0.5b-4l the same widths and
-- vocabulary with 4 layers (a row's reductions are the same lengths; fewer layers to stack).
local args = dofile((debug.getinfo(1, "S").source:sub(2):match("^(.*)/") or ".") .. "/args.lua")
local opts = args.parse({ shape = "0.5b-4l", prompts = 4, n = 4, new = 32, prompt = 48, micro = 4,
  deterministic = "0,1", seed = 1 }, arg)
local gen = require("clrt.gen.engine")
local options = require("clrt.gen.options")

local QWEN = { architectures = { "Qwen2ForCausalLM" }, hidden_size = 896, intermediate_size = 4864,
  num_hidden_layers = 24, num_attention_heads = 14, num_key_value_heads = 2, vocab_size = 151936,
  rms_norm_eps = 1e-6, rope_theta = 1000000.0, max_position_embeddings = 4096, tie_word_embeddings = true }
local SHAPES = {
  tiny = { architectures = { "Qwen2ForCausalLM" }, hidden_size = 96, intermediate_size = 200, num_hidden_layers = 2,
    num_attention_heads = 4, num_key_value_heads = 2, vocab_size = 301, rms_norm_eps = 1e-6,
    max_position_embeddings = 512 },
  ["0.5b"] = QWEN,
  ["0.5b-4l"] = setmetatable({ num_hidden_layers = 4 }, { __index = QWEN }),
}

local function plain(t)
  local out = {}
  for k, v in pairs(getmetatable(t) and getmetatable(t).__index or {}) do out[k] = v end
  for k, v in pairs(t) do out[k] = v end
  return out
end

-- Largest and mean |sampled - trained| over every response token, and the token count.
local function measure(m, cfg, invariant)
  m:set_batch_invariant(invariant)
  local V = cfg.vocab_size
  local s = opts.seed
  local function rnd(n)
    s = (s * 1103515245 + 12345) % 2147483648
    return s % n
  end
  local E = gen.engine(m:decoder(opts.prompts * opts.n, opts.prompt + 8 + opts.new))
  local rows = {}
  for p = 1, opts.prompts do
    local prompt = {}
    for t = 1, opts.prompt + rnd(8) do prompt[t] = rnd(V) end
    local o = options.check({ n = opts.n, max_new_tokens = opts.new, temperature = 1, seed = opts.seed }, V)
    for _, row in ipairs(E:add(prompt, o, nil, p)) do rows[#rows + 1] = { prompt = prompt, row = row } end
  end
  while E:busy() do E:step() end
  for _, r in ipairs(rows) do
    r.ids = { unpack(r.prompt) }
    for _, t in ipairs(r.row.tokens) do r.ids[#r.ids + 1] = t end
  end
  table.sort(rows, function(a, b) return #a.ids < #b.ids end)
  local worst, sum, count = 0, 0, 0
  for i = 1, #rows, opts.micro do
    local part, ids = {}, {}
    for j = i, math.min(#rows, i + opts.micro - 1) do
      part[#part + 1] = rows[j]
      ids[#ids + 1] = rows[j].ids
    end
    local lp = m:logprobs(ids, { grad = false })
    for b, r in ipairs(part) do
      for j, sampled in ipairs(r.row.logprobs) do
        local d = math.abs(sampled - lp:get(b, #r.prompt + j - 1))
        worst, sum, count = math.max(worst, d), sum + d, count + 1
      end
    end
  end
  return worst, sum / math.max(count, 1), count
end

local cfg = plain(SHAPES[opts.shape] or error("unknown shape " .. tostring(opts.shape)))
local m = clrt.model.new(cfg, { seed = opts.seed })
print(("sampler vs trainer log-probabilities: shape %s (%d layers, hidden %d, vocabulary %d), %d prompts x %d "
  .. "responses of up to %d tokens, micro-batches of %d, %d threads"):format(opts.shape, cfg.num_hidden_layers,
  cfg.hidden_size, cfg.vocab_size, opts.prompts, opts.n, opts.new, opts.micro, clrt.num_threads()))
for _, mode in ipairs(args.numbers(opts.deterministic)) do
  local worst, mean, count = measure(m, cfg, mode == 1)
  print(("deterministic=%d: largest |difference| %.3g, mean %.3g over %d tokens"):format(mode, worst, mean, count))
end
