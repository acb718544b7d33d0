-- clrt.tokenizer_train — train a byte-level BPE (GPT-4 split regex, NFC) and write it as a
-- Hugging Face tokenizer folder: tokenizer.json + tokenizer_config.json with ChatML special
-- tokens and template, so clrt.tokenizer.load, transformers and the chat code read it.
--   local info = require("clrt.tokenizer_train").folder(texts, {vocab_size = 512}, out_dir)
--   -- info: {merges = n, vocab_size = n, seconds = s, tokenizer = the loaded tokenizer}
--   local texts = require("clrt.tokenizer_train").read_texts(path)   -- a text or JSONL file
--   local texts = require("clrt.tokenizer_train").split_text(text)    -- one long text
-- vocab_size counts everything: 256 bytes, the learnt merges and the 3 special tokens
-- <|endoftext|>, <|im_start|>, <|im_end|>. Runs in this process (no second clrt).
local files = require("clrt.files")
local json = require("clrt.json")
local tokenizer = require("clrt.tokenizer")

local M = {}
M.SPECIALS = { "<|endoftext|>", "<|im_start|>", "<|im_end|>" }

-- Plain text in ~1 MB pieces cut at line ends (no piece spans a newline run, so the split
-- changes no pre-tokenized piece).
function M.split_text(data)
  local texts, pos = {}, 1
  while pos <= #data do
    local stop = math.min(#data, pos + 1000000)
    local nl = data:find("\n[^\n]", stop)
    stop = nl or #data
    texts[#texts + 1] = data:sub(pos, stop)
    pos = stop + 1
  end
  return texts
end

-- Training texts from a file: plain text (in ~1 MB pieces cut at line ends, so no piece
-- spans a newline run), or JSONL whose lines have a "text" string or a "messages" list.
function M.read_texts(path)
  local f, err = io.open(path, "rb")
  if not f then error(("train_tokenizer: cannot read %s: %s"):format(path, tostring(err)), 0) end
  local data = f:read("*a")
  f:close()
  local texts = {}
  if data:match("^%s*(.)") == "{" then
    local lineno = 0
    for line in data:gmatch("[^\n]+") do
      lineno = lineno + 1
      if line:match("%S") then
        local ok, obj = pcall(json.decode, line)
        if not ok or type(obj) ~= "table" then
          error(("train_tokenizer: %s line %d is not a JSON object"):format(path, lineno), 0)
        end
        if type(obj.text) == "string" then
          texts[#texts + 1] = obj.text
        elseif type(obj.messages) == "table" then
          for _, m in ipairs(obj.messages) do
            if type(m) == "table" and type(m.content) == "string" then texts[#texts + 1] = m.content end
          end
        else
          error(("train_tokenizer: %s line %d has neither a \"text\" string nor a \"messages\" list"):format(path, lineno), 0)
        end
      end
    end
  else
    texts = M.split_text(data)
  end
  if #texts == 0 then error(("train_tokenizer: %s has no text"):format(path), 0) end
  return texts, #data
end

function M.folder(texts, opts, out_dir)
  local vocab_size = opts.vocab_size
  if type(vocab_size) ~= "number" or vocab_size ~= math.floor(vocab_size) or vocab_size < 256 + #M.SPECIALS then
    error(("train_tokenizer: vocab_size must be an integer of at least %d, got %s"):format(256 + #M.SPECIALS, tostring(vocab_size)), 2)
  end
  local t0 = os.clock()
  local tj, n_merges = tokenizer.train(texts, {
    vocab_size = vocab_size, special_tokens = M.SPECIALS, min_frequency = opts.min_frequency or 2 })
  local seconds = os.clock() - t0
  local config = {
    add_bos_token = false, add_prefix_space = false, bos_token = json.null, eos_token = "<|im_end|>",
    pad_token = "<|endoftext|>", unk_token = json.null, clean_up_tokenization_spaces = false,
    model_max_length = 131072, split_special_tokens = false, tokenizer_class = "PreTrainedTokenizerFast",
    chat_template = require("clrt.chat").CHATML_JINJA, errors = "replace",
    additional_special_tokens = { "<|im_start|>", "<|im_end|>" },
    added_tokens_decoder = {},
  }
  for _, a in ipairs(tj.added_tokens) do
    config.added_tokens_decoder[tostring(a.id)] = { content = a.content, lstrip = false, rstrip = false,
      normalized = false, single_word = false, special = true }
  end
  files.mkdir_p(out_dir)
  tokenizer.write_file(out_dir .. "/tokenizer.json", tokenizer.to_json(tj))
  tokenizer.write_file(out_dir .. "/tokenizer_config.json", tokenizer.to_json(config))
  local tok = tokenizer.load(out_dir)   -- what was written must load
  return { merges = n_merges, vocab_size = tok:vocab_size(), seconds = seconds, tokenizer = tok }
end

return M
