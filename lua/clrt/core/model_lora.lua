-- clrt.core.model_lora — LoRA adapters for clrt.model, in PEFT's format: methods that
-- lua/clrt/model.lua takes into its Model class (M.methods).
--   m:add_lora{r = 8, alpha = 16, dropout = 0.05, targets = {"q_proj", ...}, seed = 0}
--   m:set_adapters(false)          -- run the bare base (the RL reference), true: back on
--   m:lora_params(), m:lora_grads() -- PEFT name -> tensor view (the optimizer's parameters)
--   m:save_adapter(dir, {base = "path or hub id"})   -- adapter_config.json + adapter_model.safetensors
--   m:load_adapter(dir)            -- adds the adapters a PEFT folder describes, with its weights
--   m:merge_adapter()              -- W += alpha/r B A into the base, adapters removed
-- Targets: the blocks' seven linear layers (the default), and on request "lm_head" (beside the
-- output layer, inside its fused log-softmax) and "embed_tokens" (PEFT's Embedding adapter:
-- lora_embedding_A [r, vocab], lora_embedding_B [hidden, r], no dropout). A merge of either
-- into a tied model unties it (lm_head.weight of its own, tie_word_embeddings = false).
-- With adapters the base is frozen: m:grads() fails, optimizers walk the adapters only.
-- Phi-3 (fused qkv_proj, gate_up_proj) takes those names, one adapter beside each fused layer.
local ffi = require("ffi")
local core = require("clrt.core.ffi")
local tensor = require("clrt.tensor")
local files = require("clrt.files")
local json = require("clrt.json")
local st = require("clrt.safetensors")
local C, ok = core.C, core.ok

local M = {}

-- Bit order of clrt_model_lora_add's targets.
M.TARGETS = { "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head", "embed_tokens" }
M.DEFAULT_TARGETS = { "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj" }
local bit_of = {}
for i, n in ipairs(M.TARGETS) do bit_of[n] = i - 1 end

-- Phi-3 (a fused model) has qkv_proj and gate_up_proj in place of their parts, one adapter
-- each as PEFT puts it; naming all the parts (the recipes' default list) means the fused layer.
local FUSED = { qkv_proj = { "q_proj", "k_proj", "v_proj" }, gate_up_proj = { "gate_proj", "up_proj" } }
local FUSED_ORDER = { "qkv_proj", "gate_up_proj" }

local function target_bits(targets, who, fused)
  if type(targets) ~= "table" or #targets == 0 then error(who .. ": targets must be a non-empty list of module names", 3) end
  local bits, seen = 0, {}
  local function add(n)
    if not seen[n] then bits = bits + 2 ^ bit_of[n]; seen[n] = true end
  end
  for _, n in ipairs(targets) do
    if FUSED[n] then
      if not fused then
        error(("%s: target '%s' is a fused layer of Phi-3; this model has its parts (%s)"):format(who, n,
          table.concat(FUSED[n], ", ")), 3)
      end
      for _, part in ipairs(FUSED[n]) do add(part) end
    elseif not bit_of[n] then
      local names = table.concat(M.TARGETS, ", ") .. (fused and ", qkv_proj, gate_up_proj" or "")
      error(("%s: unknown target '%s' (%s)"):format(who, tostring(n), names), 3)
    else
      add(n)
    end
  end
  return bits
end

local function target_list(bits, fused)
  local out, has = {}, {}
  for i, n in ipairs(M.TARGETS) do
    if math.floor(bits / 2 ^ (i - 1)) % 2 == 1 then has[n] = true end
  end
  for _, n in ipairs(M.TARGETS) do
    local group
    if fused then
      for _, f in ipairs(FUSED_ORDER) do
        if FUSED[f][1] == n then group = f end
      end
    end
    if group and has[n] then out[#out + 1] = group
    elseif has[n] and not (fused and (n == "k_proj" or n == "v_proj" or n == "up_proj")) then out[#out + 1] = n end
  end
  return out
end

-- PEFT saves the embedding's and the output layer's base weights beside their adapters when
-- they are targets (save_embedding_layers="auto"): accepted when they are the base's own (a
-- tied head reads the embedding), refused when training or resizing changed them.
local BASE_COPIES = { ["base_model.model.model.embed_tokens.base_layer.weight"] = "model.embed_tokens.weight",
  ["base_model.model.lm_head.base_layer.weight"] = "lm_head.weight" }

local function check_base_copy(m, wpath, name, t)
  local params = m:params()
  local base = params[BASE_COPIES[name]] or params["model.embed_tokens.weight"]
  if base:device() ~= "cpu" then base = base:to("cpu") end
  if tensor.shape_str(t) ~= tensor.shape_str(base) then
    error(("%s: '%s' has shape %s but the base's is %s (a resized vocabulary is not supported)"):format(
      wpath, name, tensor.shape_str(t), tensor.shape_str(base)), 3)
  end
  local d = (t:to("f32") - base):abs():max()
  if d > 0 then
    error(("%s: '%s' differs from the base's weights (by up to %g): clrt loads adapters over an unchanged base"):format(
      wpath, name, d), 3)
  end
end

-- The LoRA methods of clrt.model's Model class (lua/clrt/model.lua takes them).
local Model = {}
M.methods = Model
do
  local function live(m)
    if m.ptr == nil then error("model: used after free()", 3) end
    return m.ptr
  end

  function Model:add_lora(o)
    o = o or {}
    if type(o) ~= "table" then error("add_lora: expects {r =, alpha =, dropout =, targets =}", 2) end
    local r = o.r or 8
    if type(r) ~= "number" or r ~= math.floor(r) or r < 1 then error("add_lora: r must be a positive integer, got " .. tostring(r), 2) end
    local alpha = o.alpha or 2 * r
    if type(alpha) ~= "number" or alpha <= 0 then error("add_lora: alpha must be a positive number, got " .. tostring(alpha), 2) end
    local dropout = o.dropout or 0
    if type(dropout) ~= "number" or dropout < 0 or dropout >= 1 then error("add_lora: dropout must be in [0, 1), got " .. tostring(dropout), 2) end
    local fused = self._c and self._c.fused_qkv_gate_up
    local bits = target_bits(o.targets or M.DEFAULT_TARGETS, "add_lora", fused)
    ok(C.clrt_model_lora_add(live(self), r, alpha, dropout, bits, o.seed or 0), 2)
    self.lora = { r = r, alpha = alpha, dropout = dropout, targets = target_list(bits, fused) }
    self.lora_names = {}
    for i = 0, C.clrt_model_lora_num_tensors(self.ptr) - 1 do
      self.lora_names[i + 1] = ffi.string(C.clrt_model_lora_tensor_name(self.ptr, i))
    end
    self._grads, self._lora_params, self._lora_grads = nil, nil, nil
    return self
  end

  local function views(m, fn, key)
    if not m.lora then error("model: it has no LoRA adapters (add_lora first)", 3) end
    if not m[key] then
      local t = {}
      for i, name in ipairs(m.lora_names) do t[name] = tensor.wrap(fn(live(m), i - 1)) end
      m[key] = t
    end
    return m[key]
  end
  function Model:lora_params() return views(self, C.clrt_model_lora_param, "_lora_params") end
  function Model:lora_grads() return views(self, C.clrt_model_lora_grad, "_lora_grads") end

  -- What an optimizer walks: the adapters when there are some, else every parameter.
  function Model:trainable_names() return self.lora and self.lora_names or self.names end
  function Model:trainable_params() return self.lora and self:lora_params() or self:params() end

  function Model:set_adapters(on)
    if type(on) ~= "boolean" then error("set_adapters: expects true or false", 2) end
    ok(C.clrt_model_lora_enable(live(self), on and 1 or 0), 2)
    return self
  end
  function Model:adapters_enabled() return C.clrt_model_lora_enabled(live(self)) == 1 end

  -- The dropout masks are a function of the adapters' seed and a count of training forwards
  -- (both saved with the adapter, so that a resumed run draws the same masks).
  function Model:lora_dropout_step() return tonumber(C.clrt_model_lora_dropout_state(live(self), 1)) end
  function Model:lora_dropout_seed() return tonumber(C.clrt_model_lora_dropout_state(live(self), 0)) end
  function Model:set_lora_dropout_step(n, seed)
    ok(C.clrt_model_lora_set_dropout_state(live(self), seed or self:lora_dropout_seed(), n), 2)
  end

  -- PEFT's adapter_config.json fields for these adapters.
  function Model:adapter_config(base)
    if not self.lora then error("adapter_config: the model has no LoRA adapters", 2) end
    local L = self.lora
    return json.object({
      peft_type = "LORA", task_type = "CAUSAL_LM", base_model_name_or_path = base or json.null,
      r = L.r, lora_alpha = L.alpha, lora_dropout = L.dropout, target_modules = json.array(L.targets),
      bias = "none", fan_in_fan_out = false, inference_mode = true, use_rslora = false, use_dora = false,
      modules_to_save = json.null, init_lora_weights = true, layers_to_transform = json.null,
      layers_pattern = json.null, rank_pattern = json.object({}), alpha_pattern = json.object({}),
      revision = json.null,
    })
  end

  function Model:save_adapter(dir, opts)
    opts = opts or {}
    if not self.lora then error("save_adapter: the model has no LoRA adapters", 2) end
    files.mkdir_p(dir)
    local ts = {}
    for name, t in pairs(self:lora_params()) do ts[name] = t:device() == "cuda" and t:to("cpu") or t end
    st.save(dir .. "/adapter_model.safetensors", ts,
      { format = "pt", clrt_dropout_step = tostring(self:lora_dropout_step()),
        clrt_dropout_seed = tostring(self:lora_dropout_seed()) })
    files.write_atomic(dir .. "/adapter_config.json",
      json.encode(self:adapter_config(opts.base), { pretty = true }) .. "\n")
    return dir
  end

  -- Reads a PEFT LoRA folder: adds its adapters (checked against what clrt runs) and loads them.
  function Model:load_adapter(dir, opts)
    local cpath = dir .. "/adapter_config.json"
    local text = files.read(cpath)
    if not text then error(("load_adapter: no adapter_config.json in %s"):format(dir), 2) end
    local okj, cfg = pcall(json.decode, text, cpath)
    if not okj or type(cfg) ~= "table" then error(("%s: not a JSON object: %s"):format(cpath, tostring(cfg)), 2) end
    local function bad(k, msg) error(("%s: '%s' %s"):format(cpath, k, msg), 3) end
    if cfg.peft_type ~= "LORA" then bad("peft_type", "must be \"LORA\", got " .. tostring(cfg.peft_type)) end
    if type(cfg.r) ~= "number" then bad("r", "must be a number") end
    if type(cfg.lora_alpha) ~= "number" then bad("lora_alpha", "must be a number") end
    if cfg.bias ~= nil and cfg.bias ~= "none" then bad("bias", "must be \"none\" (adapter biases are not supported)") end
    if cfg.fan_in_fan_out == true then bad("fan_in_fan_out", "must be false") end
    if cfg.use_rslora == true then bad("use_rslora", "is true; only alpha/r scaling is supported") end
    if cfg.use_dora == true then bad("use_dora", "is true; DoRA is not supported") end
    if type(cfg.modules_to_save) == "table" and #cfg.modules_to_save > 0 then bad("modules_to_save", "is not supported") end
    for _, k in ipairs({ "rank_pattern", "alpha_pattern" }) do
      if type(cfg[k]) == "table" and next(cfg[k]) ~= nil then bad(k, "is not supported (one r and alpha for all)") end
    end
    local targets = cfg.target_modules
    if type(targets) == "string" then bad("target_modules", "as a regular expression is not supported; list the module names") end
    local dropout = type(cfg.lora_dropout) == "number" and cfg.lora_dropout or 0
    self:add_lora({ r = cfg.r, alpha = cfg.lora_alpha, dropout = dropout, targets = targets, seed = opts and opts.seed })
    local wpath = dir .. "/adapter_model.safetensors"
    if not files.exists(wpath) then error(("load_adapter: no adapter_model.safetensors in %s"):format(dir), 2) end
    local ts, meta = st.load(wpath, { "clrt_dropout_step", "clrt_dropout_seed" })
    local mine = self:lora_params()
    for name, t in pairs(ts) do
      if BASE_COPIES[name] then
        check_base_copy(self, wpath, name, t)
        ts[name] = nil
      elseif not mine[name] then
        error(("%s: tensor '%s' is not an adapter of this model and its targets"):format(wpath, name), 2)
      end
    end
    for _, name in ipairs(self.lora_names) do
      local src = ts[name]
      if not src then error(("%s: tensor '%s' is missing"):format(wpath, name), 2) end
      if tensor.shape_str(src) ~= tensor.shape_str(mine[name]) then
        error(("%s: '%s' has shape %s, expected %s"):format(wpath, name, tensor.shape_str(src), tensor.shape_str(mine[name])), 2)
      end
      mine[name]:copy_(src)
    end
    if meta.clrt_dropout_step then
      self:set_lora_dropout_step(tonumber(meta.clrt_dropout_step), tonumber(meta.clrt_dropout_seed))
    end
    return self
  end

  function Model:merge_adapter()
    local dev = self:device()   -- the merge runs on the host
    if dev ~= "cpu" then self:to("cpu") end
    ok(C.clrt_model_lora_merge(live(self)), 2)
    if dev ~= "cpu" then self:to(dev) end
    -- an adapter on the output layer or the embedding of a tied model untied it
    local names = {}
    for i = 0, C.clrt_model_num_tensors(self.ptr) - 1 do names[i + 1] = ffi.string(C.clrt_model_tensor_name(self.ptr, i)) end
    if #names ~= #self.names then
      self.names = names
      self.config.tie_word_embeddings = false
      self._c.tie_word_embeddings = false
      self._params = nil
    end
    self.lora, self.lora_names, self._lora_params, self._lora_grads, self._grads = nil, nil, nil, nil, nil
    return self
  end
end

return M
