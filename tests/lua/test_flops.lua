-- test_flops.lua — the FLOPs estimate behind TFLOP/s and MFU reporting, counted by hand from
-- the architecture, and the GPU peak override. Runs everywhere (no GPU needed).
local T = require("clrt.test")
local ffi = require("ffi")
pcall(ffi.cdef, "int setenv(const char *, const char *, int); int unsetenv(const char *);")

local cfg = { architectures = { "Qwen2ForCausalLM" }, vocab_size = 100, hidden_size = 32,
  intermediate_size = 48, num_hidden_layers = 3, num_attention_heads = 4, num_key_value_heads = 2,
  max_position_embeddings = 64, rms_norm_eps = 1e-6, rope_theta = 10000.0, tie_word_embeddings = false }

T.case("train_flops: 6 per matmul parameter per token plus causal attention", function()
  local m = clrt.model.new(cfg)
  local C, I, L, V, H, KV, D = 32, 48, 3, 100, 4, 2, 8
  -- per layer: q (+bias), k, v (+biases), o, gate, up, down; two norms
  local layer = C * H * D + H * D + 2 * (C * KV * D + KV * D) + H * D * C + 3 * C * I + 2 * C
  T.eq(m:num_params(), V * C * 2 + L * layer + C, "parameter count (untied: embedding and head)")
  local matmul = m:num_params() - V * C   -- the embedding is a lookup
  local B, Tn = 3, 20
  local want = 6 * matmul * B * Tn + 6 * L * H * D * Tn * Tn * B
  T.near(m:train_flops(B, Tn), want, { rtol = 1e-12 }, "flops")
  local tflops, mfu = m:throughput(B, Tn, 0.5)
  T.near(tflops, want / 0.5 / 1e12, { rtol = 1e-12 }, "TFLOP/s")
  T.eq(mfu, nil, "no MFU for a model on the cpu")
end)

T.case("train_flops with LoRA: 4 per frozen parameter and token, 6 per adapter parameter (the embedding's A is a lookup)", function()
  local C, I, L, V, H, KV, D, r = 32, 48, 3, 100, 4, 2, 8, 4
  local B, Tn = 2, 10
  local attn = 6 * L * H * D * Tn * Tn * B
  local m = clrt.model.new(cfg)
  local matmul = m:num_params() - V * C
  m:add_lora({ r = r, alpha = 8, targets = { "q_proj", "down_proj", "lm_head", "embed_tokens" } })
  -- q: A [r, C], B [H*D, r]; down: A [r, I], B [C, r]; lm_head: A [r, C], B [V, r];
  -- embedding: A [r, V] (looked up, no FLOPs), B [C, r]
  local adapters = L * (r * C + H * D * r + r * I + C * r) + (r * C + V * r) + C * r
  T.near(m:train_flops(B, Tn), 4 * matmul * B * Tn + 6 * adapters * B * Tn + attn, { rtol = 1e-12 }, "flops")
  m:set_adapters(false)   -- adapters off: the base alone, as the full step counts it
  T.near(m:train_flops(B, Tn), 6 * matmul * B * Tn + attn, { rtol = 1e-12 }, "adapters off")
end)

T.case("the peak comes from CLRT_PEAK_TFLOPS when set", function()
  ffi.C.setenv("CLRT_PEAK_TFLOPS", "123.5", 1)
  T.eq(clrt.cuda_peak_tflops(), 123.5)
  ffi.C.unsetenv("CLRT_PEAK_TFLOPS")
  if not clrt.cuda_available() then T.eq(clrt.cuda_peak_tflops(), 0, "no GPU, no override: unknown") end
end)

T.run()
