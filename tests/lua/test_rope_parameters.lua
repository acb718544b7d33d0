-- test_rope_parameters.lua — config.json as transformers 5 writes it: RoPE's settings in
-- rope_parameters {rope_theta, rope_type, factor, ...} instead of top-level rope_theta and
-- rope_scaling. The model must rotate exactly as with the old keys, and not fall back to
-- rope_theta 10000 (which would load silently and give other logits).
local T = require("clrt.test")

local function cfg(extra)
  local c = { architectures = { "Qwen2ForCausalLM" }, vocab_size = 64, hidden_size = 32, intermediate_size = 64,
    num_hidden_layers = 2, num_attention_heads = 4, num_key_value_heads = 2, max_position_embeddings = 64,
    rms_norm_eps = 1e-6, tie_word_embeddings = true }
  for k, v in pairs(extra) do c[k] = v end
  return c
end

local tokens = clrt.tensor.zeros({ 1, 24 }, { dtype = "i32" })
for i = 1, 24 do tokens:set(1, i, (i * 37) % 64) end

local function logprobs(extra)
  return T.floats(clrt.model.new(cfg(extra), { seed = 3 }):logprobs(tokens))
end

local function max_diff(a, b)
  local d = 0
  for i = 1, #a do d = math.max(d, math.abs(a[i] - b[i])) end
  return d
end

T.case("rope_parameters.rope_theta rotates as rope_theta does, not as the default", function()
  local old = logprobs({ rope_theta = 1000000.0 })
  local new = logprobs({ rope_parameters = { rope_theta = 1000000.0, rope_type = "default" } })
  T.eq(max_diff(old, new), 0, "rope_parameters against rope_theta")
  T.ok(max_diff(old, logprobs({})) > 1e-6, "rope_theta 1e6 differs from the default 10000 on this input")
end)

T.case("rope_parameters with a scaling type reads as rope_scaling", function()
  local old = logprobs({ rope_theta = 500000.0, rope_scaling = { rope_type = "linear", factor = 4.0 } })
  local new = logprobs({ rope_parameters = { rope_theta = 500000.0, rope_type = "linear", factor = 4.0 } })
  T.eq(max_diff(old, new), 0, "linear scaling from rope_parameters")
  T.ok(max_diff(old, logprobs({ rope_theta = 500000.0 })) > 1e-6, "the factor changes the logits")
end)

T.case("a bad rope_parameters is an error naming it", function()
  T.raises(function() clrt.model.new(cfg({ rope_parameters = 5 }), { seed = 3 }) end, "rope_parameters")
  T.raises(function() clrt.model.new(cfg({ rope_parameters = { rope_type = "default" } }), { seed = 3 }) end,
    "rope_parameters.rope_theta")
end)

T.run()
