-- test_lora_cuda.lua — LoRA on the GPU (kernels/cuda/lora.cu) against the PyTorch fixtures of
-- tests/reference/lora_ref.py and against the CPU: log-probs, adapter gradients, adapters off,
-- dropout masks (the same lora_math.h on both devices), AdamW over the adapters, and decoding
-- with adapters (lm_head and embed_tokens included). Skips (77) without a GPU. Not run here: written for the CUDA validation.
if not clrt.cuda_available() then
  print("skipped: " .. clrt.cuda_status())
  os.exit(77)
end

local T = require("clrt.test")
local fixtures = T.source_dir() .. "/tests/fixtures"

local flat = T.floats

local function rel_err(a, e)
  local fa, fe, dn, en = flat(a), flat(e), 0, 0
  for i = 1, #fe do dn = dn + (fa[i] - fe[i]) ^ 2; en = en + fe[i] ^ 2 end
  if dn ~= dn then return math.huge end
  return math.sqrt(dn) / math.max(math.sqrt(en), 1e-30)
end

local function max_diff(a, b)
  local fa, fb, d = flat(a), flat(b), 0
  for i = 1, #fa do
    local x = math.abs(fa[i] - fb[i])
    if x ~= x then return math.huge end
    d = math.max(d, x)
  end
  return d
end

for case, base in pairs({ qwen2_all = "qwen2_tied", qwen3_some = "qwen3_qknorm",
  qwen2_head_embed = "qwen2_tied", qwen3_head_embed = "qwen3_qknorm" }) do
  T.case(case .. ": lp and adapter gradients on cuda match PyTorch; adapters off = base", function()
    local e = clrt.safetensors.load(fixtures .. "/lora/" .. case .. "/expected.safetensors")
    local m = clrt.model.load(fixtures .. "/model/" .. base, { adapter = fixtures .. "/lora/" .. case, device = "cuda" })
    local lp = m:logprobs(e.tokens, { lengths = e.lengths })
    T.ok(max_diff(lp, e.lp) < 1e-4, "lp: " .. max_diff(lp, e.lp))
    m:zero_grad()
    m:backward(e.dlogp)
    local g = m:lora_grads()
    for _, name in ipairs(m.lora_names) do
      local r = rel_err(g[name], e["grad." .. name])
      T.ok(r < 1e-3, ("%s: relative error %.3g"):format(name, r))
    end
    m:set_adapters(false)
    local off = m:logprobs(e.tokens, { lengths = e.lengths, grad = false })
    T.ok(max_diff(off, e.lp_base) < 1e-4, "adapters off = base: " .. max_diff(off, e.lp_base))
    m:set_adapters(true)
    m:merge_adapter()   -- through the host, back on the GPU
    T.eq(m:device(), "cuda")
    local merged = m:logprobs(e.tokens, { lengths = e.lengths, grad = false })
    T.ok(max_diff(merged, e.lp) < 1e-4, "merged on cuda: " .. max_diff(merged, e.lp))
  end)
end

T.case("dropout masks, AdamW over the adapters and decoding agree with the CPU", function()
  local cfg = { architectures = { "Qwen2ForCausalLM" }, vocab_size = 40, hidden_size = 24, intermediate_size = 40,
    num_hidden_layers = 2, num_attention_heads = 4, num_key_value_heads = 2, max_position_embeddings = 32,
    rms_norm_eps = 1e-6, tie_word_embeddings = true }
  local toks = { { 1, 5, 9, 3, 7, 2, 8 }, { 4, 6, 11, 30, 2, 1, 0 } }
  local function make(device)
    local m = clrt.model.new(cfg, { seed = 7 })
    m:add_lora({ r = 4, alpha = 8, dropout = 0.2, seed = 3, targets = { "q_proj", "k_proj", "v_proj", "o_proj",
      "gate_proj", "up_proj", "down_proj", "lm_head", "embed_tokens" } })
    local g = clrt.tensor.generator(9)
    for _, name in ipairs(m.lora_names) do
      local t = m:lora_params()[name]
      if name:find("lora_B") or name:find("lora_embedding_A") then
        t:copy_(clrt.tensor.randn(t:shape(), { generator = g }) * 0.2)
      end
    end
    if device == "cuda" then m:to("cuda") end
    return m, clrt.optim.adamw(m, { lr = 1e-2 })
  end
  local mc, oc = make("cpu")
  local mg, og = make("cuda")
  for step = 1, 3 do
    local a, b = mc:logprobs(toks), mg:logprobs(toks)
    T.ok(max_diff(a, b) < 1e-4, ("step %d: training lp (dropout) cpu vs cuda %.3g"):format(step, max_diff(a, b)))
    local d = clrt.tensor.full(a:shape(), -0.1)
    mc:zero_grad(); mc:backward(d); oc:step()
    mg:zero_grad(); mg:backward(d); og:step()
  end
  for name, t in pairs(mc:lora_params()) do
    T.ok(max_diff(t, mg:lora_params()[name]) < 1e-4, name .. " after 3 steps")
  end
  local dc = mc:generate({ { 1, 2, 3 } }, { max_new_tokens = 5, temperature = 0 })
  local dg = mg:generate({ { 1, 2, 3 } }, { max_new_tokens = 5, temperature = 0 })
  T.eq(dg, dc, "greedy decoding with adapters")
end)

T.run()
