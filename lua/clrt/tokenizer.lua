-- clrt.tokenizer — Hugging Face tokenizer.json (BPE, byte-level or SentencePiece-style) in C:
-- load a model folder, encode/decode with the same ids as the Hugging Face tokenizers,
-- stream-decode. Supported families and components: docs/models.md.
--   local tok = clrt.tokenizer.load("models/Qwen3-0.6B")      -- folder or tokenizer.json
--   local ids = tok:encode("Hello", {add_special_tokens = false})
--   print(tok:decode(ids), tok:vocab_size(), tok.eos, tok.eot)
-- The file is parsed here (clrt.json) and handed to runtime/tokenizer*.c piece by piece; every
-- component the C side does not implement is an error naming it, never a silent difference.
local ffi = require("ffi")
local core = require("clrt.core.ffi")
local json = require("clrt.json")
local C = core.C

local M = {}
local Tokenizer = {}
Tokenizer.__index = Tokenizer
-- a tokenizer at the REPL prompt: what it is, not its fields
Tokenizer.__tostring = function(t)
  return ("clrt.tokenizer(vocab %d%s)"):format(t.n_vocab or 0, t.where and (", " .. tostring(t.where)) or "")
end
M.Tokenizer = Tokenizer

-- GPT-4's split (cl100k), used by train(); the same one Llama 3 ships.
M.GPT4_SPLIT = [[(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+]]
-- GPT-2's split, what a ByteLevel pre-tokenizer with use_regex = true applies.
M.GPT2_SPLIT = [['s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+]]

local null = json.null
local function isnull(v) return v == nil or v == null end

local function read_file(path)
  local f, err = io.open(path, "rb")
  if not f then return nil, err end
  local s = f:read("*a")
  f:close()
  return s
end

local function decode_json(path, text)
  local ok, obj = pcall(json.decode, text)
  if not ok then error(("tokenizer: %s is not valid JSON: %s"):format(path, tostring(obj)), 0) end
  if type(obj) ~= "table" then error(("tokenizer: %s is JSON but not an object"):format(path), 0) end
  return obj
end

-- Escape a literal for a regex (Split with a String pattern).
local function regex_escape(s) return (s:gsub("[%^%$%(%)%%%.%[%]%*%+%-%?%{%}|\\/]", "\\%0")) end

-- Errors name the component and where it sits in the file: "normalizer.normalizers[2]".
local function fail(where, path, msg, ...)
  error(("tokenizer: %s: %s: " .. msg):format(where, path, ...), 0)
end

local function want_string(v, where, path, field)
  if type(v) ~= "string" then fail(where, path, "%s must be a string, got %s", field, v == null and "null" or type(v)) end
  return v
end

local function want_list(v, where, path, field)
  if type(v) ~= "table" then fail(where, path, "%s must be a list", field) end
  return v
end

-- A Split/Replace pattern that must be a literal String; Regex patterns are named as unsupported.
local function literal_pattern(p, where, path)
  if type(p) ~= "table" then fail(where, path, "pattern must be an object with String or Regex") end
  if type(p.String) == "string" then return p.String end
  if type(p.Regex) == "string" then fail(where, path, "a Regex pattern is not supported here (only String)") end
  fail(where, path, "pattern must be an object with String or Regex")
end

local SPLIT_BEHAVIOR = { Isolated = 0, Removed = 1, MergedWithPrevious = 2, MergedWithNext = 3 }
local PREPEND_SCHEME = { never = 0, first = 1, always = 2 }

-- Metaspace's prepend scheme; files before tokenizers 0.19 say add_prefix_space instead.
local function metaspace_scheme(pt, where, path)
  if pt.add_prefix_space == false then return 0 end
  if isnull(pt.prepend_scheme) then return 2 end
  local s = PREPEND_SCHEME[pt.prepend_scheme]
  if not s then fail(where, path, "unknown Metaspace prepend_scheme %q (first, always, never)", tostring(pt.prepend_scheme)) end
  return s
end

-- Walk the pre_tokenizer tree into a flat list of stages plus the ByteLevel/Metaspace settings.
local function flatten_pretok(pt, where, path, out)
  if isnull(pt) then return end
  if type(pt) ~= "table" then fail(where, path, "must be an object") end
  local ty = pt.type
  if ty == "Sequence" then
    for i, p in ipairs(want_list(pt.pretokenizers, where, path, "pretokenizers")) do
      flatten_pretok(p, where, ("%s.pretokenizers[%d]"):format(path, i), out)
    end
  elseif ty == "Split" then
    local pat = pt.pattern
    if type(pat) ~= "table" then fail(where, path, "Split pre_tokenizer has no pattern") end
    local rx
    if type(pat.Regex) == "string" then rx = pat.Regex
    elseif type(pat.String) == "string" then rx = regex_escape(pat.String)
    else fail(where, path, "Split pattern must be Regex or String") end
    local behavior = SPLIT_BEHAVIOR[pt.behavior]
    if not behavior then
      fail(where, path, "unsupported Split behavior %q (supported: Isolated, Removed, MergedWithPrevious, MergedWithNext)",
        tostring(pt.behavior))
    end
    if pt.invert == true then fail(where, path, "unsupported Split with invert = true") end
    out.splits[#out.splits + 1] = { rx = rx, behavior = behavior, path = path }
  elseif ty == "ByteLevel" then
    if out.byte_level then fail(where, path, "more than one ByteLevel pre_tokenizer") end
    out.byte_level = true
    if pt.add_prefix_space == true then
      if #out.splits > 0 then fail(where, path, "unsupported ByteLevel add_prefix_space after a Split") end
      out.add_prefix_space = true
    end
    if pt.use_regex ~= false then out.splits[#out.splits + 1] = { rx = M.GPT2_SPLIT, behavior = 0, path = path } end
  elseif ty == "Digits" then
    out.splits[#out.splits + 1] = { rx = pt.individual_digits and [[\p{N}]] or [[\p{N}+]], behavior = 0, path = path }
  elseif ty == "Metaspace" then
    if out.metaspace then fail(where, path, "more than one Metaspace pre_tokenizer") end
    if #out.splits > 0 then fail(where, path, "a Metaspace after a Split is not supported") end
    local rep = want_string(pt.replacement, where, path, "replacement")
    out.metaspace = { rep = rep, scheme = metaspace_scheme(pt, where, path), split = pt.split ~= false, path = path }
  else
    fail(where, path, "unsupported pre_tokenizer type %q (supported: Sequence, Split, ByteLevel, Digits, Metaspace)",
      tostring(ty))
  end
end

local UNICODE_FORMS = { NFC = "nfc", NFD = "nfd", NFKC = "nfkc", NFKD = "nfkd" }

-- The normalizer tree -> a flat list of steps { kind, a, b, left, right, path }.
local function flatten_normalizer(n, where, path, out)
  if isnull(n) then return out end
  if type(n) ~= "table" then fail(where, path, "must be an object") end
  local ty = n.type
  if ty == "Sequence" then
    for i, x in ipairs(want_list(n.normalizers, where, path, "normalizers")) do
      flatten_normalizer(x, where, ("%s.normalizers[%d]"):format(path, i), out)
    end
  elseif UNICODE_FORMS[ty] then
    out[#out + 1] = { kind = UNICODE_FORMS[ty], path = path }
  elseif ty == "Prepend" then
    out[#out + 1] = { kind = "prepend", a = want_string(n.prepend, where, path, "prepend"), path = path }
  elseif ty == "Replace" then
    out[#out + 1] = { kind = "replace", a = literal_pattern(n.pattern, where, path),
      b = want_string(n.content, where, path, "content"), path = path }
  elseif ty == "Strip" then
    out[#out + 1] = { kind = "strip", left = n.strip_left ~= false, right = n.strip_right ~= false, path = path }
  else
    fail(where, path, "unsupported normalizer type %q (supported: Sequence, NFC, NFD, NFKC, NFKD, Prepend, Replace, Strip)",
      tostring(ty))
  end
  return out
end

-- The decoder tree -> a flat list of steps { kind, a, b, start, stop, path }.
local function flatten_decoder(d, where, path, out)
  if isnull(d) then return out end
  if type(d) ~= "table" then fail(where, path, "must be an object") end
  local ty = d.type
  if ty == "Sequence" then
    for i, x in ipairs(want_list(d.decoders, where, path, "decoders")) do
      flatten_decoder(x, where, ("%s.decoders[%d]"):format(path, i), out)
    end
  elseif ty == "ByteLevel" then
    out[#out + 1] = { kind = "byte_level", path = path }
  elseif ty == "Replace" then
    out[#out + 1] = { kind = "replace", a = literal_pattern(d.pattern, where, path),
      b = want_string(d.content, where, path, "content"), path = path }
  elseif ty == "ByteFallback" then
    out[#out + 1] = { kind = "byte_fallback", path = path }
  elseif ty == "Fuse" then
    out[#out + 1] = { kind = "fuse", path = path }
  elseif ty == "Strip" then
    local content = want_string(d.content, where, path, "content")
    if type(d.start) ~= "number" or type(d.stop) ~= "number" then fail(where, path, "Strip needs numbers start and stop") end
    out[#out + 1] = { kind = "strip", a = content, start = d.start, stop = d.stop, path = path }
  elseif ty == "Metaspace" then
    out[#out + 1] = { kind = "metaspace", a = want_string(d.replacement, where, path, "replacement"),
      start = metaspace_scheme(d, where, path) ~= 0 and 1 or 0, path = path }
  else
    fail(where, path, "unsupported decoder type %q (supported: Sequence, ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace)",
      tostring(ty))
  end
  return out
end

-- TemplateProcessing's "single" template -> ids before and after the sequence.
local function parse_post(p, where, path, out)
  if isnull(p) then return end
  if type(p) ~= "table" then fail(where, path, "must be an object") end
  if p.type == "ByteLevel" then return end
  if p.type == "Sequence" then
    for i, x in ipairs(want_list(p.processors, where, path, "processors")) do
      parse_post(x, where, ("%s.processors[%d]"):format(path, i), out)
    end
    return
  end
  if p.type ~= "TemplateProcessing" then
    fail(where, path, "unsupported post_processor type %q (supported: TemplateProcessing, ByteLevel, Sequence)", tostring(p.type))
  end
  local prefix, suffix, seen_seq = {}, {}, false
  for i, piece in ipairs(want_list(p.single, where, path, "single")) do
    if type(piece) == "table" and piece.Sequence then
      seen_seq = true
    elseif type(piece) == "table" and type(piece.SpecialToken) == "table" then
      local name = piece.SpecialToken.id
      local st = type(p.special_tokens) == "table" and p.special_tokens[name]
      if type(st) ~= "table" or type(st.ids) ~= "table" then
        fail(where, ("%s.single[%d]"):format(path, i), "template names special token %q with no ids", tostring(name))
      end
      for _, id in ipairs(st.ids) do
        local list = seen_seq and suffix or prefix
        list[#list + 1] = id
      end
    else
      fail(where, ("%s.single[%d]"):format(path, i), "template piece is neither Sequence nor SpecialToken")
    end
  end
  out.prefix, out.suffix = prefix, suffix
end

local function token_content(v)
  if type(v) == "string" then return v end
  if type(v) == "table" and type(v.content) == "string" then return v.content end
  return nil
end

-- Build a tokenizer from parsed tokenizer.json (+ optional tokenizer_config.json) tables.
function M.from_json(tj, config, where, config_where)
  where = where or "tokenizer.json"
  config = config or {}
  local model = tj.model
  if type(model) ~= "table" then error(("tokenizer: %s: missing \"model\""):format(where), 0) end
  if model.type ~= nil and model.type ~= "BPE" then
    fail(where, "model", "unsupported model type %q (supported: BPE)", tostring(model.type))
  end
  if type(model.vocab) ~= "table" then fail(where, "model", "has no \"vocab\" object") end
  if type(model.merges) ~= "table" then fail(where, "model", "has no \"merges\" list") end
  if not isnull(model.dropout) and model.dropout ~= 0 then
    fail(where, "model.dropout", "unsupported BPE dropout %s", tostring(model.dropout))
  end
  for _, k in ipairs({ "continuing_subword_prefix", "end_of_word_suffix" }) do
    if not isnull(model[k]) and model[k] ~= "" then
      fail(where, "model." .. k, "unsupported BPE %s %q", k, tostring(model[k]))
    end
  end
  local pre = { splits = {} }
  flatten_pretok(tj.pre_tokenizer, where, "pre_tokenizer", pre)
  local norm = flatten_normalizer(tj.normalizer, where, "normalizer", {})
  local dec = flatten_decoder(tj.decoder, where, "decoder", {})
  -- Byte-level when the pre-tokenizer or decoder says ByteLevel; otherwise SentencePiece-style
  -- (vocab tokens are their own text, ▁ for spaces, byte fallback).
  local byte_level = pre.byte_level or false
  for _, d in ipairs(dec) do
    if d.kind == "byte_level" and not byte_level then
      fail(where, d.path, "a ByteLevel decoder without a ByteLevel pre_tokenizer is not supported")
    end
  end
  if byte_level and pre.metaspace then fail(where, pre.metaspace.path, "Metaspace together with ByteLevel is not supported") end
  if byte_level and model.byte_fallback == true then fail(where, "model.byte_fallback", "byte_fallback with a ByteLevel model") end
  local post = { prefix = {}, suffix = {} }
  parse_post(tj.post_processor, where, "post_processor", post)

  local h = core.check(C.clrt_tokenizer_new())
  h = ffi.gc(h, C.clrt_tokenizer_free)
  local function ok(status, path)
    if status ~= 0 then
      error(("tokenizer: %s: %s%s"):format(where, path and (path .. ": ") or "",
        (ffi.string(C.clrt_last_error()):gsub("^tokenizer: ", ""))), 0)
    end
  end
  local unk_id = -1
  if not isnull(model.unk_token) then
    local u = want_string(model.unk_token, where, "model", "unk_token")
    unk_id = model.vocab[u]
    if type(unk_id) ~= "number" then fail(where, "model.unk_token", "%q is not in the vocab", u) end
  end
  ok(C.clrt_tokenizer_set_model(h, byte_level and 1 or 0, model.byte_fallback == true and 1 or 0,
    model.fuse_unk == true and 1 or 0, unk_id), "model")
  local owner = {}   -- id -> the token that has it: two tokens with one id would decode ambiguously
  for tokstr, id in pairs(model.vocab) do
    if type(id) ~= "number" then fail(where, "model.vocab", "entry %q has a non-number id", tokstr) end
    if id ~= math.floor(id) or id < 0 or id > 2147483646 then
      fail(where, "model.vocab", "entry %q has id %s, not an integer in [0, 2147483646]", tokstr, tostring(id))
    end
    if owner[id] then
      local a, b = owner[id], tokstr
      if b < a then a, b = b, a end   -- the same message whatever order pairs() takes
      fail(where, "model.vocab", "id %d is given to both %q and %q", id, a, b)
    end
    owner[id] = tokstr
    ok(C.clrt_tokenizer_add_vocab(h, tokstr, #tokstr, id), "model.vocab")
  end
  for i, m in ipairs(model.merges) do
    local a, b
    if type(m) == "string" then a, b = m:match("^([^ ]+) ([^ ]+)$")
    elseif type(m) == "table" then a, b = m[1], m[2] end
    if type(a) ~= "string" or type(b) ~= "string" then
      fail(where, ("model.merges[%d]"):format(i), "is not a pair of tokens")
    end
    ok(C.clrt_tokenizer_add_merge(h, a, #a, b, #b), ("model.merges[%d]"):format(i))
  end
  local added, by_content = {}, {}
  for i, a in ipairs(tj.added_tokens or {}) do
    local path = ("added_tokens[%d]"):format(i)
    if type(a) ~= "table" or type(a.content) ~= "string" or type(a.id) ~= "number" then
      fail(where, path, "needs content (a string) and id (a number)")
    end
    if a.id ~= math.floor(a.id) or a.id < 0 or a.id > 2147483646 then
      fail(where, path .. ".id", "is %s, not an integer in [0, 2147483646]", tostring(a.id))
    end
    ok(C.clrt_tokenizer_add_added_word(h, a.content, #a.content, a.id, a.special and 1 or 0, a.lstrip and 1 or 0,
      a.rstrip and 1 or 0, a.normalized and 1 or 0, a.single_word and 1 or 0), path)
    added[a.id] = a.content
    by_content[a.content] = a.id
  end
  for _, st in ipairs(norm) do
    local a, b = st.a or "", st.b or ""
    ok(C.clrt_tokenizer_add_normalizer(h, st.kind, a, #a, b, #b, st.left and 1 or 0, st.right and 1 or 0), st.path)
  end
  if pre.metaspace then
    local m = pre.metaspace
    ok(C.clrt_tokenizer_set_metaspace(h, m.rep, #m.rep, m.scheme, m.split and 1 or 0), m.path)
  end
  for _, sp in ipairs(pre.splits) do ok(C.clrt_tokenizer_add_split_behavior(h, sp.rx, #sp.rx, sp.behavior), sp.path) end
  for _, st in ipairs(dec) do
    local a, b = st.a or "", st.b or ""
    ok(C.clrt_tokenizer_add_decoder(h, st.kind, a, #a, b, #b, st.start or 0, st.stop or 0), st.path)
  end
  ok(C.clrt_tokenizer_set_flags(h, 0, model.ignore_merges == true and 1 or 0, pre.add_prefix_space and 1 or 0))
  local pa = ffi.new("int32_t[?]", math.max(#post.prefix, 1), post.prefix)
  local sa = ffi.new("int32_t[?]", math.max(#post.suffix, 1), post.suffix)
  ok(C.clrt_tokenizer_set_template(h, pa, #post.prefix, sa, #post.suffix), "post_processor")
  ok(C.clrt_tokenizer_finish(h))

  local nfc = false
  for _, st in ipairs(norm) do if st.kind == "nfc" then nfc = true end end
  local splits = {}
  for i, sp in ipairs(pre.splits) do splits[i] = sp.rx end
  local strip_ch, strip_start, strip_stop = ffi.new("char[1]"), ffi.new("int[1]"), ffi.new("int[1]")
  C.clrt_tokenizer_decode_strip(h, strip_ch, strip_start, strip_stop)
  local self = setmetatable({ h = h, config = config, added = added, where = where,
    splits = splits, nfc = nfc, byte_level = byte_level,
    strip_char = string.char(strip_ch[0] % 256), strip_start = strip_start[0] }, Tokenizer)
  self.n_vocab = C.clrt_tokenizer_vocab_size(h)
  local function special(name)
    local c = token_content(config[name])
    return c and self:id(c) or nil
  end
  self.bos, self.eos, self.pad, self.unk = special("bos_token"), special("eos_token"), special("pad_token"), special("unk_token")
  self.bos_token, self.eos_token = token_content(config.bos_token), token_content(config.eos_token)
  if self.eos_token and not self.eos then   -- generation would never see its end-of-text token
    io.stderr:write(("tokenizer: warning: %s: eos_token %q is not in the vocabulary of %s; it will not stop generation\n")
      :format(config_where or "tokenizer_config.json", self.eos_token, where))
  end
  -- End of a chat turn: the template's own marker when the vocabulary has one.
  for _, name in ipairs({ "<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>" }) do
    if by_content[name] then self.eot = by_content[name]; break end
  end
  self.eot = self.eot or self.eos
  self.clean_up = config.clean_up_tokenization_spaces == true
  return self
end

-- path: a model folder or a tokenizer.json file; tokenizer_config.json beside it is read too.
function M.load(path)
  if type(path) ~= "string" then
    error(("tokenizer.load(path): path must be a model folder or a tokenizer.json (a string), got a %s"):format(type(path)), 2)
  end
  local file, dir = path, nil
  local probe = io.open(path .. "/tokenizer.json", "rb")
  if probe then
    probe:close()
    file, dir = path .. "/tokenizer.json", path
  else
    dir = path:match("^(.*)/[^/]*$") or "."
  end
  local text, err = read_file(file)
  if not text then
    error(("tokenizer: cannot read %s: %s (give a tokenizer.json or a folder holding one)")
      :format(file, tostring(err or "is a folder without tokenizer.json")), 0)
  end
  local tj = decode_json(file, text)
  text = nil
  local config = {}
  local cfile = dir .. "/tokenizer_config.json"
  local ctext = read_file(cfile)
  if ctext then config = decode_json(cfile, ctext) end
  local tok = M.from_json(tj, config, file, cfile)
  tok.path, tok.dir = file, dir
  -- its stop ids and sampling defaults (clrt.chat.stop_ids, clrt serve)
  tok.generation_config = require("clrt.generation_config").read(dir)
  return tok
end

local function check_opts(where, opts)
  if opts ~= nil and type(opts) ~= "table" then error(("%s: opts must be a table, got a %s"):format(where, type(opts)), 3) end
end

-- A token id of this vocabulary (an error naming `where` otherwise).
local function check_id(self, where, id)
  if type(id) ~= "number" or id ~= math.floor(id) or id < 0 or id >= self.n_vocab then
    error(("%s: %s is not a token id in [0, %d)"):format(where, tostring(id), self.n_vocab), 3)
  end
end

local function want_special(opts)
  if opts and opts.add_special_tokens == false then return 0 end
  return 1
end

-- ids as a Lua array (1-based positions, 0-based token ids as in Hugging Face).
function Tokenizer:encode(text, opts)
  if type(text) ~= "string" then error(("tok:encode(text, opts): text must be a string, got a %s"):format(type(text)), 2) end
  check_opts("tok:encode(text, opts)", opts)
  local n = ffi.new("int64_t[1]")
  local p = C.clrt_tokenizer_encode(self.h, text, #text, want_special(opts), n)
  if p == nil then core.fail(2) end
  local out = {}
  for i = 0, tonumber(n[0]) - 1 do out[i + 1] = p[i] end
  return out
end

-- Encode many texts on all cores. opts.raw = true returns the flat C result instead:
-- { ids = int32_t*, offsets = int64_t[n+1], n = count } (freed when collected).
function Tokenizer:encode_batch(texts, opts)
  if type(texts) ~= "table" then error(("tok:encode_batch(texts, opts): texts must be a list of strings, got a %s"):format(type(texts)), 2) end
  check_opts("tok:encode_batch(texts, opts)", opts)
  local n = #texts
  local ptrs = ffi.new("const char *[?]", math.max(n, 1))
  local lens = ffi.new("size_t[?]", math.max(n, 1))
  for i = 1, n do
    if type(texts[i]) ~= "string" then
      error(("tok:encode_batch(texts, opts): texts[%d] is a %s, not a string"):format(i, type(texts[i])), 2)
    end
    ptrs[i - 1] = texts[i]
    lens[i - 1] = #texts[i]
  end
  local offsets = ffi.new("int64_t[?]", n + 1)
  local ids = C.clrt_tokenizer_encode_batch(self.h, ptrs, lens, n, want_special(opts), offsets)
  if ids == nil then core.fail(2) end
  ids = ffi.gc(ids, C.clrt_tokenizer_free_ids)
  if opts and opts.raw then return { ids = ids, offsets = offsets, n = n, texts = texts } end
  local out = {}
  for i = 0, n - 1 do
    local t = {}
    for j = tonumber(offsets[i]), tonumber(offsets[i + 1]) - 1 do t[#t + 1] = ids[j] end
    out[i + 1] = t
  end
  return out
end

local function lossy(s)
  local buf = ffi.new("char[?]", #s * 3 + 1)
  return ffi.string(buf, C.clrt_utf8_lossy(s, #s, buf))
end
M.utf8_lossy = lossy

-- Hugging Face's clean_up_tokenization (applied when tokenizer_config.json asks for it).
local function clean_up(s)
  local pairs_ = { { " .", "." }, { " ?", "?" }, { " !", "!" }, { " ,", "," }, { " ' ", "'" },
    { " n't", "n't" }, { " 'm", "'m" }, { " 's", "'s" }, { " 've", "'ve" }, { " 're", "'re" } }
  for _, p in ipairs(pairs_) do
    local from = p[1]:gsub("%p", "%%%0")
    s = s:gsub(from, (p[2]:gsub("%%", "%%%%")))
  end
  return s
end

local function to_cids(ids)
  if type(ids) == "table" then
    local n = #ids
    local a = ffi.new("int32_t[?]", math.max(n, 1))
    for i = 1, n do
      local id = ids[i]
      if type(id) ~= "number" or id ~= math.floor(id) then   -- (the range is checked in C)
        error(("tok:decode(ids, opts): ids[%d] = %s is not a token id"):format(i, tostring(id)), 3)
      end
      a[i - 1] = id
    end
    return a, n
  end
  error(("tok:decode(ids, opts): ids must be a list of token ids, got a %s"):format(type(ids)), 3)
end

-- ids -> text. opts.skip_special_tokens (default false); opts.clean_up_tokenization_spaces
-- (default: tokenizer_config.json's value, else false). Invalid UTF-8 becomes U+FFFD.
function Tokenizer:decode(ids, opts)
  check_opts("tok:decode(ids, opts)", opts)
  opts = opts or {}
  local a, n = to_cids(ids)
  local len = ffi.new("size_t[1]")
  local p = C.clrt_tokenizer_decode(self.h, a, n, opts.skip_special_tokens and 1 or 0, len)
  if p == nil then core.fail(2) end
  local s = lossy(ffi.string(p, len[0]))
  local cu = opts.clean_up_tokenization_spaces
  if cu == nil then cu = self.clean_up end
  if cu then s = clean_up(s) end
  return s
end

-- The raw bytes of one token (an added token's text, a vocab token's bytes).
function Tokenizer:token_bytes(id)
  check_id(self, "tok:token_bytes(id)", id)
  local len = ffi.new("size_t[1]")
  local p = C.clrt_tokenizer_token_bytes(self.h, id, len)
  if p == nil then core.fail(2) end
  return ffi.string(p, len[0])
end

local byte_level = {}
do
  local n = 256
  for b = 0, 255 do
    local printable = (b >= 33 and b <= 126) or (b >= 161 and b <= 172) or b >= 174
    local cp = printable and b or n
    if not printable then n = n + 1 end
    if cp < 0x80 then byte_level[b] = string.char(cp)
    else byte_level[b] = string.char(0xC0 + math.floor(cp / 64), 0x80 + cp % 64) end
  end
end

-- The token as tokenizer.json spells it (byte-level form for vocab tokens).
function Tokenizer:token(id)
  check_id(self, "tok:token(id)", id)
  if self.added[id] then return self.added[id] end
  if not self.byte_level then
    local len = ffi.new("size_t[1]")
    local p = C.clrt_tokenizer_token_text(self.h, id, len)
    if p == nil then error(("tokenizer: id %s is not in the vocabulary"):format(tostring(id)), 2) end
    return ffi.string(p, len[0])
  end
  return (self:token_bytes(id):gsub(".", function(c) return byte_level[c:byte()] end))
end

-- Id of a token spelled as in tokenizer.json (or an added token's text); nil if none.
function Tokenizer:id(token)
  if type(token) ~= "string" then error(("tok:id(token): token must be a string, got a %s"):format(type(token)), 2) end
  local id = C.clrt_tokenizer_id(self.h, token, #token)
  if id < 0 then return nil end
  return id
end

function Tokenizer:vocab_size() return self.n_vocab end
function Tokenizer:is_special(id) return C.clrt_tokenizer_is_added(self.h, id) == 2 end

-- Streaming decode: push ids as they are generated; each push returns the text that is
-- complete so far (never half a UTF-8 character); finish() flushes the rest.
local Stream = {}
Stream.__index = Stream
function Tokenizer:stream(opts)
  return setmetatable({ tok = self, pending = "", skip = opts and opts.skip_special_tokens }, Stream)
end
Tokenizer.decoder = Tokenizer.stream

-- The decoder's Strip (a SentencePiece tokenizer drops the text's first space) at the start
-- of the stream, as decode does for the whole text.
local function strip_front(self, s)
  local tok = self.tok
  while (self.stripped or 0) < tok.strip_start and #s > 0 do
    if s:sub(1, 1) ~= tok.strip_char then self.stripped = tok.strip_start; break end
    s = s:sub(2)
    self.stripped = (self.stripped or 0) + 1
  end
  return s
end

function Stream:push(id)
  local tok = self.tok
  if self.skip and tok:is_special(id) then return "" end
  local s = self.pending .. tok:token_bytes(id)
  if tok.strip_start > 0 then s = strip_front(self, s) end
  local k = tonumber(C.clrt_utf8_complete_prefix(s, #s))
  self.pending = s:sub(k + 1)
  return lossy(s:sub(1, k))
end

function Stream:finish()
  local s = self.pending
  self.pending = ""
  return lossy(s)
end

-- Train a byte-level BPE (GPT-4 split) on a list of texts. Returns a tokenizer.json table
-- ready for M.to_json (and for M.from_json). opts: vocab_size, special_tokens (list of
-- strings, ids after the learnt vocabulary), split (regex), min_frequency.
function M.train(texts, opts)
  opts = opts or {}
  local vocab_size = assert(opts.vocab_size, "train: vocab_size is required")
  local specials = opts.special_tokens or {}
  local split = opts.split or M.GPT4_SPLIT
  local n = #texts
  local ptrs = ffi.new("const char *[?]", math.max(n, 1))
  local lens = ffi.new("size_t[?]", math.max(n, 1))
  for i = 1, n do ptrs[i - 1] = texts[i]; lens[i - 1] = #texts[i] end
  local out = ffi.new("int32_t *[1]")
  local nm = C.clrt_bpe_train(ptrs, lens, n, split, #split, vocab_size - #specials, opts.min_frequency or 2, out)
  if nm < 0 then core.fail(2) end
  local m = ffi.gc(out[0], C.clrt_tokenizer_free_ids)
  local bytes = {}
  for b = 0, 255 do bytes[b] = string.char(b) end
  local function spell(s) return (s:gsub(".", function(c) return byte_level[c:byte()] end)) end
  local vocab, merges = {}, {}
  for b = 0, 255 do vocab[spell(bytes[b])] = b end
  local next_id = 256
  for i = 0, tonumber(nm) - 1 do
    local a, b, r = m[3 * i], m[3 * i + 1], m[3 * i + 2]
    if not bytes[r] then bytes[r] = bytes[a] .. bytes[b] end
    if r >= next_id then vocab[spell(bytes[r])] = r; next_id = r + 1 end
    merges[#merges + 1] = { spell(bytes[a]), spell(bytes[b]) }
  end
  local added = {}
  for i, s in ipairs(specials) do
    added[i] = { id = next_id + i - 1, content = s, single_word = false, lstrip = false, rstrip = false,
      normalized = false, special = true }
  end
  return {
    version = "1.0", truncation = null, padding = null, added_tokens = added,
    normalizer = { type = "NFC" },
    pre_tokenizer = { type = "Sequence", pretokenizers = {
      { type = "Split", pattern = { Regex = split }, behavior = "Isolated", invert = false },
      { type = "ByteLevel", add_prefix_space = false, trim_offsets = false, use_regex = false } } },
    post_processor = { type = "ByteLevel", add_prefix_space = false, trim_offsets = false, use_regex = false },
    decoder = { type = "ByteLevel", add_prefix_space = false, trim_offsets = false, use_regex = false },
    model = { type = "BPE", dropout = null, unk_token = null, continuing_subword_prefix = "",
      end_of_word_suffix = "", fuse_unk = false, byte_fallback = false, ignore_merges = false,
      vocab = vocab, merges = merges },
  }, tonumber(nm)
end

-- JSON text with keys in a fixed order (objects whose keys are listed in `order`, the vocab
-- sorted by id) so saved files are deterministic and read like the Hub's.
local ORDER = { "version", "truncation", "padding", "added_tokens", "normalizer", "pre_tokenizer",
  "post_processor", "decoder", "model", "type", "id", "content", "single_word", "lstrip", "rstrip",
  "normalized", "special", "pretokenizers", "pattern", "Regex", "behavior", "invert", "add_prefix_space",
  "trim_offsets", "use_regex", "dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix",
  "fuse_unk", "byte_fallback", "ignore_merges", "vocab", "merges" }
local RANK = {}
for i, k in ipairs(ORDER) do RANK[k] = i end

local function to_json(v, out, key, indent)
  local ty = type(v)
  if v == null or v == nil then out[#out + 1] = "null"
  elseif ty == "boolean" or ty == "number" then out[#out + 1] = tostring(v)
  elseif ty == "string" then out[#out + 1] = json.quote(v)
  elseif key == "vocab" then
    local items = {}
    for k, id in pairs(v) do items[#items + 1] = { k, id } end
    table.sort(items, function(a, b) return a[2] < b[2] end)
    out[#out + 1] = "{"
    for i, it in ipairs(items) do
      out[#out + 1] = (i > 1 and ",\n" or "\n") .. indent .. "  " .. json.quote(it[1]) .. ": " .. it[2]
    end
    out[#out + 1] = "\n" .. indent .. "}"
  elseif v[1] ~= nil or key == "merges" or key == "added_tokens" or key == "pretokenizers" then
    out[#out + 1] = "["
    for i, x in ipairs(v) do
      out[#out + 1] = (i > 1 and ",\n" or "\n") .. indent .. "  "
      to_json(x, out, nil, indent .. "  ")
    end
    out[#out + 1] = (#v > 0 and "\n" .. indent or "") .. "]"
  else
    local keys = {}
    for k in pairs(v) do keys[#keys + 1] = k end
    table.sort(keys, function(a, b)
      local ra, rb = RANK[a] or 1000, RANK[b] or 1000
      if ra ~= rb then return ra < rb end
      return a < b
    end)
    out[#out + 1] = "{"
    for i, k in ipairs(keys) do
      out[#out + 1] = (i > 1 and ",\n" or "\n") .. indent .. "  " .. json.quote(k) .. ": "
      to_json(v[k], out, k, indent .. "  ")
    end
    out[#out + 1] = (#keys > 0 and "\n" .. indent or "") .. "}"
  end
end

function M.to_json(tbl)
  local out = {}
  to_json(tbl, out, nil, "")
  return table.concat(out) .. "\n"
end

-- Write a file through a temporary name so a crash never leaves half a file.
function M.write_file(path, text)
  local tmp = path .. ".tmp"
  local f, err = io.open(tmp, "wb")
  if not f then error(("tokenizer: cannot write %s: %s"):format(tmp, tostring(err)), 2) end
  f:write(text)
  f:close()
  local ok, rerr = os.rename(tmp, path)
  if not ok then error(("tokenizer: cannot rename %s to %s: %s"):format(tmp, path, tostring(rerr)), 2) end
end

return M
