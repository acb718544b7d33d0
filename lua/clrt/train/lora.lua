-- clrt.train.lora — LoRA in the recipes: `train.lora = {r, alpha, dropout, targets}` (r = 0:
-- off, full fine-tuning). The policy is the base with adapters (new, or a checkpoint's), the RL
-- reference is the same model with its adapters switched off (no second copy of the weights),
-- and a checkpoint of a LoRA run holds the adapter in PEFT's format (clrt.train.checkpoint).
--   local m = lora.policy(base_dir, ckpt_dir, cfg.train.lora, cfg.seed, adapter_dir)
--   local ref = lora.reference(m, base_dir)     -- anything with :logprobs(tokens, opts)
local config = require("clrt.config")
local M = {}

-- A recipe's `train.lora` defaults (a fresh table per call): off.
function M.config()
  return { r = 0, alpha = config.optional("number"), dropout = 0.0,
    targets = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj" }
end
M.rules = { { "train.lora.r", "count0" }, { "train.lora.alpha", "rate" }, { "train.lora.dropout", "prob" } }

function M.enabled(l) return type(l) == "table" and (l.r or 0) > 0 end

local function targets(t)
  if type(t) == "table" then return t end
  local out = {}
  for name in tostring(t):gmatch("[^,%s]+") do out[#out + 1] = name end
  return out
end

-- The model to train: with LoRA (train.lora.r > 0, or a PEFT adapter_dir to continue) the base
-- from base_dir and the checkpoint's adapter (ckpt_dir), else adapter_dir's, else fresh
-- adapters seeded by `seed`; without, the checkpoint or base_dir whole.
function M.policy(base_dir, ckpt_dir, l, seed, adapter_dir)
  if not M.enabled(l) and not adapter_dir then return clrt.model.load(ckpt_dir or base_dir) end
  local m = clrt.model.load(base_dir)
  if ckpt_dir or adapter_dir then return m:load_adapter(ckpt_dir or adapter_dir) end
  return m:add_lora({ r = l.r, alpha = l.alpha or 2 * l.r, dropout = l.dropout or 0,
    targets = targets(l.targets), seed = seed })
end

-- The RL reference: a model of its own without LoRA, else m itself with the adapters off
-- for the call.
function M.reference(m, base_dir)
  if not m.lora then return clrt.model.load(base_dir) end
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
