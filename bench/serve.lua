-- bench/serve.lua — `clrt serve` under load: requests/s and time to first token (median, p90)
-- at concurrency 1, 8 and 32, streamed chat completions of max_tokens each, next to
-- llama.cpp's llama-server on the same random weights (written as GGUF by bench/gguf.lua)
-- when one is given, printed as ratios.
--   clrt bench/serve.lua [n=64] [max_tokens=32] [levels=1,8,32] [threads=2] [peer=/path/to/llama-server]
--                        [quant=int8] [quantize=/path/to/llama-quantize]
-- quant=int8: clrt serves with --quant int8 (docs/quantization.md) and llama-server gets the
-- GGUF quantized to Q8_0 by llama.cpp's own llama-quantize (quantize=, default beside peer;
-- bench/build_llama_server.sh builds both). Timings need a quiet machine.
-- The model is a ~15M-parameter Qwen2 shape (384 wide, 6 layers, 1024 MLP) over a byte-level
-- BPE trained here; both servers get the same threads and 32 parallel slots. llama-server is
-- not shipped as a program anywhere here: node-llama-cpp bundles llama.cpp's source and
-- prebuilt libraries, and its server can be compiled from them (see the README's serve note).
local bench_args = dofile((debug.getinfo(1, "S").source:sub(2):match("^(.*)/") or ".") .. "/args.lua")
local opts = bench_args.parse({ n = 64, max_tokens = 32, levels = "1,8,32", threads = 2, peer = os.getenv("LLAMA_SERVER") or "",
  quant = "none", quantize = "" }, arg)
if opts.quant ~= "none" and opts.quant ~= "int8" then error("bench/serve.lua: quant=" .. tostring(opts.quant) .. ": none or int8", 0) end
if opts.quantize == "" and opts.peer ~= "" then opts.quantize = (opts.peer:match("^(.*)/") or ".") .. "/llama-quantize" end
local levels = bench_args.numbers(opts.levels)
local src = os.getenv("CLRT_SOURCE_DIR") or debug.getinfo(1, "S").source:sub(2):match("^(.*)/bench/[^/]*$") or "."
package.path = src .. "/bench/?.lua;" .. package.path
local bin = os.getenv("CLRT_BIN") or arg[-1]
local cjson = require("cjson")

local function sh(cmd) return os.execute(cmd) == 0 end
local function slurp(p) local f = io.open(p) if not f then return nil end local s = f:read("*a") f:close() return s end
if not sh("command -v node > /dev/null 2>&1") then print("bench/serve.lua needs node for its load generator") os.exit(1) end

local dir = os.tmpname()
os.remove(dir)
clrt.files.mkdir_p(dir)
local pids = {}
local function cleanup()
  for _, pid in ipairs(pids) do sh("kill " .. pid .. " 2>/dev/null") end
  clrt.files.remove_tree(dir)
end

-- the model folder: a tokenizer trained on generated text, random weights
local words = { "city", "sea", "name", "good", "what", "is", "a", "by", "the", "port", "harbor", "bay", "north",
  "river", "hill", "stone", "light", "new", "old", "green", "bridge", "market", "tower", "garden", "request" }
local f = assert(io.open(dir .. "/corpus.txt", "w"))
for i = 1, 4000 do
  f:write(words[i % #words + 1], " ", words[(i * 7) % #words + 1], " ", words[(i * 13) % #words + 1], " ",
    words[(i * 17) % #words + 1], ". ", i, "\n")
end
f:close()
assert(sh(("%s %s/lua/recipes/train_tokenizer.lua input=%s/corpus.txt vocab_size=1024 out=%s/model > /dev/null")
  :format(bin, src, dir, dir)), "training the tokenizer failed")
local tok = clrt.tokenizer.load(dir .. "/model")
local m = clrt.model.new({ architectures = { "Qwen2ForCausalLM" }, vocab_size = tok:vocab_size(), hidden_size = 384,
  intermediate_size = 1024, num_hidden_layers = 6, num_attention_heads = 6, num_key_value_heads = 6,
  max_position_embeddings = 512, rms_norm_eps = 1e-6, rope_theta = 10000, tie_word_embeddings = true }, { seed = 1 })
m:save(dir .. "/model")
m = nil
collectgarbage()

local function wait_port(log, pattern)
  for _ = 1, 600 do
    local s = slurp(log) or ""
    local p = s:match(pattern)
    if p then return p end
    sh("sleep 0.1")
  end
  return nil
end

local function start(cmd, log)
  local h = io.popen(cmd .. " > " .. log .. " 2>&1 & echo $!")
  local pid = h:read("*l")
  h:close()
  pids[#pids + 1] = pid
  return pid
end

math.randomseed(os.time() + math.floor(os.clock() * 1e6))
local servers = {}
start(("OMP_NUM_THREADS=%d %s serve %s/model --port 0 --slots 32 --max-len 512 --served-model-name bench --quant %s")
  :format(opts.threads, bin, dir, opts.quant), dir .. "/clrt.log")
local port = wait_port(dir .. "/clrt.log", "http://127%.0%.0%.1:(%d+)/v1")
if not port then cleanup() error("clrt serve did not start: " .. (slurp(dir .. "/clrt.log") or "")) end
servers[1] = { name = "clrt serve", base = "http://127.0.0.1:" .. port .. "/v1" }

local peer_note
if opts.peer ~= "" and sh("test -x " .. opts.peer) then
  require("gguf").write(dir .. "/model", dir .. "/model.gguf")
  local gguf_file = dir .. "/model.gguf"
  if opts.quant == "int8" then   -- Q8_0 (blocks of 32 int8 with one scale), by llama.cpp's own tool
    if not sh("test -x " .. opts.quantize) then
      cleanup()
      error("bench/serve.lua quant=int8: no llama-quantize at " .. opts.quantize .. " (quantize=PATH; bench/build_llama_server.sh builds it)", 0)
    end
    assert(sh(("%s %s %s/model-q8_0.gguf Q8_0 %d > %s/quantize.log 2>&1"):format(opts.quantize, gguf_file, dir, opts.threads, dir)),
      "llama-quantize failed: " .. (slurp(dir .. "/quantize.log") or ""))
    gguf_file = dir .. "/model-q8_0.gguf"
  end
  local pport = 18000 + math.random(0, 999)
  start(("%s -m %s --host 127.0.0.1 --port %d -np 32 -c %d -t %d -tb %d --no-webui --jinja")
    :format(opts.peer, gguf_file, pport, 32 * 512, opts.threads, opts.threads), dir .. "/peer.log")
  local ok = false
  for _ = 1, 600 do
    if sh(("curl -sf http://127.0.0.1:%d/health > /dev/null 2>&1"):format(pport)) then ok = true break end
    sh("sleep 0.1")
  end
  if ok then
    servers[2] = { name = "llama-server", base = ("http://127.0.0.1:%d/v1"):format(pport), extra = '{"ignore_eos":false}' }
  else
    peer_note = "llama-server did not start: " .. (slurp(dir .. "/peer.log") or ""):sub(-400)
  end
else
  peer_note = "no peer: llama.cpp's llama-server is not installed here (peer=/path/to/llama-server or LLAMA_SERVER)"
end

local function quantile(xs, q)
  table.sort(xs)
  return xs[math.max(1, math.ceil(q * #xs))]
end

local function load(s, conc, n)
  local cmd = ("node %s/bench/serve_load.mjs %s bench %d %d %d %s 2>&1"):format(src, s.base, conc, n or math.max(opts.n, conc),
    opts.max_tokens, s.extra and ("'" .. s.extra .. "'") or "")
  local h = io.popen(cmd)
  local out = h:read("*a")
  h:close()
  local ok, r = pcall(cjson.decode, out:match("{.*}") or "")
  if not ok or type(r) ~= "table" or not r.wall then error(s.name .. " load failed: " .. out) end
  return r
end

local main = function()
print(("bench/serve.lua: %d streamed requests per level, max_tokens %d, %d threads; model 15M-shape Qwen2, vocab %d; weights %s")
  :format(opts.n, opts.max_tokens, opts.threads, tok:vocab_size(),
    opts.quant == "int8" and "int8 (clrt --quant int8, llama.cpp Q8_0)" or "f32"))
print(("%-13s %5s %9s %9s %11s %11s"):format("server", "conc", "req/s", "tok/s", "ttft p50 ms", "ttft p90 ms"))
local rows = {}
for _, s in ipairs(servers) do load(s, 2, 4) end   -- warm-up: first allocations, page-ins
for _, conc in ipairs(levels) do
  for i, s in ipairs(servers) do
    local r = load(s, conc)
    local row = { rps = r.ok / r.wall, tps = r.tokens / r.wall, p50 = quantile(r.ttft, 0.5) * 1000, p90 = quantile(r.ttft, 0.9) * 1000 }
    rows[conc .. ":" .. i] = row
    print(("%-13s %5d %9.1f %9.0f %11.1f %11.1f"):format(s.name, conc, row.rps, row.tps, row.p50, row.p90))
  end
  if servers[2] then
    local a, b = rows[conc .. ":1"], rows[conc .. ":2"]
    print(("%-13s %5d %8.2fx %8.2fx %10.2fx %10.2fx   (clrt / llama-server; ttft: llama / clrt)")
      :format("ratio", conc, a.rps / b.rps, a.tps / b.tps, b.p50 / a.p50, b.p90 / a.p90))
  end
end
end
local ok, err = pcall(main)
if peer_note then print(peer_note) end
cleanup()
if not ok then error(err, 0) end
