-- clrt.optim — optimizers over a model's parameter arena.
--   opt = clrt.optim.adamw(m, {lr = 1e-3, betas = {0.9, 0.999}, eps = 1e-8,
--                              weight_decay = 0.01, grad_clip = 1.0,
--                              decay = function(name, shape) return #shape == 2 end})
--   local norm = opt:step{lr = 3e-4}   -- clips, updates, returns the gradient norm before clipping
--   opt:save("out/optimizer.safetensors"); opt:load("out/optimizer.safetensors")
--   sd = opt:state_dict(); opt:load_state_dict(sd)
--   opt:step_sharded{lr =}, opt:gather_state(), opt:release_gathered()   -- N data-parallel ranks on the host (ZeRO-1)
-- Weight decay is decoupled (AdamW) and by default applies to matrices only, not to norms
-- and biases. A model with LoRA adapters trains its adapters only (m:trainable_names()):
-- create the optimizer after add_lora.
local ffi = require("ffi")
local core = require("clrt.core.ffi")
local tensor = require("clrt.tensor")
local C, check, ok = core.C, core.check, core.ok

local M = {}
local AdamW = {}
AdamW.__index = AdamW

function M.adamw(model, opts)
  opts = opts or {}
  local betas = opts.betas or { 0.9, 0.999 }
  local names = model:trainable_names()
  local n = #names
  local decay = ffi.new("uint8_t[?]", math.max(n, 1))
  local params = model:trainable_params()
  for i, name in ipairs(names) do
    local d
    if opts.decay then d = opts.decay(name, params[name]:shape())
    else d = #params[name]:shape() == 2 end
    decay[i - 1] = d and 1 or 0
  end
  local o = setmetatable({
    model = model, names = names,
    ptr = ffi.gc(check(C.clrt_adamw_new(model.ptr, decay), 2), C.clrt_adamw_free),
    lr = opts.lr or 1e-3, beta1 = betas[1], beta2 = betas[2], eps = opts.eps or 1e-8,
    weight_decay = opts.weight_decay or 0.01, grad_clip = opts.grad_clip or 0,
  }, AdamW)
  return o
end

-- step{lr =} -> gradient norm before clipping
function AdamW:step(args)
  args = args or {}
  if self.ptr == nil or self.model.ptr == nil then error("adamw: step after free() of the optimizer or its model", 2) end
  local norm = ffi.new("double[1]")
  ok(C.clrt_adamw_step(self.ptr, args.lr or self.lr, self.beta1, self.beta2, self.eps,
    self.weight_decay, self.grad_clip or 0, norm), 2)
  return norm[0]
end

-- The same step over N data-parallel ranks in host memory, sharded (ZeRO-1): the summed
-- gradients reach each rank for its slice of the arena only (a reduce-scatter), the global
-- norm comes from the slices' sums of squares, each rank updates its slice of the parameters
-- and moments, and the parameters are gathered. So each rank does 1/N of the optimizer's work
-- and the ranks end with the parameters one all-reduce and a whole step on every rank gave;
-- a rank's moments outside its slice go stale (gather_state before saving them).
-- self.comm_s: seconds of the last step spent in the collectives, self.times: its phases
-- (benchmarks; self.clock, when set, is the clock they read).
function AdamW:sharded()
  return require("clrt.dist").world_size() > 1 and self.model:device() == "cpu"
end

local function arena(t)
  if t == nil then error("adamw: " .. ffi.string(C.clrt_last_error()), 3) end
  local data = ffi.cast("float *", t.storage.data)
  C.clrt_tensor_free(t)
  return data
end

function AdamW:step_sharded(args)
  args = args or {}
  if self.ptr == nil or self.model.ptr == nil then error("adamw: step after free() of the optimizer or its model", 2) end
  local dist = require("clrt.dist")
  local m = self.model
  local n = tonumber(C.clrt_adamw_numel(self.ptr))
  local G = arena(m.lora and C.clrt_model_lora_grad(m.ptr, 0) or C.clrt_model_grad(m.ptr, 0))
  local P = arena(m.lora and C.clrt_model_lora_param(m.ptr, 0) or C.clrt_model_param(m.ptr, 0))
  local ss = ffi.new("double[1]")
  local clock = self.clock or C.clrt_http_now   -- monotonic seconds
  local t0 = clock()
  ok(C.clrt_dist_reduce_scatter(G, n, ss), 2)
  local norm = math.sqrt(dist.all_reduce_numbers({ ss[0] }, "sum")[1])
  local t1 = clock()
  local lo, hi = dist.slice(n)
  ok(C.clrt_adamw_step_range(self.ptr, lo, hi, norm, args.lr or self.lr, self.beta1, self.beta2, self.eps,
    self.weight_decay, self.grad_clip or 0), 2)
  local t2 = clock()
  ok(C.clrt_dist_all_gather(P, n), 2)
  if not m.lora then C.clrt_model_params_changed(m.ptr) end
  local t3 = clock()
  self.comm_s, self.times = (t1 - t0) + (t3 - t2), { reduce_scatter = t1 - t0, update = t2 - t1, all_gather = t3 - t2 }
  return norm
end

-- After sharded steps every rank's moments hold its own slice only: this gathers them, so
-- every rank (rank 0 saving a checkpoint) holds the whole state. Collective: every rank calls
-- it; with one rank, or unsharded, it does nothing.
function AdamW:gather_state()
  if not self:sharded() or self.ptr == nil then return end
  local n = C.clrt_adamw_numel(self.ptr)
  for which = 0, 1 do ok(C.clrt_dist_all_gather(arena(C.clrt_adamw_moment(self.ptr, which, 0)), n), 2) end
end

-- The other side of gather_state: a sharded rank reads only its slice of the moments between
-- gathers, so once the whole state has been saved or loaded the rest is given back (whole
-- 2 MiB pages; they read zero). With one rank, or unsharded, it does nothing.
function AdamW:release_gathered()
  if not self:sharded() or self.ptr == nil then return end
  local lo, hi = require("clrt.dist").slice(tonumber(C.clrt_adamw_numel(self.ptr)))
  ok(C.clrt_adamw_keep_slice(self.ptr, lo, hi), 2)
end

function AdamW:free()
  if self.ptr ~= nil then
    C.clrt_adamw_free(ffi.gc(self.ptr, nil))
    self.ptr = nil
  end
end

function AdamW:memory() return tonumber(C.clrt_adamw_memory(self.ptr)) end
function AdamW:get_step() return tonumber(C.clrt_adamw_get_step(self.ptr)) end

-- {step = n, exp_avg = {name = view}, exp_avg_sq = {name = view}}: views, not copies.
function AdamW:state_dict()
  local m1, m2 = {}, {}
  for i, name in ipairs(self.names) do
    m1[name] = tensor.wrap(C.clrt_adamw_moment(self.ptr, 0, i - 1))
    m2[name] = tensor.wrap(C.clrt_adamw_moment(self.ptr, 1, i - 1))
  end
  return { step = self:get_step(), exp_avg = m1, exp_avg_sq = m2 }
end

function AdamW:load_state_dict(sd)
  if type(sd) ~= "table" or type(sd.exp_avg) ~= "table" or type(sd.exp_avg_sq) ~= "table" then
    error("load_state_dict: expected {step =, exp_avg =, exp_avg_sq =}", 2)
  end
  local mine = self:state_dict()
  for _, key in ipairs({ "exp_avg", "exp_avg_sq" }) do
    for _, name in ipairs(self.names) do
      local src = sd[key][name]
      if not src then error(("load_state_dict: %s of '%s' is missing"):format(key, name), 2) end
      local dst = mine[key][name]
      if tensor.shape_str(src) ~= tensor.shape_str(dst) then
        error(("load_state_dict: %s of '%s' has shape %s, expected %s"):format(key, name,
          tensor.shape_str(src), tensor.shape_str(dst)), 2)
      end
      dst:copy_(src)
    end
  end
  C.clrt_adamw_set_step(self.ptr, sd.step or 0)
  self:release_gathered()
end

-- optimizer.safetensors: "exp_avg.<name>" and "exp_avg_sq.<name>" plus the step in metadata.
function AdamW:save(path)
  local sd = self:state_dict()
  local names, ts, keep = {}, {}, {}
  for _, key in ipairs({ "exp_avg", "exp_avg_sq" }) do
    for _, name in ipairs(self.names) do
      names[#names + 1] = key .. "." .. name
      local t = sd[key][name]
      if t:device() == "cuda" then t = t:to("cpu") end   -- written from a host copy
      ts[#ts + 1] = t
    end
  end
  local n = #names
  local cn = ffi.new("const char *[?]", n)
  local ct = ffi.new("const clrt_tensor *[?]", n)
  for i = 1, n do
    cn[i - 1] = names[i]
    keep[i] = names[i]
    ct[i - 1] = ts[i]
  end
  local mk = ffi.new("const char *[2]", { "format", "step" })
  local stepstr = tostring(sd.step)
  local mv = ffi.new("const char *[2]", { "pt", stepstr })
  ok(C.clrt_safetensors_write(path, n, cn, ct, 2, mk, mv), 2)
  local _ = keep
  return path
end

function AdamW:load(path)
  local st = ffi.gc(check(C.clrt_safetensors_open(path), 2), C.clrt_safetensors_close)
  local sd = { exp_avg = {}, exp_avg_sq = {} }
  for _, key in ipairs({ "exp_avg", "exp_avg_sq" }) do
    for _, name in ipairs(self.names) do
      local i = C.clrt_safetensors_find(st, key .. "." .. name)
      if i < 0 then error(("%s: tensor '%s.%s' is missing"):format(path, key, name), 2) end
      sd[key][name] = tensor.wrap(C.clrt_safetensors_tensor(st, i))
    end
  end
  local step = C.clrt_safetensors_metadata(st, "step")
  if step == nil then error(path .. ": metadata 'step' is missing", 2) end
  sd.step = tonumber(ffi.string(step))
  self:load_state_dict(sd)
end

return M
