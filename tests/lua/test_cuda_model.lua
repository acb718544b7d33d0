-- test_cuda_model.lua — the model on the GPU against the same model on the CPU (and the PyTorch
-- fixtures of tests/reference/make_model_fixtures.py): tensors to/from cuda, log-probs, every
-- gradient, AdamW steps, save from the GPU, greedy generation. Skips (77) without a GPU.
if not clrt.cuda_available() then
  print("skipped: " .. clrt.cuda_status())
  os.exit(77)
end

local T = require("clrt.test")
local tensor = clrt.tensor
local fixtures = T.source_dir() .. "/tests/fixtures/model"

local function expected(name)
  return clrt.safetensors.load(fixtures .. "/" .. name .. "/expected.safetensors", { "adamw" })
end

local flat = T.floats

local function flat_max(t)
  local m = 0
  for _, v in ipairs(flat(t)) do m = math.max(m, math.abs(v)) end
  return m
end

-- |a - e| <= rtol * max|e| elementwise (and no NaN)
local function close(a, e, rtol, what)
  local fa, fe = flat(a), flat(e)
  T.eq(#fa, #fe, what .. ": element count")
  local scale = 1e-12
  for i = 1, #fe do scale = math.max(scale, math.abs(fe[i])) end
  for i = 1, #fe do
    if not (math.abs(fa[i] - fe[i]) <= rtol * scale) then
      T.ok(false, ("%s[%d]: cpu %.7g, cuda %.7g (scale %.3g, rtol %g)"):format(what, i, fe[i], fa[i], scale, rtol))
      return
    end
  end
end

-- After AdamW steps an element whose gradient is ~0 moves by about +-lr depending on the
-- gradient's sign, which fp32 rounding may flip between devices: allow a few such elements.
local function close_mostly(a, e, rtol, what)
  local fa, fe = flat(a), flat(e)
  local scale, bad = 1e-12, 0
  for i = 1, #fe do scale = math.max(scale, math.abs(fe[i])) end
  for i = 1, #fe do
    if not (math.abs(fa[i] - fe[i]) <= rtol * scale) then bad = bad + 1 end
  end
  T.ok(bad <= math.max(2, #fe / 1000), ("%s: %d of %d elements differ by more than %g of scale %.3g"):format(
    what, bad, #fe, rtol, scale))
end

T.case("tensors go to cuda and back; copy_ across devices; cuda tensors refuse host access", function()
  local a = tensor.randn({ 3, 5 }, { generator = tensor.generator(1) })
  local g = a:to("cuda")
  T.eq(g:device(), "cuda")
  local b = g:to("cpu")
  T.eq(b:device(), "cpu")
  close(b, a, 0, "round trip")
  local z = tensor.zeros({ 3, 5 }, { device = "cuda" })
  z:copy_(a)
  close(z:to("cpu"), a, 0, "copy_ host to device")
  T.raises(function() g:get(1, 1) end, "cuda")
  close(a:t():to("cuda"):to("cpu"), a:t():contiguous(), 0, "a strided host view is made contiguous")
end)

for _, name in ipairs({ "llama_gqa", "qwen2_tied", "qwen3_qknorm", "mistral_window", "phi3_fused" }) do
  T.case(name .. ": log-probs, gradients and 3 AdamW steps on cuda match the cpu and PyTorch", function()
    local e, meta = expected(name)
    local hp = require("cjson").decode(meta.adamw)
    local cpu = clrt.model.load(fixtures .. "/" .. name)
    local gpu = clrt.model.load(fixtures .. "/" .. name, { device = "cuda" })
    T.eq(gpu:device(), "cuda")
    local function opt(m)
      return clrt.optim.adamw(m, { lr = hp.lr, betas = hp.betas, eps = hp.eps,
        weight_decay = hp.weight_decay, grad_clip = hp.grad_clip })
    end
    local oc, og = opt(cpu), opt(gpu)
    local lens = e.lengths:totable()
    local B, Tn = e.tokens:size(1), e.tokens:size(2)
    local count = 0
    for b = 1, B do count = count + lens[b] - 1 end
    local d = tensor.zeros({ B, Tn - 1 })
    for b = 1, B do for t = 1, lens[b] - 1 do d:set(b, t, -1 / count) end end
    local losses, norms = e.losses:totable(), e.grad_norms:totable()
    for step = 1, 3 do
      cpu:zero_grad()
      gpu:zero_grad()
      local lc = cpu:logprobs(e.tokens, { lengths = e.lengths })
      local lg = gpu:logprobs(e.tokens, { lengths = e.lengths })
      close(lg, lc, 1e-5, "logprobs step " .. step)
      local s = 0
      for b = 1, B do for t = 1, lens[b] - 1 do s = s + lg:get(b, t) end end
      T.near(-s / count, losses[step], { atol = 1e-4 }, "cuda loss vs PyTorch at step " .. step)
      cpu:backward(d)
      gpu:backward(d)
      if step == 1 then
        local gc, gg = cpu:grads(), gpu:grads()
        for _, pname in ipairs(cpu.names) do close(gg[pname], gc[pname], 1e-4, "grad " .. pname) end
      end
      local nc, ng = oc:step(), og:step()
      T.near(ng, nc, { rtol = 1e-4, atol = 1e-7 }, "grad norm at step " .. step)
      T.near(ng, norms[step], { atol = 1e-4, rtol = 1e-3 }, "cuda grad norm vs PyTorch at step " .. step)
    end
    local pc, pg = cpu:params(), gpu:params()
    for _, pname in ipairs(cpu.names) do
      if pname:match("k_proj%.bias$") then
        -- Softmax ignores a shift shared by every key's score, and q.b_k is such a shift: the
        -- key bias's exact gradient is zero, so what each device computes is rounding noise
        -- (checked above against the cpu's equally tiny gradient), and AdamW turns any noise
        -- into steps of about lr with the noise's sign. Its only cross-device bound is that.
        close(pg[pname], pc[pname], 2 * 3 * hp.lr / math.max(1e-12, flat_max(pc[pname])), "param after 3 steps " .. pname)
      else
        close_mostly(pg[pname], pc[pname], 1e-4, "param after 3 steps " .. pname)
      end
    end
    -- save from the GPU, load on the CPU: the same bytes as the GPU's parameters
    local dir = T.tmpdir() .. "/saved"
    gpu:save(dir)
    local back = clrt.model.load(dir)
    for _, pname in ipairs(cpu.names) do close(back:params()[pname], pg[pname], 0, "saved " .. pname) end
  end)
end

T.case("greedy generation on cuda gives the cpu's tokens (batched, KV cache)", function()
  local cfg = { architectures = { "Qwen2ForCausalLM" }, vocab_size = 300, hidden_size = 64,
    intermediate_size = 96, num_hidden_layers = 3, num_attention_heads = 4, num_key_value_heads = 2,
    max_position_embeddings = 128, rms_norm_eps = 1e-6, rope_theta = 10000.0, tie_word_embeddings = true }
  local cpu = clrt.model.new(cfg, { seed = 7 })
  local gpu = clrt.model.new(cfg, { seed = 7, device = "cuda" })
  local prompts = { { 1, 2, 3, 4, 5 }, { 250, 17 }, { 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9 } }
  local rc = cpu:generate(prompts, { temperature = 0, max_new_tokens = 12 })
  local rg = gpu:generate(prompts, { temperature = 0, max_new_tokens = 12 })
  for i = 1, #prompts do
    T.eq(table.concat(rg[i].tokens, ","), table.concat(rc[i].tokens, ","), "prompt " .. i)
  end
end)

T.case("sliding window on cuda: greedy decode of Mistral and Phi-3 gives PyTorch's tokens past the window", function()
  for _, name in ipairs({ "mistral_window", "phi3_fused" }) do
    local e = expected(name)
    local gpu = clrt.model.load(fixtures .. "/" .. name, { device = "cuda" })
    local r = gpu:generate({ e.greedy_prompt:totable() }, { temperature = 0, max_new_tokens = e.greedy:numel() })
    T.eq(table.concat(r[1].tokens, ","), table.concat(e.greedy:totable(), ","), name .. " greedy on cuda")
  end
end)

T.case("bf16 matmuls on cuda: close to the fp32 cpu model, and training still lowers the loss", function()
  local name = "llama_gqa"
  local e = expected(name)
  local cpu = clrt.model.load(fixtures .. "/" .. name)
  local gpu = clrt.model.load(fixtures .. "/" .. name, { device = "cuda", matmul = "bf16" })
  local lc = cpu:logprobs(e.tokens, { lengths = e.lengths, grad = false })
  local lg = gpu:logprobs(e.tokens, { lengths = e.lengths, grad = false })
  -- bf16 keeps 8 bits of mantissa: log-probs agree to ~1e-2, not to fp32 rounding
  local fc, fg, worst = flat(lc), flat(lg), 0
  for i = 1, #fc do worst = math.max(worst, math.abs(fc[i] - fg[i])) end
  T.ok(worst < 0.1, ("bf16 log-probs within 0.1 of fp32 (worst %.3g)"):format(worst))
  T.ok(worst > 0, "bf16 matmuls are in use (results differ from fp32)")
  local lens = e.lengths:totable()
  local B, Tn = e.tokens:size(1), e.tokens:size(2)
  local count = 0
  for b = 1, B do count = count + lens[b] - 1 end
  local d = tensor.zeros({ B, Tn - 1 })
  for b = 1, B do for t = 1, lens[b] - 1 do d:set(b, t, -1 / count) end end
  local o = clrt.optim.adamw(gpu, { lr = 1e-2 })
  local first, last
  for step = 1, 8 do
    gpu:zero_grad()
    local lp = gpu:logprobs(e.tokens, { lengths = e.lengths })
    local s = 0
    for b = 1, B do for t = 1, lens[b] - 1 do s = s + lp:get(b, t) end end
    if step == 1 then first = -s / count end
    last = -s / count
    gpu:backward(d)
    o:step()
  end
  T.ok(last < first - 0.1, ("loss falls with bf16 matmuls: %.4f -> %.4f"):format(first, last))
end)

T.case("AdamW refuses moments left on the cpu when the model moved", function()
  local cfg = { architectures = { "LlamaForCausalLM" }, vocab_size = 50, hidden_size = 32,
    intermediate_size = 48, num_hidden_layers = 1, num_attention_heads = 2, num_key_value_heads = 2,
    max_position_embeddings = 64, rms_norm_eps = 1e-6, rope_theta = 10000.0 }
  local m = clrt.model.new(cfg, { seed = 1 })
  local o = clrt.optim.adamw(m)
  m:to("cuda")
  m:logprobs({ { 1, 2, 3 } })
  m:backward(tensor.full({ 1, 2 }, -0.5))
  T.raises(function() o:step() end, "create the optimizer after moving the model")
end)

T.run()
