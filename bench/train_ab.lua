-- bench/train_ab.lua — one SFT step (forward, NLL, backward, AdamW) of the same model twice
-- over, the AVX-512 training kernels (set_decode_pack(true), the default) against OpenBLAS
-- sgemm throughout (set_decode_pack(false)), alternated step by step in one process so a
-- shared machine's load falls on both alike: the ratio is the figure. Defaults are the
-- built-in world's SFT model (0.9M: hidden 128, intermediate 384, 4 layers, vocabulary 512)
-- at its batch (32 conversations of up to 256 tokens).
--   clrt bench/train_ab.lua [C=128] [I=384] [L=4] [V=512] [B=32] [T=256] [steps=4]
local now = require("clrt.log").now   -- monotonic seconds (the library's one clock)
local sft = require("clrt.sft")
local update = require("clrt.train.update")
local losses = require("clrt.train.losses")
local args = {}
for _, a in ipairs(arg or {}) do local k, v = a:match("^(%w+)=(.*)$"); args[k] = v end
local C, I, L, V = tonumber(args.C or 128), tonumber(args.I or 384), tonumber(args.L or 4), tonumber(args.V or 512)
local B, Tm, steps = tonumber(args.B or 32), tonumber(args.T or 256), tonumber(args.steps or 4)
local H = math.max(1, math.floor(C / 32))
local cfg = { vocab_size = V, hidden_size = C, intermediate_size = I, num_hidden_layers = L,
  num_attention_heads = H, num_key_value_heads = H, max_position_embeddings = 4096, rms_norm_eps = 1e-5,
  rope_theta = 10000.0, tie_word_embeddings = true }
local models, opts = {}, {}
for i = 1, 2 do
  models[i] = clrt.model.new(cfg, { seed = 0, max_batch = B, max_seq = Tm })
  if i == 2 then models[i]:set_decode_pack(false) end
  opts[i] = clrt.optim.adamw(models[i], { lr = 1e-3 })
end
math.randomseed(1)
local items = {}
for i = 1, B do
  local n = math.random(math.floor(Tm / 2), Tm)
  local ids, mask = {}, {}
  for t = 1, n do ids[t] = math.random(0, V - 1); mask[t] = (t > n / 3) and 1 or 0 end
  items[i] = { ids = ids, mask = mask }
end
local nll = losses.nll()
local times, loss = { {}, {} }, {}
for s = 0, steps do
  for i = 1, 2 do
    local t0 = now()
    local parts = sft.parts(items, B)
    local results = update.step(models[i], opts[i], nll, parts, 1e-3)
    loss[i] = results[1].loss
    if s > 0 then times[i][s] = now() - t0 end
  end
end
local function stat(t) table.sort(t); return t[1], t[math.floor(#t / 2) + 1] end
local b1, m1 = stat(times[1])
local b2, m2 = stat(times[2])
print(("C=%d I=%d L=%d V=%d B=%d T<=%d threads=%d: kernels best %.4f s median %.4f | sgemm best %.4f median %.4f | speedup best %.2fx median %.2fx | last loss %.6f vs %.6f"):format(
  C, I, L, V, B, Tm, clrt.num_threads(), b1, m1, b2, m2, b2 / b1, m2 / m1, loss[1], loss[2]))
