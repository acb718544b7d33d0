-- train_tokenizer.lua — train a byte-level BPE tokenizer (GPT-4 split regex, NFC) and write a
-- Hugging Face tokenizer.json + tokenizer_config.json with ChatML special tokens and template.
--   clrt recipes/train_tokenizer.lua input=FILE vocab_size=N out=DIR [min_frequency=2]
-- FILE is plain text, or JSONL whose lines have a "text" string or a "messages" list (each
-- message's content is training text). vocab_size counts everything: 256 bytes, the learnt
-- merges and the 3 special tokens <|endoftext|>, <|im_start|>, <|im_end|>.
local cjson = require("cjson")

local args = {}
for _, a in ipairs({ ... }) do
  local k, v = a:match("^([%w_]+)=(.*)$")
  if not k then error(("train_tokenizer: argument %q is not key=value"):format(a), 0) end
  args[k] = v
end
local function usage(msg)
  io.stderr:write("train_tokenizer: " .. msg .. "\nusage: clrt recipes/train_tokenizer.lua input=FILE vocab_size=N out=DIR [min_frequency=2]\n")
  os.exit(2)
end
if not args.input then usage("input= is required") end
if not args.out then usage("out= is required") end
local vocab_size = tonumber(args.vocab_size or "")
if not vocab_size or vocab_size ~= math.floor(vocab_size) then usage("vocab_size= must be an integer") end
local SPECIALS = { "<|endoftext|>", "<|im_start|>", "<|im_end|>" }
if vocab_size < 256 + #SPECIALS then usage(("vocab_size must be at least %d"):format(256 + #SPECIALS)) end

local f, err = io.open(args.input, "rb")
if not f then error(("train_tokenizer: cannot read %s: %s"):format(args.input, tostring(err)), 0) end
local data = f:read("*a")
f:close()

local texts = {}
local first = data:match("^%s*(.)")
if first == "{" then
  local lineno = 0
  for line in data:gmatch("[^\n]+") do
    lineno = lineno + 1
    if line:match("%S") then
      local ok, obj = pcall(cjson.decode, line)
      if not ok or type(obj) ~= "table" then
        error(("train_tokenizer: %s line %d is not a JSON object"):format(args.input, lineno), 0)
      end
      if type(obj.text) == "string" then
        texts[#texts + 1] = obj.text
      elseif type(obj.messages) == "table" then
        for _, m in ipairs(obj.messages) do
          if type(m) == "table" and type(m.content) == "string" then texts[#texts + 1] = m.content end
        end
      else
        error(("train_tokenizer: %s line %d has neither a \"text\" string nor a \"messages\" list"):format(args.input, lineno), 0)
      end
    end
  end
else
  -- plain text in ~1 MB chunks cut at line ends (pieces never span a chunk boundary's newline run)
  local pos = 1
  while pos <= #data do
    local stop = math.min(#data, pos + 1000000)
    local nl = data:find("\n[^\n]", stop)
    stop = nl or #data
    texts[#texts + 1] = data:sub(pos, stop)
    pos = stop + 1
  end
end
if #texts == 0 then error(("train_tokenizer: %s has no text"):format(args.input), 0) end

local t0 = os.clock()
local tj, n_merges = clrt.tokenizer.train(texts, {
  vocab_size = vocab_size, special_tokens = SPECIALS, min_frequency = tonumber(args.min_frequency or "2") })
local seconds = os.clock() - t0

local config = {
  add_bos_token = false, add_prefix_space = false, bos_token = cjson.null, eos_token = "<|im_end|>",
  pad_token = "<|endoftext|>", unk_token = cjson.null, clean_up_tokenization_spaces = false,
  model_max_length = 131072, split_special_tokens = false, tokenizer_class = "PreTrainedTokenizerFast",
  chat_template = clrt.chat.CHATML_JINJA, errors = "replace",
  additional_special_tokens = { "<|im_start|>", "<|im_end|>" },
  added_tokens_decoder = {},
}
for _, a in ipairs(tj.added_tokens) do
  config.added_tokens_decoder[tostring(a.id)] = { content = a.content, lstrip = false, rstrip = false,
    normalized = false, single_word = false, special = true }
end

clrt.files.mkdir_p(args.out)
clrt.tokenizer.write_file(args.out .. "/tokenizer.json", clrt.tokenizer.to_json(tj))
clrt.tokenizer.write_file(args.out .. "/tokenizer_config.json", clrt.tokenizer.to_json(config))
local tok = clrt.tokenizer.load(args.out)   -- what we wrote must load
print(("train_tokenizer: %d bytes of text, %d merges, vocab %d in %.2fs -> %s"):format(
  #data, n_merges, tok:vocab_size(), seconds, args.out))
