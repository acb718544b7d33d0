-- Builds a small Hugging Face model folder for tests that need a real model and tokenizer:
-- a byte-level BPE trained here on a short corpus (ChatML specials and template) and a
-- randomly initialised Qwen2-style model over its vocabulary (opts.architecture = "gemma3": a
-- Gemma 3 one).
--   local dir = require("support.tiny_model")(T.tmpdir(), {seed = 1})
-- opts.extra_rows: embedding rows beyond the tokenizer's ids (as Qwen2.5 has 151,936 rows
-- for 151,665 ids), ids the tokenizer cannot decode.
return function(dir, opts)
  opts = opts or {}
  local words = { "hello", "there", "how", "are", "you", "today", "fine", "thanks", "what", "is",
    "your", "name", "city", "trip", "plan", "write", "a", "card", "for", "my", "friend", "{", "}", ":", "\"" }
  local lines = {}
  for i = 1, 400 do
    lines[i] = table.concat({ words[i % #words + 1], " ", words[(i * 7) % #words + 1], " ",
      words[(i * 13) % #words + 1], ". ", i, "\n" })
  end
  require("clrt.tokenizer_train").folder({ table.concat(lines) }, { vocab_size = opts.vocab_size or 320 }, dir)
  local tok = clrt.tokenizer.load(dir)
  local cfg = {
    architectures = { "Qwen2ForCausalLM" }, vocab_size = tok:vocab_size() + (opts.extra_rows or 0), hidden_size = opts.hidden_size or 32,
    intermediate_size = 64, num_hidden_layers = 2, num_attention_heads = 4, num_key_value_heads = 2,
    max_position_embeddings = opts.max_position or 512, rms_norm_eps = 1e-6, rope_theta = 10000, tie_word_embeddings = true,
  }
  if opts.architecture == "gemma3" then   -- opts.architecture: Gemma 3 over the same tokenizer
    cfg.architectures = { "Gemma3ForCausalLM" }
    cfg.num_hidden_layers, cfg.head_dim, cfg.sliding_window, cfg.sliding_window_pattern = 3, 16, 16, 3
    cfg.query_pre_attn_scalar, cfg.rope_local_base_freq = 16, 10000
  end
  local m = clrt.model.new(cfg, { seed = opts.seed or 1 })
  m:save(dir)
  return dir
end
