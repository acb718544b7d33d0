-- train.precision=bf16 (m:set_matmul("bf16")) on the CPU: every product of the blocks' linear
-- layers, forward and both backward products, runs bf16 x bf16 -> f32 on the matrix unit
-- (AMX tiles, else AVX512-BF16); master weights, AdamW, loss and norms stay f32, as under
-- PyTorch's autocast(bfloat16). Checked on every unit this CPU has (a unit it lacks is
-- skipped with a line saying so), against the f32 path:
--   * log-probs within 4u and every weight gradient within 8u relative (2-norm), u = 2^-9
--     (bf16's rounding). Each product term carries <= 2u relative error (both inputs rounded)
--     with random signs, so an output errs by ~u of its size; dw's terms also carry dy's
--     rounding. Measured here ~0.5-1.5u on log-probs and ~1-3u on gradients; a wrong panel,
--     pair order or transposition is off by O(1) and fails by far, and bit-equality with the
--     f32 path (bf16 never used) fails the "differs" checks;
--   * no repacking per step: after optimizer steps the copies the optimizer refreshed in place
--     give log-probs bit-equal to freshly made copies (bf16 panels and the packed f32 copy);
--   * five AdamW steps in bf16 follow the f32 run's losses within 1%;
--   * LoRA over an f32 base in bf16: adapter gradients within 8u;
--   * AMX and AVX512-BF16 agree to f32 rounding; capped to f32 (no unit) the products are f32.
local T = require("clrt.test")

local U = 2 ^ -9
-- hidden 128, intermediate 320 (6 x 48 + 32: a narrower last panel), head_dim 32 (AMX's k)
local CFG = { architectures = { "Qwen2ForCausalLM" }, vocab_size = 96, hidden_size = 128, intermediate_size = 320,
  num_hidden_layers = 2, num_attention_heads = 4, num_key_value_heads = 2, max_position_embeddings = 64,
  rms_norm_eps = 1e-6, tie_word_embeddings = true }

local flat = T.floats
local function max_diff(a, b)
  local fa, fb, d = flat(a), flat(b), 0
  for i = 1, #fa do d = math.max(d, math.abs(fa[i] - fb[i])) end
  return d
end
local function rel_err(a, e)
  local fa, fe, dn, en = flat(a), flat(e), 0, 0
  for i = 1, #fe do dn = dn + (fa[i] - fe[i]) ^ 2; en = en + fe[i] ^ 2 end
  return math.sqrt(dn) / math.sqrt(en), en
end

local toks = {}
for b = 1, 3 do
  toks[b] = {}
  for t = 1, 24 do toks[b][t] = (b * 37 + t * 11) % CFG.vocab_size end
end
local dlogp = clrt.tensor.full({ 3, 23 }, -1 / 69)

local function model(bf16, lora)
  local m = clrt.model.new(CFG, { seed = 7, max_batch = 3, max_seq = 24 })
  if lora then
    m:add_lora({ r = 4, alpha = 8, seed = 3 })
    local g = clrt.tensor.generator(5)
    for _, name in ipairs(m.lora_names) do
      local t = m:lora_params()[name]
      if name:find("lora_B") then t:copy_((clrt.tensor.rand(t:shape(), { generator = g }) - 0.5) * 0.1) end
    end
  end
  if bf16 then m:set_matmul("bf16") end
  return m
end

local function run(m, lora)
  local lp = m:logprobs(toks)
  m:zero_grad()
  m:backward(dlogp)
  local g, src = {}, lora and m:lora_grads() or m:grads()
  for name, t in pairs(src) do g[name] = t:clone() end
  return lp, g
end

local function compare(lp, g, ref_lp, ref_g, g_tol, what)
  local d = max_diff(lp, ref_lp)
  T.ok(d <= 4 * U, ("%s: log-probs differ by %.3g > 4u"):format(what, d))
  local worst, wname, n = 0, "", 0
  for name, e in pairs(ref_g) do
    local r, en = rel_err(g[name], e)
    if en > 0 then
      n = n + 1
      if r > worst then worst, wname = r, name end
    end
  end
  T.ok(n > 0, what .. ": no non-zero gradient to compare (the test could not fail)")
  T.ok(worst <= g_tol, ("%s: gradient %s off by %.3g relative > %.3g"):format(what, wname, worst, g_tol))
  T.ok(d > 0 and worst > 0, what .. ": bit-equal to f32: the bf16 products were not used")
  io.stderr:write(("  %s: max |dlogp| %.3g (%.2fu), worst gradient %.3g (%.2fu) in %s\n"):format(what, d, d / U,
    worst, worst / U, wname))
end

local active, best = clrt.model.matrix_unit()
io.stderr:write(("matrix unit: %s (best here: %s)\n"):format(active, best))
local units = {}
-- fma-bf16: bf16 sums on AVX2's FMAs (every x86 level from avx2 up can run it)
if best ~= "f32" then units[#units + 1] = "fma-bf16" end
if best == "avx512-bf16" or best == "amx-bf16" then units[#units + 1] = "avx512-bf16" end
if best == "amx-bf16" then units[#units + 1] = "amx-bf16" end
if #units == 0 then
  print("SKIP: no unit computes bf16 products here (no AVX2 FMA, AVX512-BF16 or AMX, or CLRT_CPU=portable)")
  os.exit(77)
end
if best ~= "amx-bf16" then
  io.stderr:write("SKIP amx-bf16: this CPU has no AMX-BF16 (or Linux did not grant the tile data); " ..
    "the AMX rows are checked only where it has (test_gemm_bf16 checks the kernel)\n")
end

local ref_lp, ref_g = run(model(false))
local lora_lp, lora_g = run(model(false, true), true)
local by_unit = {}

for _, unit in ipairs(units) do
  clrt.model.matrix_unit(unit)
  T.case(unit .. ": full fine-tune products in bf16 vs f32: log-probs within 4u, gradients within 8u", function()
    local m = model(true)
    local lp, g = run(m)
    by_unit[unit] = lp
    compare(lp, g, ref_lp, ref_g, 8 * U, unit .. " full")
    -- a second micro-batch accumulates onto the gradients (dW +=), as gradient accumulation needs
    m:logprobs(toks)
    m:backward(dlogp)
    local worst = 0
    for name, t in pairs(m:grads()) do
      local twice = flat(g[name])
      for i = 1, #twice do twice[i] = 2 * twice[i] end
      local got, dn, en = flat(t), 0, 0
      for i = 1, #twice do dn = dn + (got[i] - twice[i]) ^ 2; en = en + twice[i] ^ 2 end
      if en > 0 then worst = math.max(worst, math.sqrt(dn / en)) end
    end
    T.ok(worst <= 1e-6, ("two backwards give twice one backward's gradients: off by %.3g"):format(worst))
  end)

  T.case(unit .. ": LoRA over an f32 base in bf16: adapter gradients within 8u", function()
    local lp, g = run(model(true, true), true)
    compare(lp, g, lora_lp, lora_g, 8 * U, unit .. " LoRA")
  end)

  T.case(unit .. ": optimizer steps keep the bf16 copies current in place (bit-equal to fresh copies)", function()
    local m = model(true)
    local opt = clrt.optim.adamw(m, { lr = 1e-2 })
    local before = m:logprobs(toks)
    local packs = m:copy_repacks()
    T.eq(packs, 1, "one whole pack: the copies' first")
    for _ = 1, 3 do
      run(m)
      opt:step()
    end
    local kept = m:logprobs(toks)
    T.eq(m:copy_repacks(), packs, "no whole repack after the steps")
    T.ok(max_diff(kept, before) > 1e-3, "the steps changed the weights")
    m:set_matmul("f32")
    m:set_matmul("bf16")   -- copies made afresh from the master weights
    T.eq(max_diff(m:logprobs(toks), kept), 0, "log-probs over refreshed copies = over fresh ones, bit for bit")
  end)

  T.case(unit .. ": five AdamW steps in bf16 follow the f32 run's losses within 1%", function()
    local function losses(bf16)
      local m = model(bf16)
      local opt = clrt.optim.adamw(m, { lr = 3e-3 })
      local out = {}
      for i = 1, 5 do
        local lp = run(m)
        local s = 0
        for _, v in ipairs(flat(lp)) do s = s - v end
        out[i] = s / 69
        opt:step()
      end
      return out
    end
    local a, b = losses(true), losses(false)
    T.ok(b[5] < b[1] - 1e-3, "the f32 run learns: " .. b[1] .. " -> " .. b[5])
    for i = 1, 5 do
      T.ok(math.abs(a[i] - b[i]) <= 0.01 * math.abs(b[i]), ("step %d: bf16 loss %.6g vs f32 %.6g"):format(i, a[i], b[i]))
    end
  end)
end

if by_unit["avx512-bf16"] then
  -- fma-bf16 sums each pair as vdpbf16ps does (odd element, then even, each rounded): the same
  -- bits while no input or sum is denormal (vdpbf16ps flushes those), as none are here
  T.case("fma-bf16 (AVX2) and AVX512-BF16 give the same log-prob bits", function()
    T.eq(max_diff(by_unit["fma-bf16"], by_unit["avx512-bf16"]), 0)
  end)
end

if by_unit["amx-bf16"] then
  T.case("AMX and AVX512-BF16 agree to f32 rounding", function()
    local d = max_diff(by_unit["amx-bf16"], by_unit["avx512-bf16"])
    T.ok(d <= 1e-5, ("AMX vs AVX512-BF16 log-probs differ by %.3g"):format(d))
  end)
end

T.case("f32 training: optimizer steps keep the packed f32 copy current in place (bit-equal to a fresh one)", function()
  local m = model(false)
  local opt = clrt.optim.adamw(m, { lr = 1e-2 })
  for _ = 1, 2 do
    run(m)
    opt:step()
  end
  local kept = m:logprobs(toks)
  T.eq(m:copy_repacks(), 1, "packed once, then refreshed in place by the steps")
  m:set_decode_pack(false)
  m:set_decode_pack(true)   -- the next forward packs afresh
  T.eq(max_diff(m:logprobs(toks), kept), 0, "log-probs over the refreshed packed copy = over a fresh one")
end)

-- PyTorch's autocast(bfloat16) over the same projections (tests/reference/autocast_ref.py):
-- it also rounds each product's output to bf16 where clrt keeps the f32 sum, so the two
-- differ by about one more rounding: asserted as against f32 (4u, 8u); measured ~1u, ~3u.
T.case("against PyTorch's autocast(bfloat16) over the blocks' projections: log-probs within 4u, gradients 8u", function()
  local py = os.getenv("CLRT_PYTHON") or "/usr/bin/python3"
  local h = io.popen(py .. " -c 'import torch' 2>&1; echo rc=$?")
  local probe = h:read("*a")
  h:close()
  if not probe:find("rc=0", 1, true) then
    io.stderr:write("  SKIP: no PyTorch at " .. py .. " (" .. probe:gsub("%s+$", "") .. ")\n")
    return
  end
  clrt.model.matrix_unit(units[#units])
  local dir = T.tmpdir()
  local m = model(false)
  m:save(dir .. "/model")
  local f = io.open(dir .. "/tokens.json", "w")
  f:write(require("cjson").encode(toks))
  f:close()
  local src = os.getenv("CLRT_SOURCE_DIR") or "."
  local sh = require("clrt.util.shell").quote
  local rc = os.execute(("%s %s %s %s %s"):format(py, sh(src .. "/tests/reference/autocast_ref.py"), sh(dir .. "/model"),
    sh(dir .. "/tokens.json"), sh(dir .. "/ref.safetensors")))
  T.ok(rc == 0 or rc == true, "autocast_ref.py ran")
  local ref = clrt.safetensors.load(dir .. "/ref.safetensors")
  local lp, g = run(model(true))
  local tg = {}
  for name, t in pairs(ref) do if name ~= "logprobs" then tg[name] = t end end
  if best == "fma-bf16" then
    -- Without bf16 hardware torch's autocast runs its own emulation, which on this AVX2 CPU
    -- lies 13u from the f32 path at a norm weight's gradient (clrt's f32 path and its fma-bf16
    -- one alike), past the "one more rounding" this case assumes; the log-probs still agree.
    local d = max_diff(lp, ref.logprobs)
    T.ok(d > 0 and d <= 4 * U, ("fma-bf16 vs torch autocast: log-probs differ by %.3g (within 4u, not bit-equal)"):format(d))
    io.stderr:write("  SKIP gradients against torch: this CPU has no AVX512-BF16/AMX, so torch's autocast is not the " ..
      "native bf16 product the 8u bound assumes (checked where the CPU has one)\n")
  else
    compare(lp, g, ref.logprobs, tg, 8 * U, units[#units] .. " vs torch autocast")
  end
  -- torch's autocast does differ from the f32 path (so the comparison can fail)
  T.ok(max_diff(ref_lp, ref.logprobs) > 0, "torch's autocast differs from the f32 path")
end)

T.case("train.precision: set_precision turns bf16 on (full and LoRA), refuses other values", function()
  local lora = require("clrt.train.lora")
  local m = lora.set_precision(model(false), "bf16", "test")
  T.ok(max_diff(m:logprobs(toks), ref_lp) > 0, "precision=bf16 changed the products")
  T.eq(max_diff(lora.set_precision(model(false), "f32", "test"):logprobs(toks), ref_lp), 0, "precision=f32: the f32 path")
  T.eq(max_diff(lora.set_precision(model(false), nil, "test"):logprobs(toks), ref_lp), 0, "default: f32")
  T.raises(function() lora.set_precision(model(false), "fp8", "collabllm_rl") end,
    "collabllm_rl: train.precision must be f32 or bf16, got 'fp8'")
  local ref = lora.reference(model(false, true), "unused")
  T.eq(lora.set_precision(ref, "bf16", "test"), ref, "the RL reference's table (the policy's adapters off) is left as is")
end)

T.case("capped to f32 (no matrix unit): bf16 mode multiplies in f32, train.precision=bf16 refuses", function()
  clrt.model.matrix_unit("f32")
  T.raises(function() require("clrt.train.lora").set_precision(model(false), "bf16", "collabllm_rl") end,
    "collabllm_rl: train.precision=bf16 needs bf16 products")
  local lp, g = run(model(true))
  T.ok(max_diff(lp, ref_lp) <= 1e-5, "log-probs within f32 rounding of the f32 model")
  local worst = 0
  for name, e in pairs(ref_g) do worst = math.max(worst, (rel_err(g[name], e))) end
  T.ok(worst <= 1e-4, "gradients within f32 rounding: " .. worst)
  T.raises(function() clrt.model.matrix_unit("tpu") end, "matrix unit 'tpu'")
  clrt.model.matrix_unit(best)
end)

T.run()
