-- Tokenizer training: the C trainer's merges equal a naive Lua BPE trainer's on a small text;
-- the recipe writes files that clrt and Hugging Face tokenizers' JS port load and encode
-- identically (the parity corpus), with ChatML special tokens and chat template.
local T = require("clrt.test")
local cjson = require("cjson")
local ffi = require("ffi")
local core = require("clrt.core.ffi")

local src = T.source_dir()
local js = src .. "/tests/js"
local exists = require("clrt.files").exists
local have_js = exists(js .. "/node_modules/@lenml/tokenizers/package.json") and os.execute("node --version >/dev/null 2>&1") == 0

-- A deterministic pseudo-random text over a small alphabet, so pairs repeat and tie.
local function make_text(n, seed)
  local x = seed
  local function rnd(k) x = (x * 16807) % 2147483647; return x % k end
  local letters, words = { "a", "b", "c", "d", "e", "é", "f", "g" }, {}
  for i = 1, n do
    local w = {}
    for _ = 1, 1 + rnd(6) do
      w[#w + 1] = letters[1 + rnd(8)]
    end
    words[i] = table.concat(w)
  end
  local parts = {}
  for i = 1, n do parts[#parts + 1] = words[i]; parts[#parts + 1] = rnd(3) == 0 and "  " or " " end
  return table.concat(parts)
end

-- Naive trainer: split on the same regex by hand, recount every pair each step, take the most
-- frequent (ties: smaller left id, then smaller right id); a merge whose token exists reuses it.
local function naive_train(text, vocab_size)
  local counts = {}
  for piece in text:gmatch("[^ ]+") do counts[piece] = (counts[piece] or 0) + 1 end
  for piece in text:gmatch(" +") do counts[piece] = (counts[piece] or 0) + 1 end
  local words = {}
  for piece, c in pairs(counts) do
    local sym = {}
    for i = 1, #piece do sym[i] = piece:byte(i) end
    words[#words + 1] = { sym = sym, count = c }
  end
  local tok, id_of = {}, {}
  for b = 0, 255 do tok[b] = string.char(b); id_of[tok[b]] = b end
  local ntok, merges = 256, {}
  while ntok < vocab_size do
    local pc = {}
    for _, w in ipairs(words) do
      for i = 1, #w.sym - 1 do
        local k = w.sym[i] * 65536 + w.sym[i + 1]
        pc[k] = (pc[k] or 0) + w.count
      end
    end
    local best, bc = nil, 0
    for k, c in pairs(pc) do
      if c > bc or (c == bc and k < best) then best, bc = k, c end
    end
    if not best or bc < 2 then break end
    local a, b = math.floor(best / 65536), best % 65536
    local s = tok[a] .. tok[b]
    local m = id_of[s]
    if not m then m = ntok; tok[m] = s; id_of[s] = m; ntok = ntok + 1 end
    merges[#merges + 1] = { a, b, m }
    for _, w in ipairs(words) do
      local o, i = {}, 1
      while i <= #w.sym do
        if i < #w.sym and w.sym[i] == a and w.sym[i + 1] == b then o[#o + 1] = m; i = i + 2
        else o[#o + 1] = w.sym[i]; i = i + 1 end
      end
      w.sym = o
    end
  end
  return merges
end

T.case("C trainer merges equal a naive trainer's", function()
  local text = make_text(3000, 7)
  local want = naive_train(text, 330)
  local out = ffi.new("int32_t *[1]")
  local split = "[^ ]+| +"
  local texts = ffi.new("const char *[1]", { text })
  local lens = ffi.new("size_t[1]", { #text })
  local nm = core.C.clrt_bpe_train(texts, lens, 1, split, #split, 330, 2, out)
  T.ok(nm > 0, "trainer failed: " .. ffi.string(core.C.clrt_last_error()))
  local got = {}
  for i = 0, tonumber(nm) - 1 do got[i + 1] = { out[0][3 * i], out[0][3 * i + 1], out[0][3 * i + 2] } end
  core.C.clrt_tokenizer_free_ids(out[0])
  T.ok(#want > 50, "reference learnt too little: " .. #want)
  T.eq(got, want)
end)

T.case("training text is put in NFC first, like the tokenizer it makes", function()
  local a = clrt.tokenizer.train({ ("e\xCC\x81x "):rep(50) }, { vocab_size = 270 })
  local b = clrt.tokenizer.train({ ("\xC3\xA9x "):rep(50) }, { vocab_size = 270 })
  T.ok(#a.model.merges >= 3)
  T.eq(a.model.merges, b.model.merges)
end)

T.case("trainer errors: small vocab, bad UTF-8, bad regex", function()
  T.raises(function() clrt.tokenizer.train({ "abc" }, { vocab_size = 100 }) end, "below 256")
  T.raises(function() clrt.tokenizer.train({ "ok", "a\xff" }, { vocab_size = 300 }) end, "text 2 is not valid UTF-8 at byte 1")
  T.raises(function() clrt.tokenizer.train({ "abc" }, { vocab_size = 300, split = "(" }) end, "bad regex")
end)

local function sh(cmd)
  local log = os.tmpname()
  local rc = os.execute(cmd .. " >" .. log .. " 2>&1")
  local f = io.open(log, "rb")
  local out = f:read("*a")
  f:close()
  os.remove(log)
  return rc == 0, out
end

T.case("recipe: JSONL in, tokenizer files out; clrt and the JS port agree on the corpus", function()
  if not have_js then T.skip("tests/js/node_modules or node missing") end
  local dir = T.tmpdir()
  local corpus_path = src .. "/tests/fixtures/tokenizer/corpus.json"
  local corpus = cjson.decode(io.open(corpus_path, "rb"):read("*a"))
  -- training data: half the corpus as {"text"}, the rest as chat messages
  local f = io.open(dir .. "/train.jsonl", "wb")
  for i = 1, #corpus, 2 do f:write(cjson.encode({ text = corpus[i] }), "\n") end
  for i = 2, #corpus - 1, 4 do
    f:write(cjson.encode({ messages = { { role = "user", content = corpus[i] }, { role = "assistant", content = corpus[i + 2] } } }), "\n")
  end
  f:close()
  local bin = os.getenv("CLRT_BIN") or (src .. "/build/release/clrt")
  local ok, out = sh(("%q recipes/train_tokenizer.lua input=%q vocab_size=1000 out=%q"):format(bin, dir .. "/train.jsonl", dir .. "/tok"))
  T.ok(ok, "recipe failed: " .. out)
  local tok = clrt.tokenizer.load(dir .. "/tok")
  T.eq(tok:vocab_size(), 1000)
  T.eq({ tok:id("<|endoftext|>"), tok:id("<|im_start|>"), tok:id("<|im_end|>") }, { 997, 998, 999 })
  T.eq(tok.eos, 999)
  T.eq(tok.eot, 999)
  T.eq(clrt.chat.template_for(tok).name, "chatml")
  local ref = dir .. "/ref.json"
  T.ok(os.execute(("cd %q && node tok_ref.mjs encode %q %q %q"):format(js, dir .. "/tok", corpus_path, ref)) == 0, "node failed")
  ref = cjson.decode(io.open(ref, "rb"):read("*a"))
  local bad, first = 0, nil
  for i, text in ipairs(corpus) do
    local ids = tok:encode(text, { add_special_tokens = false })
    local a, b = table.concat(ids, ","), table.concat(ref.ids[i], ",")
    if a ~= b or tok:decode(ids) ~= ref.nfc[i] then
      bad = bad + 1
      first = first or ("%q: clrt %s js %s"):format(text, a, b)
    end
  end
  T.eq(bad, 0, "strings that differ from the JS port; first " .. tostring(first))
end)

T.case("recipe errors name the problem", function()
  local dir = T.tmpdir()
  local bin = os.getenv("CLRT_BIN") or (src .. "/build/release/clrt")
  local f = io.open(dir .. "/bad.jsonl", "wb"); f:write('{"text": "ok"}\n{"text": \n'); f:close()
  local ok, out = sh(("%q recipes/train_tokenizer.lua input=%q vocab_size=300 out=%q"):format(bin, dir .. "/bad.jsonl", dir .. "/o"))
  T.ok(not ok and out:find("line 2 is not a JSON object", 1, true), out)
  ok, out = sh(("%q recipes/train_tokenizer.lua input=%q vocab_size=10 out=%q"):format(bin, dir .. "/bad.jsonl", dir .. "/o"))
  T.ok(not ok and out:find("vocab_size must be at least 259", 1, true), out)
end)

T.run()
