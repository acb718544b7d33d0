-- clrt.model_rope — config.json's RoPE keys read as transformers reads them
-- (modeling_rope_utils and each architecture's config class), into clrt_model_config's fields:
-- rope_theta, the scaling kind (default, linear, llama3, yarn, longrope/su, dynamic) and its
-- numbers. transformers 5 writes rope_parameters {rope_theta, rope_type, ...} in place of
-- rope_theta and rope_scaling (Gemma 3: one per layer kind); where a config has both,
-- rope_parameters wins, as transformers 5 reads it. The formulas themselves are C's
-- (runtime/model/params.c); here only which key means what, and what is missing.
local M = {}

-- The absent rope_theta per config class: Gemma3TextConfig's is 1e6 (its global layers),
-- every other class here 10000.
local default_theta = { gemma3 = 1000000 }

-- p(key): the number at key of the table t (nil when absent), bad naming `where`.
local function reader(t, where, bad, is_null)
  return function(key, required)
    local v = t[key]
    if is_null(v) then
      if required then bad(where .. "." .. key, "is missing") end
      return nil
    end
    if type(v) ~= "number" then bad(where .. "." .. key, "must be a number") end
    return v
  end
end

-- A per-pair factor list of longrope: rope_dim / 2 positive numbers (one per rotated pair).
local function factor_list(rs, key, half, bad)
  local v = rs[key]
  if type(v) ~= "table" or #v ~= half then
    bad("rope_scaling." .. key, ("must list %d numbers (one per rotated pair), got %s"):format(half, type(v) == "table" and #v or type(v)))
  end
  for i = 1, half do
    if type(v[i]) ~= "number" or not (v[i] > 0) then bad("rope_scaling." .. key, ("entry %d must be a positive number"):format(i)) end
  end
  return v
end

-- cfg: config.json; arch: clrt's architecture name; c: the fields being filled (head_dim and
-- max_position_embeddings already there). Returns cfg, with Gemma 3's local base from
-- rope_parameters.sliding_attention put in place of a top-level one.
function M.parse(cfg, arch, c, bad, is_null)
  local rp = cfg.rope_parameters
  if is_null(rp) then rp = nil elseif type(rp) ~= "table" then bad("rope_parameters", "must be an object or null") end
  if arch == "gemma3" and rp and type(rp.full_attention) == "table" then
    local sl = rp.sliding_attention
    if type(sl) ~= "table" or type(sl.rope_theta) ~= "number" then bad("rope_parameters.sliding_attention.rope_theta", "must be a number") end
    if sl.rope_type ~= nil and sl.rope_type ~= "default" then
      bad("rope_parameters.sliding_attention.rope_type", ("is '%s'; clrt runs Gemma 3's local layers with default RoPE"):format(tostring(sl.rope_type)))
    end
    cfg = setmetatable({ rope_local_base_freq = sl.rope_theta }, { __index = cfg })
    rp = rp.full_attention
  end
  -- rope_theta: rope_parameters' (transformers 5 requires it there), else the top-level
  -- key, else the class's default
  if rp then
    if type(rp.rope_theta) ~= "number" then bad("rope_parameters.rope_theta", "must be a number") end
    c.rope_theta = rp.rope_theta
  elseif not is_null(cfg.rope_theta) then
    if type(cfg.rope_theta) ~= "number" then bad("rope_theta", "must be a number, got " .. type(cfg.rope_theta)) end
    c.rope_theta = cfg.rope_theta
  else
    c.rope_theta = default_theta[arch] or 10000
  end
  if c.rope_theta <= 0 then bad("rope_theta", "must be positive") end
  -- partial rotary (Phi-4-mini: 0.75): transformers rotates int(head_dim * factor) leading
  -- dimensions of each head (its rope_init's dim) and passes the rest
  local prf = rp and rp.partial_rotary_factor
  if is_null(prf) then prf = cfg.partial_rotary_factor end
  c.rope_dim = c.head_dim
  if not is_null(prf) then
    if type(prf) ~= "number" or not (prf > 0 and prf <= 1) then bad("partial_rotary_factor", "must be a number in (0, 1]") end
    c.rope_dim = math.floor(c.head_dim * prf)
    if c.rope_dim < 2 or c.rope_dim % 2 ~= 0 then
      bad("partial_rotary_factor", ("rotates %d of head_dim %d dimensions; RoPE needs an even number, at least 2"):format(c.rope_dim, c.head_dim))
    end
  end
  local rs = rp or cfg.rope_scaling
  c.rope_scaling = 0   -- CLRT_ROPE_DEFAULT
  if is_null(rs) then return cfg end
  if type(rs) ~= "table" then bad("rope_scaling", "must be an object or null") end
  local kind = rs.rope_type or rs.type
  local num = reader(rs, "rope_scaling", bad, is_null)
  local maxpos = c.max_position_embeddings
  if kind == "default" or kind == nil then
    return cfg
  elseif kind == "linear" then
    c.rope_scaling, c.rope_factor = 1, num("factor", true)
  elseif kind == "llama3" then
    c.rope_scaling = 2
    c.rope_factor = num("factor", true)
    c.rope_low_freq_factor = num("low_freq_factor", true)
    c.rope_high_freq_factor = num("high_freq_factor", true)
    c.rope_original_max_position = num("original_max_position_embeddings", true)
  elseif kind == "yarn" then
    -- transformers (4.5x, whose check warns "Using the explicit factor"): the scaling's factor,
    -- over its original_max_position_embeddings or else max_position_embeddings
    c.rope_scaling = 3
    c.rope_factor = num("factor", true)
    c.rope_original_max_position = num("original_max_position_embeddings") or maxpos
    local af, ms, msa = num("attention_factor"), num("mscale"), num("mscale_all_dim")
    local function get_mscale(scale, m) return scale <= 1 and 1.0 or 0.1 * m * math.log(scale) + 1.0 end
    if not af and ms and ms ~= 0 and msa and msa ~= 0 then af = get_mscale(c.rope_factor, ms) / get_mscale(c.rope_factor, msa) end
    if af and af <= 0 then bad("rope_scaling.attention_factor", "must be positive") end
    c.rope_attention_factor = af or 0
    c.rope_beta_fast, c.rope_beta_slow = num("beta_fast") or 0, num("beta_slow") or 0
    local tr = rs.truncate
    if tr ~= nil and not is_null(tr) and type(tr) ~= "boolean" then bad("rope_scaling.truncate", "must be true or false") end
    c.rope_yarn_truncate = tr ~= false
  elseif kind == "longrope" or kind == "su" then
    -- transformers (Phi-3): a top-level original_max_position_embeddings makes the factor
    -- max_position_embeddings / it; without one the context is max_position_embeddings and
    -- the scaling's own factor counts
    c.rope_scaling = 4
    local half = c.rope_dim / 2
    c.rope_short_factor = factor_list(rs, "short_factor", half, bad)
    c.rope_long_factor = factor_list(rs, "long_factor", half, bad)
    local orig = cfg.original_max_position_embeddings
    if not is_null(orig) and orig ~= 0 then
      if type(orig) ~= "number" or orig ~= math.floor(orig) or orig <= 0 then
        bad("original_max_position_embeddings", "must be a positive integer")
      end
      c.rope_factor = maxpos / orig
    else
      orig = maxpos
      c.rope_factor = num("factor")
      if not c.rope_factor and not num("attention_factor") then
        bad("rope_scaling.factor", "is missing (and there is no original_max_position_embeddings or attention_factor)")
      end
      c.rope_factor = c.rope_factor or 1
    end
    c.rope_original_max_position = orig
    local af = num("attention_factor")
    if af and af <= 0 then bad("rope_scaling.attention_factor", "must be positive") end
    c.rope_attention_factor = af or 0
  elseif kind == "dynamic" then
    c.rope_scaling, c.rope_factor = 5, num("factor", true)
  else
    bad("rope_scaling", ("has type '%s', which clrt does not support (supported: default, linear, llama3, yarn, longrope, su, dynamic)")
      :format(tostring(kind)))
  end
  if not (c.rope_factor > 0) then bad("rope_scaling.factor", "must be positive") end
  return cfg
end

return M
