-- clrt.model — the Llama-family transformer (Llama 2/3, Qwen2, Qwen3, Mistral, Phi-3) and Gemma 3
-- over C arenas.
--   m = clrt.model.load("path/to/hf_dir")          -- config.json + model.safetensors (or shards)
--   m = clrt.model.new(cfg_table, {seed = 1})      -- random init from config.json's keys
--   lp = m:logprobs(tokens, {lengths = {...}})     -- f32 [B, T-1]: log p(tok[t+1] | tok[..t])
--   m:backward(dlogp)                              -- accumulate gradients (dlogp shaped like lp)
--   m:params(), m:grads()                          -- Hugging Face name -> tensor view (no copies)
--   m:save(dir), m:memory(), m:num_params(), m:zero_grad(), m.config
--   m:set_matmul("bf16"|"f32"), m:set_decode_pack(bool)  -- how decode steps read the weights
--   m:set_quant("int8"|"none")                     -- generation from int8 weights (docs/quantization.md)
--   m:set_batch_invariant(bool)    -- a row's logits independent of the rows beside it
--   m:set_share_prefix(bool)       -- rows with one context run it once in logprobs (default on)
--   m:generate({ids, ...}, {max_new_tokens =, ...}), m:chat([tok,] "text")  -- decoding, a chat reply
--                                                  -- (clrt.gen.model_methods puts them in)
--   m:add_lora{...}, m:set_adapters(bool), m:save_adapter(dir), load(dir, {adapter = DIR})
--                                                  -- LoRA (lua/clrt/core/model_lora.lua)
-- config.json is parsed and checked here (its RoPE keys by clrt.model_rope); C gets a plain
-- clrt_model_config. load keeps the folder's generation_config.json as m.generation_config
-- (clrt.generation_config: the stop ids and sampling defaults m:generate applies).
local ffi = require("ffi")
local core = require("clrt.core.ffi")
local tensor = require("clrt.tensor")
local json = require("clrt.json")
local files = require("clrt.files")
local model_rope = require("clrt.model_rope")
local C, check, ok = core.C, core.check, core.ok


local M = {}
local Model = {}
Model.__index = Model
M.Model = Model

local read_file = files.read

-- What holds memory for a model beside its arenas (generation's KV cache and prefix cache)
-- adds a function(m) here, called before the model frees or moves its arenas: the model
-- knows nothing of those layers above it.
M.on_release = {}
local function release_held(m)
  for _, f in ipairs(M.on_release) do f(m) end
end

-- json.null, or lua-cjson's null (a NULL light userdata) in a config a caller decoded itself
local function is_null(v)
  return v == nil or v == json.null or (type(v) == "userdata" and tostring(v) == "userdata: NULL")
end

-- ---- config.json --------------------------------------------------------------------------

local supported = {
  LlamaForCausalLM = "llama", Qwen2ForCausalLM = "qwen2", Qwen3ForCausalLM = "qwen3",
  Gemma3ForCausalLM = "gemma3",
}
local by_model_type = { llama = "llama", qwen2 = "qwen2", qwen3 = "qwen3", gemma3_text = "gemma3" }
local arch_names = { llama = "LlamaForCausalLM", qwen2 = "Qwen2ForCausalLM", qwen3 = "Qwen3ForCausalLM",
  gemma3 = "Gemma3ForCausalLM" }
local model_types = { gemma3 = "gemma3_text" }

-- ---- Mistral and Phi-3: Llama's layers with a sliding window; Phi-3's fused projections ----
supported.MistralForCausalLM, by_model_type.mistral, arch_names.mistral = "mistral", "mistral", "MistralForCausalLM"
supported.Phi3ForCausalLM, by_model_type.phi3, arch_names.phi3 = "phi3", "phi3", "Phi3ForCausalLM"

-- Their keys beyond Llama's, into c: sliding_window (an integer or null; both architectures
-- read it, transformers masks keys more than sliding_window - 1 positions back), and for
-- Phi-3 the fused qkv_proj / gate_up_proj layout. bad(key, msg) raises.
local function mistral_phi3_keys(cfg, arch, c, bad)
  if arch ~= "mistral" and arch ~= "phi3" then return end
  local w = cfg.sliding_window
  -- MistralConfig's sliding_window is 4096 where config.json has no such key (an explicit
  -- null is no window); Phi3Config's is None
  if w == nil and arch == "mistral" then w = 4096 end
  if not is_null(w) then
    if type(w) ~= "number" or w ~= math.floor(w) or w <= 0 then
      bad("sliding_window", ("must be a positive integer or null, got %s"):format(tostring(w)))
    end
    -- a window that covers every position changes nothing
    if w < c.max_position_embeddings then c.sliding_window = w end
  end
  if arch == "phi3" then
    c.fused_qkv_gate_up = true   -- (partial_rotary_factor is clrt.model_rope's)
  end
end

-- Gemma 3's own keys (transformers' Gemma3TextConfig; its defaults where a key is absent):
-- the (1 + w) norms, sandwich norms, GELU-tanh MLP and sqrt(hidden) embedding scale come with
-- the architecture; these set the attention and the soft-capping of logits and attention
-- scores (the released Gemma 3 configs set neither).
local function parse_gemma3(cfg, c, bad, int, num)
  local act = cfg.hidden_activation
  if is_null(act) then act = cfg.hidden_act end
  if not is_null(act) and act ~= "gelu_pytorch_tanh" then
    bad("hidden_activation", ("is '%s'; Gemma 3 supports gelu_pytorch_tanh"):format(tostring(act)))
  end
  for _, k in ipairs({ "final_logit_softcapping", "attn_logit_softcapping" }) do
    c[k] = 0
    if not is_null(cfg[k]) then
      c[k] = num(k)
      if c[k] <= 0 then bad(k, "must be positive or null") end
    end
  end
  -- transformers' bidirectional Gemma 3 (an encoder's mask); no released CausalLM sets it
  if cfg.use_bidirectional_attention == true then
    bad("use_bidirectional_attention", "is true; clrt runs Gemma 3 as a causal language model only")
  end
  c.gemma3 = true
  c.qk_norm = true
  c.query_pre_attn_scalar = num("query_pre_attn_scalar", 256)
  if c.query_pre_attn_scalar <= 0 then bad("query_pre_attn_scalar", "must be positive") end
  c.sliding_window = int("sliding_window", 4096)
  local L = c.num_hidden_layers
  local lt = cfg.layer_types
  if not is_null(lt) then
    -- newer configs list each layer's kind; clrt runs the periodic layout every release has
    if type(lt) ~= "table" or #lt ~= L then bad("layer_types", ("must list %d layer kinds"):format(L)) end
    local first_full
    for i = 1, L do
      if lt[i] ~= "sliding_attention" and lt[i] ~= "full_attention" then
        bad("layer_types", ("entry %d is '%s' (sliding_attention, full_attention)"):format(i, tostring(lt[i])))
      end
      if lt[i] == "full_attention" and not first_full then first_full = i end
    end
    c.sliding_window_pattern = first_full or (L + 1)
    for i = 1, L do
      local want = i % c.sliding_window_pattern == 0 and "full_attention" or "sliding_attention"
      if lt[i] ~= want then
        bad("layer_types", ("entry %d is '%s', but clrt runs a periodic layout (every %d-th layer full): expected '%s'")
          :format(i, lt[i], c.sliding_window_pattern, want))
      end
    end
  else
    c.sliding_window_pattern = int("sliding_window_pattern", 6)
  end
  c.rope_local_theta = num("rope_local_base_freq", 10000)
  if c.rope_local_theta <= 0 then bad("rope_local_base_freq", "must be positive") end
end

-- Checks a config table (as config.json decodes) and returns the C struct's fields.
-- `src` names the file in errors.
local function parse_config(cfg, src)
  local function bad(key, msg) error(("%s: key '%s' %s"):format(src, key, msg), 0) end
  local function int(key, default)
    local v = cfg[key]
    if is_null(v) then
      if default ~= nil then return default end
      bad(key, "is missing")
    end
    if type(v) ~= "number" or v ~= math.floor(v) then bad(key, ("must be an integer, got %s"):format(type(v) == "number" and tostring(v) or type(v))) end
    if v <= 0 then bad(key, ("must be positive, got %.0f"):format(v)) end
    -- checked before the C struct narrows it to 32 bits (2^40 would read as -2147483648)
    if v > 2147483647 then bad(key, ("is %.0f: more than 2147483647, the largest clrt holds"):format(v)) end
    return v
  end
  local function num(key, default)
    local v = cfg[key]
    if is_null(v) then
      if default ~= nil then return default end
      bad(key, "is missing")
    end
    if type(v) ~= "number" then bad(key, "must be a number, got " .. type(v)) end
    return v
  end
  local function bool(key, default)
    local v = cfg[key]
    if is_null(v) then return default end
    if type(v) ~= "boolean" then bad(key, "must be true or false, got " .. type(v)) end
    return v
  end
  if type(cfg) ~= "table" then error(src .. ": expected a JSON object", 0) end
  local arch
  if not is_null(cfg.architectures) then
    if type(cfg.architectures) ~= "table" or type(cfg.architectures[1]) ~= "string" then
      bad("architectures", "must be a list of names")
    end
    arch = supported[cfg.architectures[1]]
    if not arch then
      local names = {}
      for name in pairs(supported) do names[#names + 1] = name end
      table.sort(names)
      bad("architectures", ("names '%s'; supported: %s"):format(cfg.architectures[1], table.concat(names, ", ")))
    end
  elseif not is_null(cfg.model_type) then
    if type(cfg.model_type) ~= "string" then bad("model_type", "must be a string") end
    arch = by_model_type[cfg.model_type]
    if not arch then
      local names = {}
      for name in pairs(by_model_type) do names[#names + 1] = name end
      table.sort(names)
      bad("model_type", ("is '%s'; supported: %s"):format(cfg.model_type, table.concat(names, ", ")))
    end
  else
    arch = "llama"
  end
  if arch ~= "gemma3" and not is_null(cfg.hidden_act) and cfg.hidden_act ~= "silu" then
    bad("hidden_act", ("is '%s'; only silu (SwiGLU) is supported"):format(tostring(cfg.hidden_act)))
  end
  if bool("mlp_bias", false) then bad("mlp_bias", "is true; MLP biases are not supported") end
  if bool("use_sliding_window", false) then bad("use_sliding_window", "is true; sliding-window attention is not supported") end
  local c = {}
  c.vocab_size = int("vocab_size")
  c.hidden_size = int("hidden_size")
  c.intermediate_size = int("intermediate_size")
  c.num_hidden_layers = int("num_hidden_layers")
  c.num_attention_heads = int("num_attention_heads")
  c.num_key_value_heads = int("num_key_value_heads", c.num_attention_heads)
  if c.num_attention_heads % c.num_key_value_heads ~= 0 then
    bad("num_key_value_heads", ("(%d) must divide num_attention_heads (%d)"):format(c.num_key_value_heads, c.num_attention_heads))
  end
  if is_null(cfg.head_dim) and c.hidden_size % c.num_attention_heads ~= 0 then
    bad("head_dim", "is missing and hidden_size is not a multiple of num_attention_heads")
  end
  c.head_dim = int("head_dim", math.floor(c.hidden_size / c.num_attention_heads))
  if c.head_dim % 2 ~= 0 then bad("head_dim", "must be even (RoPE rotates pairs)") end
  c.max_position_embeddings = int("max_position_embeddings")
  c.rms_norm_eps = num("rms_norm_eps")
  if c.rms_norm_eps <= 0 then bad("rms_norm_eps", "must be positive") end
  cfg = model_rope.parse(cfg, arch, c, bad, is_null)
  c.tie_word_embeddings = bool("tie_word_embeddings", arch == "gemma3")
  local attention_bias = bool("attention_bias", false)
  c.qkv_bias = arch == "qwen2" or attention_bias
  c.o_bias = arch ~= "qwen2" and attention_bias
  c.qk_norm = arch == "qwen3"
  mistral_phi3_keys(cfg, arch, c, bad)
  if arch == "gemma3" then parse_gemma3(cfg, c, bad, int, num) end
  -- nn.Embedding(padding_idx = pad_token_id): the lookup gives that row no gradient. The
  -- classes' defaults where the key is absent: Gemma 3's 0, Phi-3's 32000, the others none.
  local pad = cfg.pad_token_id
  if pad == nil then
    pad = ({ gemma3 = 0, phi3 = 32000 })[arch]
  end
  if not is_null(pad) then
    if type(pad) ~= "number" or pad ~= math.floor(pad) then bad("pad_token_id", "must be an integer or null") end
    -- (outside the vocabulary, e.g. a scaled-down test model's, there is no such row)
    if pad >= 0 and pad < c.vocab_size then c.padding_idx = pad end
  end
  c.arch = arch
  return c
end
M.parse_config = parse_config

local function to_struct(c, opts)
  local s = ffi.new("clrt_model_config")
  for _, k in ipairs({ "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
    "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings",
    "rms_norm_eps", "rope_theta", "rope_dim", "rope_scaling", "rope_factor", "rope_low_freq_factor",
    "rope_high_freq_factor", "rope_original_max_position", "sliding_window", "rope_attention_factor",
    "rope_beta_fast", "rope_beta_slow" }) do
    if c[k] ~= nil then s[k] = c[k] end
  end
  s.rope_yarn_truncate = c.rope_yarn_truncate and 1 or 0
  for i, v in ipairs(c.rope_short_factor or {}) do s.rope_short_factor[i - 1] = v end
  for i, v in ipairs(c.rope_long_factor or {}) do s.rope_long_factor[i - 1] = v end
  if c.padding_idx then s.has_padding_idx, s.padding_idx = 1, c.padding_idx end
  s.tie_word_embeddings = c.tie_word_embeddings and 1 or 0
  s.qkv_bias = c.qkv_bias and 1 or 0
  s.o_bias = c.o_bias and 1 or 0
  s.qk_norm = c.qk_norm and 1 or 0
  s.fused_qkv_gate_up = c.fused_qkv_gate_up and 1 or 0
  if c.gemma3 then
    s.gemma3 = 1
    s.query_pre_attn_scalar = c.query_pre_attn_scalar
    s.sliding_window_pattern = c.sliding_window_pattern
    s.rope_local_theta = c.rope_local_theta
    s.final_logit_softcapping = c.final_logit_softcapping
    s.attn_logit_softcapping = c.attn_logit_softcapping
  end
  s.max_batch = opts and opts.max_batch or 0
  s.max_seq = opts and opts.max_seq or 0
  s.keep_logits_mb = opts and opts.keep_logits_mb or 256
  return s
end

local function wrap_model(ptr, cfg, parsed)
  local m = setmetatable({ ptr = ffi.gc(ptr, C.clrt_model_free), config = cfg, _c = parsed }, Model)
  m.names = {}
  for i = 0, C.clrt_model_num_tensors(ptr) - 1 do
    m.names[i + 1] = ffi.string(C.clrt_model_tensor_name(ptr, i))
  end
  return m
end

-- A copy of cfg with what transformers needs to load what we save.
local function complete_config(cfg, parsed)
  local out = {}
  for k, v in pairs(cfg) do out[k] = v end
  if is_null(out.architectures) then out.architectures = { arch_names[parsed.arch] } end
  if is_null(out.model_type) then out.model_type = model_types[parsed.arch] or parsed.arch end
  if is_null(out.head_dim) then out.head_dim = parsed.head_dim end
  if is_null(out.num_key_value_heads) then out.num_key_value_heads = parsed.num_key_value_heads end
  if is_null(out.tie_word_embeddings) then out.tie_word_embeddings = parsed.tie_word_embeddings end
  if is_null(out.rope_theta) then out.rope_theta = parsed.rope_theta end
  if parsed.gemma3 then
    if is_null(out.hidden_activation) then out.hidden_activation = "gelu_pytorch_tanh" end
    for _, k in ipairs({ "query_pre_attn_scalar", "sliding_window" }) do
      if is_null(out[k]) then out[k] = parsed[k] end
    end
    if is_null(out.sliding_window_pattern) and is_null(out.layer_types) then out.sliding_window_pattern = parsed.sliding_window_pattern end
    if is_null(out.rope_local_base_freq) and is_null(out.rope_parameters) then out.rope_local_base_freq = parsed.rope_local_theta end
  elseif is_null(out.hidden_act) then out.hidden_act = "silu" end
  -- the weights m:save writes are f32: transformers 5 reads `dtype` before `torch_dtype`, so
  -- a source's `dtype` copied unchanged (bfloat16) would reload them as bf16; both say float32
  out.torch_dtype, out.dtype = "float32", "float32"
  return out
end

-- Options of new and load: max_batch, max_seq (first size of the activation arena; it grows),
-- keep_logits_mb (default 256: a kept forward whose [rows, vocab] logits fit keeps them for
-- backward instead of recomputing them; 0 always recomputes, chunk by chunk).
-- new(cfg, {seed =, ...}): a randomly initialised model.
function M.new(cfg, opts)
  if type(cfg) ~= "table" then
    error(("model.new(cfg, opts): cfg must be a table of config.json's keys (vocab_size, hidden_size, ...), got a %s"):format(type(cfg)), 2)
  end
  if opts ~= nil and type(opts) ~= "table" then error(("model.new(cfg, opts): opts must be a table, got a %s"):format(type(opts)), 2) end
  opts = opts or {}
  local parsed = parse_config(cfg, "model config")
  local ptr = check(C.clrt_model_new(to_struct(parsed, opts)), 2)
  ok(C.clrt_model_init_random(ptr, opts.seed or 0), 2)
  local m = wrap_model(ptr, complete_config(cfg, parsed), parsed)
  if opts.device and opts.device ~= "cpu" then m:to(opts.device) end
  if opts.matmul then m:set_matmul(opts.matmul) end
  if opts.quant then m:set_quant(opts.quant) end
  return m
end

-- load(dir[, opts]): a Hugging Face model folder. opts.adapter: a PEFT LoRA folder to load on
-- top (opts.lora_seed seeds its dropout); opts.base_dtype = "bf16" with opts.adapter or
-- opts.lora (add_lora's table): the base's block linear weights are converted to bf16 as they
-- are read (what set_base_dtype("bf16") after loading gives, without the whole f32 copy first).
-- opts.device, opts.matmul, opts.quant as in new.
function M.load(dir, opts)
  if type(dir) ~= "string" then
    error(("model.load(dir, opts): dir must be the path of a Hugging Face model folder (a string), got a %s"):format(type(dir)), 2)
  end
  if opts ~= nil and type(opts) ~= "table" then error(("model.load(dir, opts): opts must be a table, got a %s"):format(type(opts)), 2) end
  local cpath = dir .. "/config.json"
  local text = read_file(cpath)
  if not text then error(("model.load: no config.json in %s"):format(dir), 2) end
  local okj, cfg = pcall(json.decode, text)
  if not okj then error(("%s: not valid JSON: %s"):format(cpath, tostring(cfg)), 2) end
  local parsed = parse_config(cfg, cpath)
  local okg, gen = pcall(require("clrt.generation_config").read, dir)
  if not okg then error(gen, 2) end
  local ptr = ffi.gc(check(C.clrt_model_new(to_struct(parsed, opts)), 2), C.clrt_model_free)
  local base16 = opts and opts.base_dtype == "bf16"
  if opts and opts.base_dtype and opts.base_dtype ~= "f32" and not base16 then
    error(("model.load: base_dtype '%s' (bf16, f32)"):format(tostring(opts.base_dtype)), 2)
  end
  local m
  if base16 then
    -- the frozen base read straight into bf16: the adapters first (they need only the shapes),
    -- then the conversion of the still empty model, then the file, one f32 tensor at a time
    if not opts.adapter and type(opts.lora) ~= "table" then
      error("model.load: base_dtype = \"bf16\" needs adapters: opts.adapter (a PEFT folder) or opts.lora (add_lora's table)", 2)
    end
    if opts.device and opts.device ~= "cpu" then error("model.load: base_dtype = \"bf16\" runs on the cpu only", 2) end
    m = wrap_model(ptr, cfg, parsed)
    if opts.adapter then m:load_adapter(opts.adapter, { seed = opts.lora_seed }) else m:add_lora(opts.lora) end
    m:set_base_dtype("bf16")
    m.dir, m.generation_config = dir, gen
  end
  local index = dir .. "/model.safetensors.index.json"
  local itext = read_file(index)
  if itext then
    local oki, idx = pcall(json.decode, itext)
    if not oki or type(idx) ~= "table" or type(idx.weight_map) ~= "table" then
      error(("%s: expected a JSON object with a weight_map"):format(index), 2)
    end
    local shards, seen = {}, {}
    for name, file in pairs(idx.weight_map) do
      if type(file) ~= "string" or file:find("/", 1, true) or file:find("..", 1, true) then
        error(("%s: weight_map entry '%s' must name a file in the same folder"):format(index, tostring(name)), 2)
      end
      if not seen[file] then seen[file] = true; shards[#shards + 1] = file end
    end
    table.sort(shards)
    for _, f in ipairs(shards) do ok(C.clrt_model_load_safetensors(ptr, dir .. "/" .. f), 2) end
  elseif files.exists(dir .. "/model.safetensors") then
    ok(C.clrt_model_load_safetensors(ptr, dir .. "/model.safetensors"), 2)
  else
    error(("model.load: %s has neither model.safetensors nor model.safetensors.index.json"):format(dir), 2)
  end
  ok(C.clrt_model_check_loaded(ptr, dir), 2)
  if base16 then
    if opts.matmul then m:set_matmul(opts.matmul) end
    if opts.quant then m:set_quant(opts.quant) end
    return m
  end
  ffi.gc(ptr, nil)
  m = wrap_model(ptr, cfg, parsed)
  m.dir = dir   -- where m:tokenizer() looks
  m.generation_config = gen   -- generation_config.json: m:generate's stop ids and defaults
  -- weights are read on the host, then the arenas move as a whole
  if opts and opts.adapter then m:load_adapter(opts.adapter, { seed = opts.lora_seed }) end
  if opts and opts.device and opts.device ~= "cpu" then m:to(opts.device) end
  if opts and opts.matmul then m:set_matmul(opts.matmul) end
  if opts and opts.quant then m:set_quant(opts.quant) end
  return m
end

Model.__tostring = function(m)
  if m.ptr == nil then return "Model(freed)" end
  local c = m._c
  return ("Model(%s, %.1fM params, %d layers, hidden %d, heads %d/%d, vocab %d%s)"):format(
    arch_names[c.arch], tonumber(C.clrt_model_num_params(m.ptr)) / 1e6, c.num_hidden_layers, c.hidden_size,
    c.num_attention_heads, c.num_key_value_heads, c.vocab_size, c.tie_word_embeddings and ", tied" or "")
end

local function live(m)
  if m.ptr == nil then error("model: used after free()", 3) end
  return m.ptr
end

-- to("cuda") / to("cpu"): moves parameters and gradients (activations follow on first use).
-- Views from params()/grads() taken before keep the old memory; create optimizers and
-- decoders after the move.
function Model:to(device)
  local d = tensor.device_of(device, "model:to")
  release_held(self)   -- its KV cache is on the old device
  ok(C.clrt_model_to_device(live(self), d), 2)
  self._params, self._grads = nil, nil   -- cached views belong to the old memory
  self._lora_params, self._lora_grads = nil, nil
  return self
end

-- Whole weight-copy packs made so far (a current copy is refreshed in place by opt:step()).
function Model:copy_repacks() return tonumber(C.clrt_model_copy_repacks(live(self))) end

-- What the last forward, backward or decode step ran its linear products on: {format =
-- the weight copy's layout, kernels = its kernel set at this CPU level, master = the f32 set a
-- declined product falls back to}; nil before any.
function Model:products()
  local m = live(self)
  local function name(i)
    local s = C.clrt_model_products(m, i)
    return s ~= nil and ffi.string(s) or nil
  end
  local format = name(0)
  if not format then return nil end
  return {format = format, kernels = name(1), master = name(2)}
end

-- set_matmul("bf16" | "f32"): bf16 mixed precision (train.precision=bf16). On cuda, the
-- blocks' matmuls take bf16 inputs (copies of the fp32 master weights) and accumulate in
-- fp32; the output layer stays fp32. On the CPU with a matrix unit (M.matrix_unit(): AMX,
-- else AVX512-BF16) every product of the blocks' linear layers, forward and backward, and
-- decode's output layer, multiplies bf16 inputs and weight copies with f32 sums (the copies
-- kept current by the optimizer step); the loss, norms, master weights and AdamW stay f32.
-- Without a unit, decode-sized products over bf16 copies and the rest in f32.
-- Greedy output is no longer bit-equal to the f32 path.
function Model:set_matmul(kind)
  if kind ~= "bf16" and kind ~= "f32" then error(("model:set_matmul: '%s' (bf16, f32)"):format(tostring(kind)), 2) end
  ok(C.clrt_model_set_matmul_bf16(live(self), kind == "bf16" and 1 or 0), 2)
  return self
end

-- set_quant("int8" | "none"): on the cpu, generation (prefill and decode: m:generate, the
-- engine, clrt serve/chat, RL rollouts) reads int8 copies of every linear weight with
-- per-output-channel scales and int8-quantized input rows (AVX512-VNNI where the CPU has it);
-- m:logprobs, backward and training keep the f32 weights, and the copies follow them after
-- every optimizer step. "none" frees the copies. See docs/quantization.md.
function Model:set_quant(kind)
  if kind ~= "int8" and kind ~= "none" then error(("model:set_quant: '%s' (int8, none)"):format(tostring(kind)), 2) end
  ok(C.clrt_model_set_quant_int8(live(self), kind == "int8" and 1 or 0), 2)
  return self
end

-- "int8" or "none".
function Model:quant() return C.clrt_model_quant_int8(live(self)) ~= 0 and "int8" or "none" end

-- set_base_dtype("bf16"): with LoRA adapters, on the cpu, the frozen base's linear weights are
-- kept only in bf16 (their f32 copy freed; products accumulate in f32; embeddings, head, norms
-- and biases stay f32). One way: the base can then not be saved, merged, loaded into or
-- moved (load it again for that). "f32" is the default and a no-op on an f32 base.
function Model:set_base_dtype(kind)
  if kind ~= "bf16" and kind ~= "f32" then error(("model:set_base_dtype: '%s' (bf16, f32)"):format(tostring(kind)), 2) end
  if kind == "f32" then
    if self:base_dtype() == "bf16" then error("model:set_base_dtype: the base is bf16 already; load it again for f32", 2) end
    return self
  end
  ok(C.clrt_model_set_base_bf16(live(self)), 2)
  self._params = nil   -- the f32 views of the old arena
  return self
end
function Model:base_dtype() return C.clrt_model_base_bf16(live(self)) == 1 and "bf16" or "f32" end

-- set_decode_pack(on): CPU f32 decoding reads a packed copy of the linear weights (faster
-- steps, a second copy of the weights in memory), and training runs the AVX-512 products
-- (that copy when a decode made it, else packing on the fly); on by default, false frees the
-- copy and runs OpenBLAS sgemm throughout.
function Model:set_decode_pack(on)
  if type(on) ~= "boolean" then error("model:set_decode_pack: expects true or false", 2) end
  ok(C.clrt_model_set_decode_pack(live(self), on and 1 or 0), 2)
  return self
end

-- set_batch_invariant(on): on the CPU a row's logits become the same bits whatever rows share
-- its forward (decode steps of 1 to any number of rows, prefills alone or together) and a
-- prefilled position gets a decode step's bits; the RL rollouts and `clrt serve
-- --deterministic` turn it on (docs/reproducibility.md: what it costs). batch_invariant() reads it.
function Model:set_batch_invariant(on)
  if type(on) ~= "boolean" then error("model:set_batch_invariant: expects true or false", 2) end
  ok(C.clrt_model_set_batch_invariant(live(self), on and 1 or 0), 2)
  return self
end
function Model:batch_invariant() return C.clrt_model_batch_invariant(live(self)) == 1 end

-- set_share_prefix(on): logprobs with `context` runs a context that several rows share (an RL
-- group's prompt, a DPO pair's) once, forward and backward, then each row's continuation; the
-- same log-probs (the same bits when batch invariant) and gradients within rounding. On by
-- default (CPU). share_prefix() reads it.
function Model:set_share_prefix(on)
  if type(on) ~= "boolean" then error("model:set_share_prefix: expects true or false", 2) end
  ok(C.clrt_model_set_share_prefix(live(self), on and 1 or 0), 2)
  return self
end
function Model:share_prefix() return C.clrt_model_share_prefix(live(self)) == 1 end
-- The positions the last logprobs ran through the layers (B x T, fewer when it shared prefixes).
function Model:logprobs_positions() return tonumber(C.clrt_model_logprobs_positions(live(self))) end

-- The bf16 and packed weight copies follow writes through params() views and the optimizers
-- by themselves; after writing parameter memory by other means (data_ptr()), call this.
function Model:params_changed() C.clrt_model_params_changed(live(self)) end

function Model:device() return C.clrt_model_device(live(self)) == C.CLRT_CUDA and "cuda" or "cpu" end

-- FLOPs of one training step over B rows of T tokens (for TFLOP/s and MFU).
function Model:train_flops(B, T) return C.clrt_model_train_flops(live(self), B, T) end

-- For training logs: a step over B x T tokens that took `seconds` achieved this many TFLOP/s,
-- and this fraction of the GPU's dense bf16 peak (nil on the cpu or when the peak is unknown;
-- CLRT_PEAK_TFLOPS sets it).
function Model:throughput(B, T, seconds)
  local tflops = self:train_flops(B, T) / seconds / 1e12
  local peak = self:device() == "cuda" and C.clrt_cuda_peak_tflops() or 0
  return tflops, peak > 0 and tflops / peak or nil
end

-- save(dir): config.json + model.safetensors, each written atomically.
function Model:save(dir)
  if type(dir) ~= "string" then error(("m:save(dir): dir must be a folder path (a string), got a %s"):format(type(dir)), 2) end
  files.mkdir_p(dir)
  ok(C.clrt_model_save_safetensors(live(self), dir .. "/model.safetensors"), 2)
  os.remove(dir .. "/model.safetensors.index.json")   -- a stale index would shadow the new file
  files.write_atomic(dir .. "/config.json", json.encode(complete_config(self.config, self._c)) .. "\n")
  return dir
end

-- Frees the arenas now rather than at garbage collection (the collector does not see their
-- size). Views from params()/grads() keep their own arena alive until they are collected.
function Model:free()
  if self.ptr ~= nil then
    release_held(self)   -- its KV cache and prefix cache first
    C.clrt_model_free(ffi.gc(self.ptr, nil))
    self.ptr = nil
    self._params, self._grads, self._lora_params, self._lora_grads = nil, nil, nil, nil
  end
end

function Model:params()
  if not self._params then
    local t = {}
    for i, name in ipairs(self.names) do t[name] = tensor.wrap(C.clrt_model_param(live(self), i - 1)) end
    self._params = t
  end
  return self._params
end

function Model:grads()
  if not self._grads then
    local t = {}
    for i, name in ipairs(self.names) do t[name] = tensor.wrap(C.clrt_model_grad(live(self), i - 1)) end
    self._grads = t
  end
  return self._grads
end

function Model:num_params() return tonumber(C.clrt_model_num_params(live(self))) end

function Model:memory()
  local p = tonumber(C.clrt_model_memory(live(self), C.CLRT_ARENA_PARAMS))
  local g = tonumber(C.clrt_model_memory(live(self), C.CLRT_ARENA_GRADS))
  local a = tonumber(C.clrt_model_memory(live(self), C.CLRT_ARENA_ACTIVATIONS))
  return { params = p, grads = g, activations = a, total = p + g + a }
end

function Model:zero_grad() ok(C.clrt_model_zero_grad(live(self)), 2) end

-- tokens: rows (Lua tables, ragged allowed: right-padded to the longest) or an i32 tensor
-- [B, T]. Returns an i32 buffer [B*T], B, T, and lengths (int32_t[B]).
local function token_batch(tokens, lengths)
  local B, T, buf, anchor
  if tensor.is_tensor(tokens) then
    if tokens:dim() ~= 2 then error("logprobs: tokens must be a 2-d tensor [B, T], got shape " .. tensor.shape_str(tokens), 3) end
    if tokens:dtype() ~= "i32" or not tokens:is_contiguous() then tokens = tokens:to("i32") end
    B, T = tokens:size(1), tokens:size(2)
    buf = ffi.cast("int32_t *", tokens:data_ptr())
    anchor = tokens   -- keeps the tensor (and buf) alive through the call
  else
    if type(tokens) ~= "table" or #tokens == 0 then error("logprobs: tokens must be a non-empty table of rows or an i32 tensor", 3) end
    B, T = #tokens, 0
    for b = 1, B do
      if type(tokens[b]) ~= "table" then error(("logprobs: row %d is a %s, not a table of token ids"):format(b, type(tokens[b])), 3) end
      if #tokens[b] > T then T = #tokens[b] end
    end
    if T == 0 then error("logprobs: every row is empty", 3) end
    buf = ffi.new("int32_t[?]", B * T)
    for b = 1, B do
      local row = tokens[b]
      for t = 1, #row do
        local id = row[t]
        if type(id) ~= "number" then error(("logprobs: token at row %d, position %d is a %s"):format(b, t, type(id)), 3) end
        buf[(b - 1) * T + t - 1] = id
      end
    end
    if not lengths then
      lengths = {}
      for b = 1, B do lengths[b] = #tokens[b] end
    end
  end
  local lens = ffi.new("int32_t[?]", B)
  if lengths then
    if tensor.is_tensor(lengths) then lengths = lengths:totable() end
    if #lengths ~= B then error(("logprobs: %d lengths for %d rows"):format(#lengths, B), 3) end
    for b = 1, B do
      local n = lengths[b]
      if type(n) ~= "number" then error(("logprobs: length of row %d is a %s"):format(b, type(n)), 3) end
      if not anchor and n > #tokens[b] then
        error(("logprobs: length %d of row %d exceeds its %d tokens"):format(n, b, #tokens[b]), 3)
      end
      lens[b - 1] = n
    end
  else
    for b = 1, B do lens[b - 1] = T end
  end
  return buf, B, T, lens, anchor
end

-- logprobs(tokens, {lengths =, grad = true}) -> f32 tensor [B, T-1]
-- context = {n_1, ..., n_B}: row b's first n_b tokens are context only (a prompt): their
-- entries come back 0 and the output layer skips them; the others are the same bits.
-- With hidden = true also the final norm's output at each position with a target, f32
-- [B, T-1, hidden_size] (0 elsewhere): what a value head reads (clrt.train.value_head).
function Model:logprobs(tokens, opts)
  opts = opts or {}
  local buf, B, T, lens, anchor = token_batch(tokens, opts.lengths)
  local lp = tensor.zeros({ B, T - 1 })
  local keep = opts.grad ~= false
  local p = T > 1 and ffi.cast("float *", lp:data_ptr()) or ffi.new("float[1]")
  local hidden, hp
  if opts.hidden then
    hidden = tensor.zeros({ B, T - 1, self.config.hidden_size })
    hp = T > 1 and ffi.cast("float *", hidden:data_ptr()) or ffi.new("float[1]")
  end
  local ctx
  if opts.context then   -- each row's leading context tokens: no log-probs, no output-layer work
    if type(opts.context) ~= "table" or #opts.context ~= B then
      error(("logprobs: context must list one count per row (%d rows)"):format(B), 2)
    end
    ctx = ffi.new("int32_t[?]", B)
    for b = 1, B do
      local n = opts.context[b]
      if type(n) ~= "number" or n < 0 or n ~= math.floor(n) then
        error(("logprobs: context[%d] must be a count >= 0, got %s"):format(b, tostring(n)), 2)
      end
      ctx[b - 1] = n
    end
  end
  ok(C.clrt_model_logprobs_context(live(self), buf, B, T, lens, ctx, p, hp, keep and 1 or 0), 2)
  local _ = anchor
  self._last = keep and { B, T - 1 } or nil
  return lp, hidden
end

-- backward(dlogp [, dhidden]): dlogp shaped like the last lp (tensor or nested table);
-- dhidden (optional) an f32 tensor [B, T-1, hidden_size], the loss's gradient on the hidden
-- states logprobs{hidden = true} returned.
function Model:backward(dlogp, dhidden)
  if not self._last then error("backward: no forward was kept for it (call logprobs without grad = false first)", 2) end
  if not tensor.is_tensor(dlogp) then dlogp = tensor.from(dlogp) end
  local s = dlogp:shape()
  if #s ~= 2 or s[1] ~= self._last[1] or s[2] ~= self._last[2] then
    error(("backward: dlogp has shape %s, but the last logprobs were [%d, %d]"):format(tensor.shape_str(dlogp), self._last[1], self._last[2]), 2)
  end
  if dlogp:dtype() ~= "f32" or not dlogp:is_contiguous() then dlogp = dlogp:to("f32") end
  local p = dlogp:numel() > 0 and ffi.cast("float *", dlogp:data_ptr()) or ffi.new("float[1]")
  if dhidden == nil then ok(C.clrt_model_backward(live(self), p), 2) return end
  local hs = dhidden:shape()
  if #hs ~= 3 or hs[1] ~= s[1] or hs[2] ~= s[2] or hs[3] ~= self.config.hidden_size then
    error(("backward: dhidden has shape %s, expected [%d, %d, %d]"):format(tensor.shape_str(dhidden), s[1], s[2],
      self.config.hidden_size), 2)
  end
  if dhidden:dtype() ~= "f32" or not dhidden:is_contiguous() then dhidden = dhidden:to("f32") end
  local hp = dhidden:numel() > 0 and ffi.cast("float *", dhidden:data_ptr()) or ffi.new("float[1]")
  ok(C.clrt_model_backward_hidden(live(self), p, hp), 2)
end

-- tokenizer(): the tokenizer of the folder the model was loaded from, read on first use
-- (m.tokenizer_obj = tok sets another one).
function Model:tokenizer()
  if self.tokenizer_obj then return self.tokenizer_obj end
  if not self.dir then
    error("m:tokenizer(): this model was not loaded from a folder (clrt.model.new): pass a tokenizer, "
      .. "m:chat(tok, text), with tok = clrt.tokenizer.load(dir)", 2)
  end
  local okt, tok = pcall(require("clrt.tokenizer").load, self.dir)
  if not okt then error(("m:tokenizer(): %s"):format(tostring(tok)), 2) end
  self.tokenizer_obj = tok
  return tok
end

-- The seconds spent in the matrix products so far (linear layers forward and backward, the
-- output layer's, LoRA's), with timing turned on (profile_enable(true) or CLRT_PROFILE=1).
function M.product_seconds()
  local s = 0
  for i = 0, C.clrt_profile_count() - 1 do
    local name = ffi.string(C.clrt_profile_name(i))
    if name:find("^linear") or name:find("^output") or name == "lora" then s = s + C.clrt_profile_seconds(i) end
  end
  return s
end

function M.profile_enable(on) C.clrt_profile_enable(on and 1 or 0) end

-- Per-kernel seconds accumulated while CLRT_PROFILE=1 (reset = true clears them).
function M.profile(reset)
  local out = {}
  for i = 0, C.clrt_profile_count() - 1 do
    out[#out + 1] = { name = ffi.string(C.clrt_profile_name(i)), seconds = C.clrt_profile_seconds(i) }
  end
  if reset then C.clrt_profile_reset() end
  return out
end

-- profile_sync(true): wait for the GPU around each timed kernel, so a cuda model's profile
-- gives kernel times rather than launch times (it slows the steps it times).
function M.profile_sync(on) C.clrt_profile_sync(on and 1 or 0) end

-- The CPU kernels in use, one line (clrt --version's): the level (CLRT_CPU caps it), what the
-- CPU has, the bf16 unit and the int8 path. cpu_paths(level) caps the level for this process
-- first ("portable", "avx2", "avxvnni", "avx512"), before any model is made.
function M.cpu_paths(level)
  if level ~= nil then ok(C.clrt_set_cpu_level(level), 2) end
  return ffi.string(C.clrt_cpu_paths())
end

-- The unit bf16 products run on ("amx-bf16", "avx512-bf16", "fma-bf16": AVX2's FMAs, "f32":
-- none) and the best this CPU offers at its level: matrix_unit() -> active, available. matrix_unit(name) caps it for this process
-- (as CLRT_MATRIX_UNIT does), before set_matmul("bf16").
function M.matrix_unit(cap)
  if cap ~= nil then ok(C.clrt_set_matrix_unit(cap), 2) end
  return ffi.string(C.clrt_matrix_unit_active()), ffi.string(C.clrt_matrix_unit_available())
end

-- The measured peak GFLOP/s of a unit ("f32": the level's widest FMA, AVX-512 or AVX2;
-- "fma-bf16" runs on those; "avx512-bf16", "amx-bf16") over
-- `threads` threads, operands in registers; 0 when the CPU lacks it.
function M.unit_peak_gflops(unit, threads)
  local g = C.clrt_matrix_unit_peak_gflops(unit, threads or 1)
  if g < 0 then ok(-1, 2) end
  return g
end

-- LoRA (m:add_lora, ...) is defined beside, in its own file; the class takes it here.
-- Generation (m:decoder, m:generate, m:chat) puts itself in when clrt.gen.model_methods loads.
for name, f in pairs(require("clrt.core.model_lora").methods) do Model[name] = f end

return M
