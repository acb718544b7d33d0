-- clrt.train.value_head — PPO's value: one linear layer on the policy's final hidden state
-- (after the final norm, what the output layer reads), as TRL's AutoModelForCausalLMWithValueHead
-- that the CollabLLM authors' PPO trains. The trunk is shared with the policy: the value loss's
-- gradient flows into it through m:backward(dlogp, dhidden) (every parameter, or the LoRA
-- adapters when the policy trains adapters). Its own Adam (betas 0.9 / 0.999, eps 1e-8, no
-- weight decay: TRL's default optimizer) at the policy's learning rate.
--   local head = value_head.new(hidden_size, seed)        -- or value_head.load(path)
--   local v = head:value(hidden, b, col)                  -- hidden f32 [B, T-1, C]; col 1-based
--   head:accumulate(hidden, b, col, g, dhidden)           -- g = d loss / d v; dhidden [B, T-1, C] += g w
--   head:step(lr); head:save(path)
local ffi = require("ffi")
local tensor = require("clrt.tensor")
local M = {}
local Head = {}
Head.__index = Head

local function fresh(C)
  return { w = tensor.zeros({ C }), b = tensor.zeros({ 1 }), gw = ffi.new("double[?]", C), gb = 0,
    m_w = tensor.zeros({ C }), v_w = tensor.zeros({ C }), m_b = tensor.zeros({ 1 }), v_b = tensor.zeros({ 1 }), t = 0 }
end

-- PyTorch's nn.Linear initialisation (uniform in +-1/sqrt(C)), from the run's seed.
function M.new(C, seed)
  if type(C) ~= "number" or C < 1 then error("value_head.new: hidden size must be a positive count", 2) end
  local h = setmetatable(fresh(C), Head)
  h.C = C
  local rng = require("clrt.rng").new(seed or 0)
  local bound = 1 / math.sqrt(C)
  local w = ffi.cast("float *", h.w:data_ptr())
  for i = 0, C - 1 do w[i] = (2 * rng:random() - 1) * bound end
  ffi.cast("float *", h.b:data_ptr())[0] = (2 * rng:random() - 1) * bound
  return h
end

local function ptr(t) return ffi.cast("float *", t:data_ptr()) end

function Head:value(hidden, b, col)
  local C = self.C
  local T1 = hidden:size(2)
  local hp = ptr(hidden) + ((b - 1) * T1 + (col - 1)) * C
  local w = ptr(self.w)
  local s = ptr(self.b)[0]
  for i = 0, C - 1 do s = s + w[i] * hp[i] end
  return s
end

-- The gradient g of the loss on the value at (b, col): into the head's gradients, and g * w
-- into dhidden (the trunk's share).
function Head:accumulate(hidden, b, col, g, dhidden)
  if g == 0 then return end
  local C = self.C
  local off = ((b - 1) * hidden:size(2) + (col - 1)) * C
  local hp, dp, w = ptr(hidden) + off, ptr(dhidden) + off, ptr(self.w)
  local gw = self.gw
  for i = 0, C - 1 do
    gw[i] = gw[i] + g * hp[i]
    dp[i] = dp[i] + g * w[i]
  end
  self.gb = self.gb + g
end

-- One Adam step with the accumulated gradients, which are then zeroed.
function Head:step(lr)
  local b1, b2, eps = 0.9, 0.999, 1e-8
  self.t = self.t + 1
  local c1, c2 = 1 - b1 ^ self.t, 1 - b2 ^ self.t
  local function upd(p, m, v, i, g)
    m[i] = b1 * m[i] + (1 - b1) * g
    v[i] = b2 * v[i] + (1 - b2) * g * g
    p[i] = p[i] - lr * (m[i] / c1) / (math.sqrt(v[i] / c2) + eps)
  end
  local w, mw, vw = ptr(self.w), ptr(self.m_w), ptr(self.v_w)
  for i = 0, self.C - 1 do upd(w, mw, vw, i, self.gw[i]); self.gw[i] = 0 end
  upd(ptr(self.b), ptr(self.m_b), ptr(self.v_b), 0, self.gb)
  self.gb = 0
end

-- Weights (TRL's names: v_head.summary.weight [1, C], v_head.summary.bias [1]) and the Adam
-- state in one safetensors file.
function Head:save(path)
  local C = self.C
  require("clrt.safetensors").save(path, {
    ["v_head.summary.weight"] = self.w:reshape({ 1, C }), ["v_head.summary.bias"] = self.b,
    ["adam.exp_avg.weight"] = self.m_w, ["adam.exp_avg_sq.weight"] = self.v_w,
    ["adam.exp_avg.bias"] = self.m_b, ["adam.exp_avg_sq.bias"] = self.v_b,
  }, { adam_step = self.t, format = "pt" })
end

function M.load(path, C)
  local st = require("clrt.safetensors")
  local ok, t, meta = pcall(st.load, path, { "adam_step" })
  if not ok then error(("value_head: cannot read %s (%s)"):format(path, tostring(t)), 2) end
  local w = t["v_head.summary.weight"]
  if not w or w:numel() ~= C or not t["v_head.summary.bias"] then
    error(("value_head: %s holds no value head of hidden size %d"):format(path, C), 2)
  end
  local h = setmetatable(fresh(C), Head)
  h.C = C
  local function into(dst, name)
    local src = t[name]
    if not src or src:numel() ~= dst:numel() then error(("value_head: %s lacks %s"):format(path, name), 3) end
    local s, d = ptr(src:float():contiguous()), ptr(dst)
    for i = 0, dst:numel() - 1 do d[i] = s[i] end
  end
  into(h.w, "v_head.summary.weight"); into(h.b, "v_head.summary.bias")
  into(h.m_w, "adam.exp_avg.weight"); into(h.v_w, "adam.exp_avg_sq.weight")
  into(h.m_b, "adam.exp_avg.bias"); into(h.v_b, "adam.exp_avg_sq.bias")
  h.t = tonumber(meta.adam_step) or 0
  return h
end

return M
