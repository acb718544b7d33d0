-- train_tokenizer.lua — train a byte-level BPE tokenizer (GPT-4 split regex, NFC) and write a
-- Hugging Face tokenizer.json + tokenizer_config.json with ChatML special tokens and template.
--   clrt recipes/train_tokenizer.lua input=FILE vocab_size=N out=DIR [min_frequency=2]
-- FILE is plain text, or JSONL whose lines have a "text" string or a "messages" list (each
-- message's content is training text). vocab_size counts everything: 256 bytes, the learnt
-- merges and the 3 special tokens <|endoftext|>, <|im_start|>, <|im_end|>.
local train = require("clrt.tokenizer_train")

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
if vocab_size < 256 + #train.SPECIALS then usage(("vocab_size must be at least %d"):format(256 + #train.SPECIALS)) end

local texts, bytes = train.read_texts(args.input)
local info = train.folder(texts, { vocab_size = vocab_size, min_frequency = tonumber(args.min_frequency or "2") }, args.out)
print(("train_tokenizer: %d bytes of text, %d merges, vocab %d in %.2fs -> %s"):format(
  bytes, info.merges, info.vocab_size, info.seconds, args.out))
