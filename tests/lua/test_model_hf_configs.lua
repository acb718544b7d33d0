-- test_model_hf_configs.lua — the published config.json and generation_config.json of one
-- checkpoint per family (tests/fixtures/hf_configs: Llama 3.1 Instruct, Qwen2.5 Instruct,
-- Qwen3, Mistral 7B Instruct v0.3, Phi-3.5-mini-instruct, Phi-4-mini-instruct, Gemma 3 1B it),
-- each as transformers reads it: loaded at a scaled-down size (the head and every RoPE and
-- window key as published) with random weights, its stop ids (every eos_token_id of
-- generation_config.json ends m:generate and chat turns), its sampling defaults, its RoPE
-- (test_model_rope.lua compares the frequencies with transformers' formulas) and its windows;
-- and a saved config that transformers 5 reloads at the dtype written.
local T = require("clrt.test")
local json = require("clrt.json")
local GC = require("clrt.generation_config")
local hf = T.source_dir() .. "/tests/fixtures/hf_configs/"

local function read(name, file) return json.decode(clrt.files.read(hf .. name .. "/" .. file)) end

-- The published config at a size that runs in a moment: the head, vocabulary (every stop id is
-- a real id), positions, RoPE and window keys stay; width, depth and head counts shrink.
local function shrunk(cfg)
  local c = {}
  for k, v in pairs(cfg) do c[k] = v end
  c.head_dim = cfg.head_dim or cfg.hidden_size / cfg.num_attention_heads
  c.hidden_size, c.intermediate_size = 16, 16
  c.num_attention_heads, c.num_key_value_heads = 2, 1
  c.num_hidden_layers = cfg.model_type == "gemma3_text" and 6 or 1   -- Gemma 3: five local layers, then a global one
  return c
end

-- A folder holding the shrunk model's weights and the published generation_config.json.
local function folder(name)
  local d = T.tmpdir() .. "/" .. name
  local m = clrt.model.new(shrunk(read(name, "config.json")), { seed = 7 })
  m:save(d)
  m:free()
  local src = clrt.files.read(hf .. name .. "/generation_config.json")
  clrt.files.write_atomic(d .. "/generation_config.json", src)
  return d
end

local want = {
  ["Llama-3.1-8B-Instruct"] = { eos = { 128001, 128008, 128009 }, rope = 2, window = nil,
    defaults = { temperature = 0.6, top_p = 0.9, top_k = 50 } },
  ["Qwen2.5-7B-Instruct"] = { eos = { 151645, 151643 }, rope = 0, window = nil,
    defaults = { temperature = 0.7, top_p = 0.8, top_k = 20 }, ignored = { "repetition_penalty" } },
  ["Qwen3-0.6B"] = { eos = { 151645, 151643 }, rope = 0, window = nil, defaults = { temperature = 0.6, top_p = 0.95, top_k = 20 } },
  ["Mistral-7B-Instruct-v0.3"] = { eos = { 2 }, rope = 0, window = nil, defaults = { temperature = 0 } },
  ["Phi-3.5-mini-instruct"] = { eos = { 32007, 32001, 32000 }, rope = 4, window = nil, pad = 32000, defaults = { temperature = 0 } },
  ["Phi-4-mini-instruct"] = { eos = { 200020, 199999 }, rope = 4, window = nil, pad = 199999, defaults = { temperature = 0 }, rope_dim = 96 },
  ["gemma-3-1b-it"] = { eos = { 1, 106 }, rope = 0, window = 512, pattern = 6, pad = 0,
    defaults = { temperature = 1.0, top_p = 0.95, top_k = 64 } },
}
local names = {}
for name in pairs(want) do names[#names + 1] = name end
table.sort(names)

for _, name in ipairs(names) do
  local w = want[name]
  T.case(name .. ": loads as published; stop ids, sampling defaults, RoPE kind and window", function()
    local cfg = read(name, "config.json")
    local c = clrt.model.parse_config(cfg, name .. "/config.json")
    T.eq(c.rope_scaling, w.rope, "RoPE kind")
    T.eq(c.sliding_window, w.window, "sliding window")
    if w.pattern then T.eq(c.sliding_window_pattern, w.pattern, "Gemma 3 layer pattern") end
    T.eq(c.padding_idx, w.pad, "padding_idx")
    T.eq(c.rope_dim, w.rope_dim or c.head_dim, "rotated dimensions of a head")
    local gc = GC.read(hf .. name)
    T.eq(gc.eos_ids, w.eos, "generation_config's eos ids")
    T.eq(gc.defaults, w.defaults, "sampling defaults")
    T.eq(gc.ignored, w.ignored or {}, "settings clrt does not run")
    local d = folder(name)
    local m = clrt.model.load(d)
    T.eq(m.generation_config.eos_ids, w.eos, "model.load keeps it")
    local lp = m:logprobs({ { 5, 9, 3, 7, 11, 2 } })
    T.ok(lp:size(2) == 5, "a forward runs")
    -- every eos id stops generation: bias the row towards one and the row ends on it
    for _, id in ipairs(w.eos) do
      local r = m:generate({ { 5, 9, 3 } }, { max_new_tokens = 4, temperature = 0, logit_bias = { [id] = 100 } })[1]
      T.eq({ r.tokens[1], r.finish_reason, #r.tokens }, { id, "stop", 1 }, name .. ": eos id " .. id)
    end
    m:free()
  end)
end

T.case("partial_rotary_factor: Phi-4-mini's 0.75 rotates 96 of 128; a factor outside (0, 1] or odd dimensions are one line", function()
  local cfg = read("Phi-4-mini-instruct", "config.json")
  T.eq(clrt.model.parse_config(cfg, "config.json").rope_dim, 96)
  local function with(prf)
    local c = {}
    for k, v in pairs(cfg) do c[k] = v end
    c.partial_rotary_factor = prf
    local okp, err = pcall(clrt.model.parse_config, c, "Phi-4-mini-instruct/config.json")
    return okp, tostring(err)
  end
  for _, prf in ipairs({ 0, 1.5, -0.5, "half" }) do
    local okp, err = with(prf)
    T.ok(not okp and err:find("partial_rotary_factor", 1, true) and err:find("config.json", 1, true), tostring(prf) .. ": " .. err)
  end
  local okp, err = with(0.7)   -- int(128 * 0.7) = 89: odd
  T.ok(not okp and err:find("89", 1, true), err)
  -- 1.0 rotates the whole head: longrope's lists then need 64 factors, not Phi-4-mini's 48
  okp, err = with(1.0)
  T.ok(not okp and err:find("short_factor", 1, true) and err:find("64", 1, true), err)
end)

T.case("without generation_config.json nothing changes; a stop id beyond it is still the caller's", function()
  local d = folder("Mistral-7B-Instruct-v0.3")
  os.remove(d .. "/generation_config.json")
  local m = clrt.model.load(d)
  T.eq(m.generation_config, nil)
  local r = m:generate({ { 5, 9, 3 } }, { max_new_tokens = 3, temperature = 0, logit_bias = { [2] = 100 } })[1]
  T.eq(#r.tokens, 3, "eos 2 alone is not a stop without the file")
  T.eq(r.finish_reason, "length")
end)

T.case("clrt.chat.stop_ids: the template's end of turn, EOS and every generation_config eos id", function()
  local tok = { eot = 128009, eos = 128009, generation_config = GC.read(hf .. "Llama-3.1-8B-Instruct") }
  T.eq(clrt.chat.stop_ids(tok), { 128009, 128001, 128008 })
  T.eq(clrt.chat.stop_ids({ eot = 151645, eos = 151645 }), { 151645 })
end)

T.case("clrt serve's defaults for what a request leaves out: the folder's generation_config.json", function()
  local srv = require("clrt.net.openai_server")
  local gc = GC.read(hf .. "Qwen2.5-7B-Instruct")
  T.eq(srv.sampling_defaults({ generation_config = gc }, nil), { temperature = 0.7, top_p = 0.8, top_k = 20 })
  T.eq(srv.sampling_defaults({}, { generation_config = gc }), { temperature = 0.7, top_p = 0.8, top_k = 20 })
  T.eq(srv.sampling_defaults({}, {}), {})
end)

T.case("bad generation_config.json: one error naming the file and key", function()
  T.raises(function() GC.parse({ eos_token_id = { 1, "x" } }, "g.json") end, "g.json: key 'eos_token_id' entry 2")
  T.raises(function() GC.parse({ top_p = 2 }, "g.json") end, "key 'top_p'")
  T.raises(function() GC.parse({ do_sample = "yes" }, "g.json") end, "key 'do_sample'")
end)

T.case("absent keys take transformers' per-class defaults; rope_parameters wins over top-level keys", function()
  local mistral = read("Mistral-7B-Instruct-v0.3", "config.json")
  mistral.sliding_window = nil   -- the key absent: MistralConfig's 4096 (an explicit null: none)
  T.eq(clrt.model.parse_config(mistral, "m").sliding_window, 4096)
  local gemma = read("gemma-3-1b-it", "config.json")
  gemma.rope_theta, gemma.rope_local_base_freq = nil, nil   -- Gemma3TextConfig: 1e6 global, 1e4 local
  local g = clrt.model.parse_config(gemma, "g")
  T.eq({ g.rope_theta, g.rope_local_theta }, { 1000000, 10000 })
  gemma.pad_token_id = nil   -- Gemma3TextConfig's pad_token_id 0
  T.eq(clrt.model.parse_config(gemma, "g").padding_idx, 0)
  -- transformers 5: rope_parameters is read, a stale top-level key beside it is not
  local q = read("Qwen3-0.6B", "config.json")
  q.rope_parameters = { rope_type = "yarn", rope_theta = 5000000.0, factor = 4.0, original_max_position_embeddings = 32768 }
  local qc = clrt.model.parse_config(q, "q")
  T.eq({ qc.rope_theta, qc.rope_scaling, qc.rope_original_max_position }, { 5000000.0, 3, 32768 })
  q.partial_rotary_factor = 1.0   -- a stale top-level key: rope_parameters' own wins
  q.rope_parameters.partial_rotary_factor = 0.5
  T.eq(clrt.model.parse_config(q, "q").rope_dim, 64, "Qwen3's head_dim 128 at rope_parameters' 0.5")
  gemma.rope_parameters = { full_attention = { rope_type = "default", rope_theta = 2000000.0 },
    sliding_attention = { rope_type = "default", rope_theta = 20000.0 } }
  gemma.rope_theta, gemma.rope_local_base_freq = 1000000, 10000
  local g5 = clrt.model.parse_config(gemma, "g")
  T.eq({ g5.rope_theta, g5.rope_local_theta }, { 2000000.0, 20000.0 })
  gemma.use_bidirectional_attention = true
  T.raises(function() clrt.model.parse_config(gemma, "g") end, "key 'use_bidirectional_attention' is true")
end)

T.case("a saved model's config.json: transformers 5 reads `dtype` first, and it says float32", function()
  local cfg = shrunk(read("Qwen3-0.6B", "config.json"))
  cfg.dtype = "bfloat16"   -- what a transformers 5 checkpoint carries
  local d = T.tmpdir() .. "/saved"
  clrt.model.new(cfg, { seed = 1 }):save(d)
  local out = json.decode(clrt.files.read(d .. "/config.json"))
  T.eq({ out.dtype, out.torch_dtype }, { "float32", "float32" })
  local st = clrt.files.read(d .. "/model.safetensors")
  T.ok(st:find('"dtype":"F32"', 1, true) and not st:find('"dtype":"BF16"', 1, true), "the weights written are f32")
end)

T.run()
