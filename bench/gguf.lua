-- bench/gguf.lua — write a Hugging Face model folder clrt made (Qwen2 architecture, f32
-- safetensors, byte-level BPE tokenizer.json) as a GGUF v3 file llama.cpp loads, so a peer
-- runs the very same weights. The format is GGUF's public spec: header, key/values, tensor
-- infos, then the tensor data aligned to 32 bytes. Qwen2 uses NeoX rotary halves as Hugging
-- Face does, so weights go in as they are (no Q/K permutation as for the "llama" arch).
-- The safetensors file is read tensor by tensor and copied in pieces of at most COPY_CHUNK
-- bytes, so a model of any size converts in bounded memory (reading the whole file into one
-- Lua string failed with "not enough memory" at 0.5B).
--   require("gguf").write(model_dir, out_path)
local cjson = require("cjson")
local ffi = require("ffi")

local M = {}

local COPY_CHUNK = 8 * 1048576

local T = { u32 = 4, i32 = 5, f32 = 6, bool = 7, str = 8, arr = 9, u64 = 10 }

local function read(path)
  local f = assert(io.open(path, "rb"), "gguf: cannot read " .. path)
  local s = f:read("*a")
  f:close()
  return s
end

local function packer()
  local parts = {}
  local p = {}
  local function raw(s) parts[#parts + 1] = s end
  local function num(ctype, v)
    local b = ffi.new(ctype .. "[1]", v)
    raw(ffi.string(b, ffi.sizeof(ctype)))
  end
  function p.u32(v) num("uint32_t", v) end
  function p.i32(v) num("int32_t", v) end
  function p.u64(v) num("uint64_t", v) end
  function p.f32(v) num("float", v) end
  function p.str(s) p.u64(#s); raw(s) end
  function p.raw(s) raw(s) end
  function p.result() return table.concat(parts) end
  return p
end

function M.write(dir, out)
  local cfg = cjson.decode(read(dir .. "/config.json"))
  local tj = cjson.decode(read(dir .. "/tokenizer.json"))
  local tc = cjson.decode(read(dir .. "/tokenizer_config.json"))
  local st_path = dir .. "/model.safetensors"
  local st = assert(io.open(st_path, "rb"), "gguf: cannot read " .. st_path)
  local size = st:seek("end")
  st:seek("set", 0)
  local len8 = st:read(8)
  assert(len8 and #len8 == 8, "gguf: " .. st_path .. " is shorter than a safetensors header")
  local hlen = tonumber(ffi.cast("const uint64_t*", ffi.cast("const char*", len8))[0])
  assert(hlen <= size - 8, ("gguf: %s: header length %d runs past the file's %d bytes"):format(st_path, hlen, size))
  local header = cjson.decode(st:read(hlen))
  local data0 = 8 + hlen

  -- vocabulary: byte-level token strings by id, specials marked control (type 3)
  local V = cfg.vocab_size
  local tokens, types = {}, {}
  for tok, id in pairs(tj.model.vocab) do tokens[id + 1], types[id + 1] = tok, 1 end
  local eos
  for _, a in ipairs(tj.added_tokens or {}) do
    tokens[a.id + 1], types[a.id + 1] = a.content, a.special and 3 or 4
    if a.content == tc.eos_token then eos = a.id end
  end
  for i = 1, V do
    if not tokens[i] then tokens[i], types[i] = ("[PAD%d]"):format(i - 1), 5 end
  end
  local merges = {}
  for i, m in ipairs(tj.model.merges) do merges[i] = type(m) == "table" and (m[1] .. " " .. m[2]) or m end

  local L, H = cfg.num_hidden_layers, cfg.hidden_size
  local names = { { "model.embed_tokens.weight", "token_embd.weight" }, { "model.norm.weight", "output_norm.weight" } }
  if not cfg.tie_word_embeddings then names[#names + 1] = { "lm_head.weight", "output.weight" } end
  local per = { { "input_layernorm.weight", "attn_norm.weight" }, { "post_attention_layernorm.weight", "ffn_norm.weight" },
    { "self_attn.q_proj.weight", "attn_q.weight" }, { "self_attn.k_proj.weight", "attn_k.weight" },
    { "self_attn.v_proj.weight", "attn_v.weight" }, { "self_attn.o_proj.weight", "attn_output.weight" },
    { "self_attn.q_proj.bias", "attn_q.bias" }, { "self_attn.k_proj.bias", "attn_k.bias" },
    { "self_attn.v_proj.bias", "attn_v.bias" }, { "mlp.gate_proj.weight", "ffn_gate.weight" },
    { "mlp.up_proj.weight", "ffn_up.weight" }, { "mlp.down_proj.weight", "ffn_down.weight" } }
  for l = 0, L - 1 do
    for _, n in ipairs(per) do names[#names + 1] = { ("model.layers.%d.%s"):format(l, n[1]), ("blk.%d.%s"):format(l, n[2]) } end
  end

  local kv = {
    { "general.architecture", T.str, "qwen2" }, { "general.name", T.str, "clrt-bench" },
    { "general.alignment", T.u32, 32 },
    { "qwen2.context_length", T.u32, cfg.max_position_embeddings or 2048 },
    { "qwen2.embedding_length", T.u32, H }, { "qwen2.block_count", T.u32, L },
    { "qwen2.feed_forward_length", T.u32, cfg.intermediate_size },
    { "qwen2.attention.head_count", T.u32, cfg.num_attention_heads },
    { "qwen2.attention.head_count_kv", T.u32, cfg.num_key_value_heads or cfg.num_attention_heads },
    { "qwen2.rope.freq_base", T.f32, cfg.rope_theta or 10000 },
    { "qwen2.attention.layer_norm_rms_epsilon", T.f32, cfg.rms_norm_eps or 1e-6 },
    { "general.file_type", T.u32, 0 },
    { "tokenizer.ggml.model", T.str, "gpt2" }, { "tokenizer.ggml.pre", T.str, "qwen2" },
    { "tokenizer.ggml.tokens", T.arr, { T.str, tokens } }, { "tokenizer.ggml.token_type", T.arr, { T.i32, types } },
    { "tokenizer.ggml.merges", T.arr, { T.str, merges } },
    { "tokenizer.ggml.add_bos_token", T.bool, false },
  }
  if eos then
    kv[#kv + 1] = { "tokenizer.ggml.eos_token_id", T.u32, eos }
    kv[#kv + 1] = { "tokenizer.ggml.padding_token_id", T.u32, eos }
  end
  if type(tc.chat_template) == "string" then kv[#kv + 1] = { "tokenizer.chat_template", T.str, tc.chat_template } end

  local p = packer()
  p.raw("GGUF"); p.u32(3); p.u64(#names); p.u64(#kv)
  local function value(ty, v)
    if ty == T.str then p.str(v) elseif ty == T.u32 then p.u32(v) elseif ty == T.i32 then p.i32(v)
    elseif ty == T.f32 then p.f32(v) elseif ty == T.bool then p.raw(v and "\1" or "\0")
    elseif ty == T.arr then
      p.u32(v[1]); p.u64(#v[2])
      for _, x in ipairs(v[2]) do value(v[1], x) end
    end
  end
  for _, e in ipairs(kv) do p.str(e[1]); p.u32(e[2]); value(e[2], e[3]) end

  -- the tensor infos; each tensor's bytes are a range of the safetensors file or zeros
  local spans, offset = {}, 0
  for i, n in ipairs(names) do
    local h = header[n[1]]
    local span
    if h then
      assert(h.dtype == "F32", "gguf: " .. n[1] .. " is " .. tostring(h.dtype) .. ", only F32 is written")
      local a, b = h.data_offsets[1], h.data_offsets[2]
      assert(a <= b and data0 + b <= size, ("gguf: %s: %s's bytes [%d, %d) run past the file"):format(st_path, n[1], a, b))
      span = { from = data0 + a, bytes = b - a }
    elseif n[2]:match("%.bias$") then   -- a model without QKV bias: zeros (Qwen2 expects them)
      local rows = header[n[1]:gsub("bias$", "weight")].shape[1]
      h = { shape = { rows } }
      span = { bytes = rows * 4 }
    else
      error("gguf: the model has no tensor " .. n[1])
    end
    p.str(n[2]); p.u32(#h.shape)
    for d = #h.shape, 1, -1 do p.u64(h.shape[d]) end   -- GGUF lists the fastest dimension first
    p.u32(0)                                              -- GGML_TYPE_F32
    p.u64(offset)
    offset = offset + span.bytes
    span.pad = (32 - offset % 32) % 32
    offset = offset + span.pad
    spans[i] = span
  end
  local head = p.result()
  local f = assert(io.open(out, "wb"))
  f:write(head, ("\0"):rep((32 - #head % 32) % 32))
  head = nil
  for _, span in ipairs(spans) do
    if span.from then st:seek("set", span.from) end
    local left = span.bytes
    while left > 0 do
      local n = math.min(left, COPY_CHUNK)
      local piece = span.from and st:read(n) or ("\0"):rep(n)
      assert(piece and #piece == n, "gguf: " .. st_path .. " ended inside a tensor")
      assert(f:write(piece))
      left = left - n
      piece = nil
      collectgarbage()   -- each piece goes before the next is read: memory stays one piece
    end
    if span.pad > 0 then f:write(("\0"):rep(span.pad)) end
  end
  st:close()
  assert(f:close())
end

return M
