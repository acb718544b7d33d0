-- clrt.train.lora — LoRA in the recipes: `train.lora = {r, alpha, dropout, targets}` (r = 0:
-- off, full fine-tuning). The policy is the base with adapters (new, or a checkpoint's), the RL
-- reference is the same model with its adapters switched off (no second copy of the weights),
-- and a checkpoint of a LoRA run holds the adapter in PEFT's format (clrt.train.checkpoint).
--   local m = lora.policy(base_dir, ckpt_dir, cfg.train.lora, cfg.seed, adapter_dir)
--   local ref = lora.reference(m, base_dir)     -- anything with :logprobs(tokens, opts)
local config = require("clrt.config")
local model = require("clrt.model")
local M = {}

-- A recipe's `train.lora` defaults (a fresh table per call): off. `targets` may also name
-- lm_head and embed_tokens (not by default).
function M.config()
  return { r = 0,                      -- the adapters' rank (0: full fine-tuning)
    alpha = config.optional("number"),   -- the scale alpha / r (unset: 2 r)
    dropout = 0.0,                       -- dropout on the adapters' input while training
    targets = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj" }   -- the projections that get adapters
end
M.rules = { { "train.lora.r", "count0" }, { "train.lora.alpha", "rate" }, { "train.lora.dropout", "prob" } }

function M.enabled(l) return type(l) == "table" and (l.r or 0) > 0 end

local function targets(t)
  if type(t) == "table" then return t end
  local out = {}
  for name in tostring(t):gmatch("[^,%s]+") do out[#out + 1] = name end
  return out
end

-- `train.base_dtype`: "f32", or "bf16" (LoRA only): the frozen base's linear weights kept only
-- in bf16, shared by the policy and the RL/DPO reference (model:set_base_dtype). A full
-- fine-tune trains every weight and needs them in f32: refused, not quietly changed.
function M.check_base_dtype(dtype, l, adapter_dir, who)
  dtype = dtype or "f32"
  if dtype ~= "f32" and dtype ~= "bf16" then
    error(("%s: train.base_dtype must be f32 or bf16, got '%s'"):format(who, tostring(dtype)), 0)
  end
  if dtype == "bf16" and not M.enabled(l) and not adapter_dir then
    error(("%s: train.base_dtype=bf16 needs train.lora.r > 0 (a frozen base); a full fine-tune trains every weight in f32"):format(who), 0)
  end
  return dtype
end

-- `train.precision`: "f32", or "bf16": bf16 mixed precision as PyTorch's autocast(bfloat16)
-- runs it (model:set_matmul("bf16")): the blocks' linear products, forward and backward, take
-- bf16 inputs and weight copies with f32 sums, on the CPU's matrix unit (AMX, else
-- AVX512-BF16; docs/runtime.md) or cuBLAS; master weights, AdamW, the loss and the norms stay
-- f32. Full fine-tune and LoRA (over an f32 base; a bf16 base, train.base_dtype=bf16, already
-- multiplies in bf16). Applied to m (a model, or the RL reference's table: a no-op) after
-- any move to its device.
function M.set_precision(m, precision, who)
  precision = precision or "f32"
  if precision ~= "f32" and precision ~= "bf16" then
    error(("%s: train.precision must be f32 or bf16, got '%s'"):format(who, tostring(precision)), 0)
  end
  if precision == "bf16" and type(m.set_matmul) == "function" and m:base_dtype() ~= "bf16" then
    -- never f32 under a bf16 name: without a unit that computes bf16 sums (no AVX2 FMA, or
    -- CLRT_CPU=portable / CLRT_MATRIX_UNIT=f32) the run refuses to start
    if m:device() == "cpu" and model.matrix_unit() == "f32" then
      error(("%s: train.precision=bf16 needs bf16 products, and this CPU (CLRT_CPU=%s, CLRT_MATRIX_UNIT=%s) "
        .. "has none: no AVX2 FMA, AVX512-BF16 or AMX; use train.precision=f32"):format(who,
        os.getenv("CLRT_CPU") or "unset", os.getenv("CLRT_MATRIX_UNIT") or "unset"), 0)
    end
    m:set_matmul("bf16")
  end
  return m
end

-- The model to train: with LoRA (train.lora.r > 0, or a PEFT adapter_dir to continue) the base
-- from base_dir and the checkpoint's adapter (ckpt_dir), else adapter_dir's, else fresh
-- adapters seeded by `seed`, the base then in base_dtype; without, the checkpoint or base_dir
-- whole.
function M.policy(base_dir, ckpt_dir, l, seed, adapter_dir, base_dtype)
  base_dtype = M.check_base_dtype(base_dtype, l, adapter_dir, "train.lora")
  if not M.enabled(l) and not adapter_dir then return model.load(ckpt_dir or base_dir) end
  if base_dtype == "bf16" then   -- converted as it is read: no whole f32 copy of the base
    local adapter = ckpt_dir or adapter_dir
    return model.load(base_dir, { base_dtype = "bf16", adapter = adapter, lora = not adapter and
      { r = l.r, alpha = l.alpha or 2 * l.r, dropout = l.dropout or 0, targets = targets(l.targets), seed = seed } or nil })
  end
  local m = model.load(base_dir)
  if ckpt_dir or adapter_dir then m:load_adapter(ckpt_dir or adapter_dir)
  else
    m:add_lora({ r = l.r, alpha = l.alpha or 2 * l.r, dropout = l.dropout or 0,
      targets = targets(l.targets), seed = seed })
  end
  return m:set_base_dtype(base_dtype)
end

-- The RL reference: a model of its own without LoRA, else m itself with the adapters off
-- for the call.
function M.reference(m, base_dir)
  if not m.lora then return model.load(base_dir) end
  return {
    logprobs = function(_, tokens, opts)
      m:set_adapters(false)
      local ok, lp = pcall(m.logprobs, m, tokens, opts)
      m:set_adapters(true)
      if not ok then error(lp, 0) end
      return lp
    end,
  }
end

return M
