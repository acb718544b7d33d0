-- Tokenizer unit tests on small hand-made tokenizer.json tables (no files needed): BPE merge
-- order and ties, added tokens (lstrip/rstrip, special skipping), BOS templates, Oniguruma's
-- \s, GPT-2 ByteLevel regex + prefix space, Digits, streaming decode, lossy decode, and the
-- errors for malformed or unsupported files.
local T = require("clrt.test")
local cjson = require("cjson")
local tokenizer = clrt.tokenizer

-- GPT-2 byte-level spelling of raw bytes.
local BL = {}
do
  local n = 256
  for b = 0, 255 do
    local printable = (b >= 33 and b <= 126) or (b >= 161 and b <= 172) or b >= 174
    local cp = printable and b or n
    if not printable then n = n + 1 end
    BL[b] = cp < 0x80 and string.char(cp) or string.char(0xC0 + math.floor(cp / 64), 0x80 + cp % 64)
  end
end
local function spell(s) return (s:gsub(".", function(c) return BL[c:byte()] end)) end

-- vocab: 256 bytes (id = byte) + merged tokens, ids in merge order.
local function tiny(merges, extra)
  local vocab, ml, next_id = {}, {}, 256
  for b = 0, 255 do vocab[BL[b]] = b end
  for _, m in ipairs(merges) do
    local a, b = spell(m[1]), spell(m[2])
    ml[#ml + 1] = { a, b }
    if not vocab[a .. b] then vocab[a .. b] = next_id; next_id = next_id + 1 end
  end
  local tj = {
    model = { type = "BPE", vocab = vocab, merges = ml },
    pre_tokenizer = { type = "Sequence", pretokenizers = {
      { type = "Split", pattern = { Regex = [[\s+|\S+]] }, behavior = "Isolated", invert = false },
      { type = "ByteLevel", add_prefix_space = false, use_regex = false } } },
    decoder = { type = "ByteLevel" },
    added_tokens = {},
  }
  for k, v in pairs(extra or {}) do tj[k] = v end
  return tokenizer.from_json(tj, {}, "test"), vocab
end

T.case("BPE applies merges by rank, leftmost first on ties", function()
  local tok, v = tiny({ { "l", "l" }, { "h", "e" }, { "he", "ll" }, { "e", "l" } })
  local id = function(s) return v[spell(s)] end
  T.eq(tok:encode("hello"), { id("hell"), id("o") })
  T.eq(tok:encode("hel"), { id("he"), id("l") })
  T.eq(tok:encode("ell"), { id("e"), id("ll") })
  T.eq(tok:encode("lll"), { id("ll"), id("l") })
  T.eq(tok:encode("llll"), { id("ll"), id("ll") })
  T.eq(tok:encode(""), {})
  -- the piece cache gives the same answer the second time
  T.eq(tok:encode("hello hello"), { id("hell"), id("o"), 32, id("hell"), id("o") })
  T.eq(tok:decode(tok:encode("hello hello")), "hello hello")
end)

T.case("ignore_merges takes a whole piece that is in the vocab", function()
  -- "abc" is in the vocab (via a+bc) but BPE on "abc" merges a+b first and gets stuck
  local merges = { { "a", "b" }, { "b", "c" }, { "a", "bc" } }
  local tok, v = tiny(merges)
  T.eq(tok:encode("abc"), { v[spell("ab")], 99 })
  local vocab, ml = {}, {}
  for k, id in pairs(v) do vocab[k] = id end
  for _, m in ipairs(merges) do ml[#ml + 1] = { spell(m[1]), spell(m[2]) } end
  local tok3 = tokenizer.from_json({
    model = { type = "BPE", vocab = vocab, merges = ml, ignore_merges = true },
    pre_tokenizer = { type = "ByteLevel", add_prefix_space = false, use_regex = false },
  }, {}, "test")
  T.eq(tok3:encode("abc"), { v[spell("abc")] })
end)

T.case("added tokens: matched before splitting, longest first, lstrip/rstrip, skip on decode", function()
  local tok = tiny({}, { added_tokens = {
    { id = 300, content = "<m>", special = true, lstrip = true, rstrip = true },
    { id = 301, content = "<m>x", special = false },
    { id = 302, content = "[s]", special = true },
  } })
  T.eq(tok:encode("a  <m>  b"), { 97, 300, 98 })
  T.eq(tok:encode("<m>xy"), { 301, 121 })
  T.eq(tok:encode("q[s]r"), { 113, 302, 114 })
  T.eq(tok:decode({ 113, 302, 114 }), "q[s]r")
  T.eq(tok:decode({ 113, 302, 301, 114 }, { skip_special_tokens = true }), "q<m>xr")
  T.ok(tok:is_special(302) and not tok:is_special(301) and not tok:is_special(97))
  T.eq(tok:id("<m>x"), 301)
  T.eq(tok:token(302), "[s]")
end)

T.case("single_word added tokens match only where no word character touches them", function()
  local tok = tiny({}, { added_tokens = { { id = 300, content = "<w>", special = true, single_word = true } } })
  T.eq(tok:encode("a <w> b"), { 97, 32, 300, 32, 98 })
  T.eq(tok:encode("<w>"), { 300 })
  T.eq(tok:encode("(<w>)"), { 40, 300, 41 })
  T.eq(tok:encode("a<w>"), { 97, 60, 119, 62 })
  T.eq(tok:encode("<w>\195\169"), { 60, 119, 62, 195, 169 })   -- é is a letter
  T.eq(tok:encode("x<w> <w>"), { 120, 60, 119, 62, 32, 300 })
end)

T.case("TemplateProcessing adds BOS unless add_special_tokens = false", function()
  local tok = tiny({}, {
    added_tokens = { { id = 256, content = "<s>", special = true } },
    post_processor = { type = "Sequence", processors = {
      { type = "ByteLevel" },
      { type = "TemplateProcessing", single = { { SpecialToken = { id = "<s>", type_id = 0 } }, { Sequence = { id = "A", type_id = 0 } } },
        special_tokens = { ["<s>"] = { id = "<s>", ids = { 256 }, tokens = { "<s>" } } } } } },
  })
  T.eq(tok:encode("hi"), { 256, 104, 105 })
  T.eq(tok:encode("hi", { add_special_tokens = false }), { 104, 105 })
  T.eq(tok:encode_batch({ "hi", "" }), { { 256, 104, 105 }, { 256 } })
end)

T.case("\\s means Oniguruma's whitespace (U+0085 included), as Hugging Face compiles it", function()
  -- merges that can only apply if "a" and U+0085 (C2 85) stay in one piece
  local tok, v = tiny({ { "a", "\xC2" }, { "\xC2", "\x85" } })
  T.eq(tok:encode("a\xC2\x85b"), { 97, v[spell("\xC2\x85")], 98 })
  -- U+00A0 and U+3000 are whitespace in both engines
  T.eq(#tok:encode("a\xC2\xA0b"), 4)
end)

T.case("ByteLevel with use_regex applies GPT-2's split and add_prefix_space", function()
  local vocab = {}
  for b = 0, 255 do vocab[BL[b]] = b end
  vocab[spell(" h")] = 256
  local tok = tokenizer.from_json({
    model = { type = "BPE", vocab = vocab, merges = { { spell(" "), "h" } } },
    pre_tokenizer = { type = "ByteLevel", add_prefix_space = true, use_regex = true },
  }, {}, "test")
  -- " hi's" pieces: " hi", "'s" -> [ h][i]['][s]
  T.eq(tok:encode("hi's"), { 256, 105, 39, 115 })
  T.eq(tok:encode(" hi"), { 256, 105 })
end)

T.case("Digits pre-tokenizer splits numbers", function()
  local vocab = {}
  for b = 0, 255 do vocab[BL[b]] = b end
  vocab["12"] = 256
  local tj = {
    model = { type = "BPE", vocab = vocab, merges = { { "1", "2" } } },
    pre_tokenizer = { type = "Sequence", pretokenizers = { { type = "Digits", individual_digits = false },
      { type = "ByteLevel", use_regex = false } } },
  }
  T.eq(tokenizer.from_json(tj, {}, "t"):encode("a12b"), { 97, 256, 98 })
  tj.pre_tokenizer.pretokenizers[1].individual_digits = true
  T.eq(tokenizer.from_json(tj, {}, "t"):encode("a12b"), { 97, 49, 50, 98 })
end)

T.case("streaming decode never emits half a UTF-8 character", function()
  local tok = tiny({})
  local text = "héllo 你好 👍🏽 done"
  local ids = tok:encode(text)
  T.eq(#ids, #text)                     -- every byte its own token here
  local st, parts = tok:stream(), {}
  for _, id in ipairs(ids) do
    local s = st:push(id)
    T.ok(not s:find("\xEF\xBF\xBD", 1, true), "emitted a replacement character")
    T.ok(tonumber(require("ffi").C.clrt_utf8_complete_prefix(s, #s)) == #s, "emitted a partial character")
    parts[#parts + 1] = s
  end
  parts[#parts + 1] = st:finish()
  T.eq(table.concat(parts), text)
  -- an incomplete tail is flushed as U+FFFD at finish
  local st2 = tok:stream()
  T.eq(st2:push(0xE4) .. st2:push(0xB8), "")
  T.eq(st2:finish(), "\xEF\xBF\xBD")
end)

T.case("decode replaces invalid UTF-8 like Rust's from_utf8_lossy", function()
  local tok = tiny({})
  T.eq(tok:decode({ 0xE4, 0xB8, 97 }), "\xEF\xBF\xBDa")          -- one truncated sequence
  T.eq(tok:decode({ 0xFF, 0x80, 97 }), "\xEF\xBF\xBD\xEF\xBF\xBDa") -- two lone bytes
  T.eq(tok:decode({ 0xED, 0xA0, 0x80 }), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD") -- a surrogate
  T.raises(function() tok:decode({ 97, 99999 }) end, "id 99999 at position 1 is not in the vocabulary")
end)

T.case("invalid UTF-8 input is an error naming the byte", function()
  local tok = tiny({})
  T.raises(function() tok:encode("ok\xC3(") end, "not valid UTF-8 at byte 2")
  T.raises(function() tok:encode_batch({ "fine", "bad\xFF" }) end, "text 2")
end)

T.case("token and id use tokenizer.json's spelling", function()
  local tok, v = tiny({ { " ", "w" } })
  T.eq(tok:id("Ġw"), v["Ġw"])
  T.eq(tok:token(v["Ġw"]), "Ġw")
  T.eq(tok:token_bytes(v["Ġw"]), " w")
  T.eq(tok:id("nope-not-a-token"), nil)
  T.eq(tok:vocab_size(), 257)
end)

-- Malformed and unsupported files -----------------------------------------------------------
local function write(dir, name, text)
  local f = io.open(dir .. "/" .. name, "wb"); f:write(text); f:close()
  return dir .. "/" .. name
end

local function base_json()
  local vocab = {}
  for b = 0, 255 do vocab[BL[b]] = b end
  return { model = { type = "BPE", vocab = vocab, merges = {} },
    pre_tokenizer = { type = "ByteLevel", add_prefix_space = false, use_regex = true },
    decoder = { type = "ByteLevel" }, normalizer = cjson.null, added_tokens = {} }
end

T.case("malformed files give clear errors naming the file and the part", function()
  local dir = T.tmpdir()
  local p = write(dir, "notjson.json", "{ this is not json")
  T.raises(function() tokenizer.load(p) end, "notjson.json is not valid JSON")
  T.raises(function() tokenizer.load(dir .. "/missing.json") end, "cannot read")
  T.raises(function() tokenizer.load(dir) end, "folder without tokenizer.json")

  local tj = base_json(); tj.model = nil
  p = write(dir, "nomodel.json", cjson.encode(tj))
  T.raises(function() tokenizer.load(p) end, "nomodel.json: missing \"model\"")

  tj = base_json(); tj.model.merges = { "Ġ zzzq" }
  p = write(dir, "badmerge.json", cjson.encode(tj))
  T.raises(function() tokenizer.load(p) end, "merge 0 names \"zzzq\", which is not in the vocab")

  tj = base_json(); tj.pre_tokenizer = { type = "Whitespace" }
  p = write(dir, "badpre.json", cjson.encode(tj))
  T.raises(function() tokenizer.load(p) end, "badpre.json: pre_tokenizer: unsupported pre_tokenizer type \"Whitespace\"")

  -- errors name the component's path in the file
  tj = base_json(); tj.normalizer = { type = "Sequence", normalizers = { { type = "NFC" }, { type = "Lowercase" } } }
  p = write(dir, "badnorm.json", cjson.encode(tj))
  T.raises(function() tokenizer.load(p) end, "badnorm.json: normalizer.normalizers[2]: unsupported normalizer type \"Lowercase\"")

  tj = base_json(); tj.normalizer = { type = "Replace", pattern = { Regex = " +" }, content = "_" }
  p = write(dir, "badrepl.json", cjson.encode(tj))
  T.raises(function() tokenizer.load(p) end, "normalizer: a Regex pattern is not supported here")

  tj = base_json(); tj.normalizer = { type = "Prepend" }
  p = write(dir, "badprep.json", cjson.encode(tj))
  T.raises(function() tokenizer.load(p) end, "normalizer: prepend must be a string, got nil")

  tj = base_json(); tj.decoder = { type = "Sequence", decoders = { { type = "ByteLevel" }, { type = "WordPiece" } } }
  p = write(dir, "baddec.json", cjson.encode(tj))
  T.raises(function() tokenizer.load(p) end, "decoder.decoders[2]: unsupported decoder type \"WordPiece\"")

  tj = base_json(); tj.decoder = { type = "Sequence", decoders = "oops" }
  p = write(dir, "baddec2.json", cjson.encode(tj))
  T.raises(function() tokenizer.load(p) end, "decoder: decoders must be a list")

  tj = base_json(); tj.pre_tokenizer = { type = "Sequence", pretokenizers = {
    { type = "ByteLevel", use_regex = false }, { type = "Metaspace", replacement = "_", prepend_scheme = "sometimes" } } }
  p = write(dir, "badmeta.json", cjson.encode(tj))
  T.raises(function() tokenizer.load(p) end, "pre_tokenizer.pretokenizers[2]: unknown Metaspace prepend_scheme \"sometimes\"")

  tj = base_json(); tj.model.merges[1] = 7
  p = write(dir, "badmerge2.json", cjson.encode(tj))
  T.raises(function() tokenizer.load(p) end, "model.merges[1]: is not a pair of tokens")

  tj = base_json(); tj.model.type = "Unigram"
  p = write(dir, "badmodel.json", cjson.encode(tj))
  T.raises(function() tokenizer.load(p) end, "unsupported model type \"Unigram\"")

  tj = base_json(); tj.post_processor = { type = "BertProcessing" }
  p = write(dir, "badpost.json", cjson.encode(tj))
  T.raises(function() tokenizer.load(p) end, "unsupported post_processor type \"BertProcessing\"")

  tj = base_json(); tj.model.vocab[BL[7]] = nil
  p = write(dir, "nobyte.json", cjson.encode(tj))
  T.raises(function() tokenizer.load(p) end, "no token for byte 0x07")

  tj = base_json(); tj.pre_tokenizer = { type = "Sequence", pretokenizers = {
    { type = "Split", pattern = { Regex = "(" }, behavior = "Isolated" }, { type = "ByteLevel", use_regex = false } } }
  p = write(dir, "badregex.json", cjson.encode(tj))
  T.raises(function() tokenizer.load(p) end, "bad regex (")

  tj = base_json(); tj.pre_tokenizer = { type = "Split", pattern = { Regex = "x" }, behavior = "Contiguous" }
  p = write(dir, "contig.json", cjson.encode(tj))
  T.raises(function() tokenizer.load(p) end, "pre_tokenizer: unsupported Split behavior \"Contiguous\"")

  tj = base_json(); tj.added_tokens = { { id = "400", content = "<x>" } }
  p = write(dir, "badadded.json", cjson.encode(tj))
  T.raises(function() tokenizer.load(p) end, "added_tokens[1]: needs content (a string) and id (a number)")

  -- a folder with a good file loads, and reads tokenizer_config.json beside it
  tj = base_json()
  tj.added_tokens = { { id = 256, content = "<|im_end|>", special = true } }
  write(dir, "tokenizer.json", cjson.encode(tj))
  write(dir, "tokenizer_config.json", cjson.encode({ eos_token = { content = "<|im_end|>" } }))
  local tok = tokenizer.load(dir)
  T.eq(tok.eos, 256)
  T.eq(tok.eot, 256)
  write(dir, "tokenizer_config.json", "[oops")
  T.raises(function() tokenizer.load(dir) end, "tokenizer_config.json is not valid JSON")
end)

T.run()
