-- bench/shapes.lua — the model shapes the training benchmarks share: the built-in world's
-- ~0.9M model, ~5M and ~50M
-- parameter Llama-style models, and the shapes of Qwen2.5-0.5B and -1.5B (their config.json).
--   local SIZES = dofile(bench_dir .. "/shapes.lua")
return {
  -- the built-in world's model (examples/collab_world/config.lua's sft.arch over its 512-token
  -- BPE; collabllm_sft.lua builds it as a Qwen2 with tied embeddings), ~0.9M parameters
  ["0.9M"] = { architectures = { "Qwen2ForCausalLM" }, vocab_size = 512, hidden_size = 128,
    intermediate_size = 384, num_hidden_layers = 4, num_attention_heads = 4, num_key_value_heads = 4,
    max_position_embeddings = 256, rms_norm_eps = 1e-6, rope_theta = 10000.0, tie_word_embeddings = true },
  ["5M"] = { vocab_size = 8192, hidden_size = 256, intermediate_size = 704, num_hidden_layers = 4,
    num_attention_heads = 4, num_key_value_heads = 4, max_position_embeddings = 2048,
    rms_norm_eps = 1e-5, rope_theta = 10000.0, tie_word_embeddings = true },
  ["50M"] = { vocab_size = 16384, hidden_size = 512, intermediate_size = 2048, num_hidden_layers = 8,
    num_attention_heads = 8, num_key_value_heads = 8, max_position_embeddings = 2048,
    rms_norm_eps = 1e-5, rope_theta = 10000.0, tie_word_embeddings = false },
  -- the shape of Qwen2.5-0.5B-Instruct (config.json): QKV bias, GQA 14/2, tied, 151,936 tokens
  ["0.5B"] = { architectures = { "Qwen2ForCausalLM" }, vocab_size = 151936, hidden_size = 896,
    intermediate_size = 4864, num_hidden_layers = 24, num_attention_heads = 14, num_key_value_heads = 2,
    max_position_embeddings = 32768, rms_norm_eps = 1e-6, rope_theta = 1000000.0, tie_word_embeddings = true },
  -- Qwen2.5-1.5B-Instruct's
  ["1.5B"] = { architectures = { "Qwen2ForCausalLM" }, vocab_size = 151936, hidden_size = 1536,
    intermediate_size = 8960, num_hidden_layers = 28, num_attention_heads = 12, num_key_value_heads = 2,
    max_position_embeddings = 32768, rms_norm_eps = 1e-6, rope_theta = 1000000.0, tie_word_embeddings = true },
}
