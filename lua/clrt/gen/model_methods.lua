-- clrt.gen.model_methods — KV-cache decoding for clrt.model: m:decoder(slots, max_len) and
-- m:generate(prompts, opts), methods that lua/clrt/model.lua takes into its Model class.
-- m:generate submits to the model's one engine (clrt.gen.scheduler, through clrt.sched).
local gen = require("clrt.gen.engine")
local decoder = require("clrt.gen.decoder")
local sched = require("clrt.sched")

local M = {}
-- The methods of clrt.model's Model class defined here (lua/clrt/model.lua takes them).
local Model = {}
M.methods = Model

local function is_tokenizer(x) return type(x) == "table" and type(x.encode) == "function" and type(x.decode) == "function" end

-- What m:generate was given, checked before any cache is sized from it: the usual slips
-- (a tokenizer, a text, one token list) get an error that says what to write instead.
local function check_prompts(prompts, opts)
  local usage = "m:generate(prompts, opts): prompts must be a list of token lists ({{id, id, ...}, ...})"
  if is_tokenizer(prompts) then
    error(usage .. ", and the first argument is a tokenizer: for a chat reply to a text use m:chat(tok, text) "
      .. "or clrt.chat.generate(m, tok, messages, opts); to continue a text, m:generate({tok:encode(text)}, opts)", 3)
  end
  if type(prompts) == "string" then
    error(usage .. ", not a string: m:generate({tok:encode(text)}, opts), or m:chat(tok, text) for a chat reply", 3)
  end
  if type(prompts) ~= "table" then error(("%s, got a %s"):format(usage, type(prompts)), 3) end
  if #prompts == 0 then error(usage .. ", and this list is empty", 3) end
  if type(prompts[1]) == "number" then
    error(usage .. ", and this is one token list: wrap it, m:generate({ids}, opts)", 3)
  end
  for i, p in ipairs(prompts) do
    if type(p) ~= "table" then error(("%s; prompts[%d] is a %s"):format(usage, i, type(p)), 3) end
  end
  if opts ~= nil and type(opts) ~= "table" then
    error(("m:generate(prompts, opts): opts must be a table {max_new_tokens =, temperature =, ...}, got a %s"):format(type(opts)), 3)
  end
end

local function check_count(name, v, what)
  if type(v) ~= "number" or v < 1 or v ~= math.floor(v) then
    error(("m:decoder(slots, max_len): %s must be a positive integer (%s), got %s"):format(name, what, tostring(v)), 3)
  end
end

-- A KV cache for `slots` sequences of up to max_len tokens (the parameters are shared with
-- the model: train, then decode with the updated weights, no copy). d:free() gives it back.
function Model:decoder(slots, max_len)
  slots = slots or 1
  max_len = max_len or math.min(self.config.max_position_embeddings or 2048, 2048)
  check_count("slots", slots, "sequences decoded at once")
  check_count("max_len", max_len, "tokens per sequence, prompt included")
  return decoder.new(self, slots, max_len)
end

-- generate(prompts, {n, max_new_tokens, temperature, top_p, top_k, stop, seed, seed_key, tokenizer,
-- logit_bias, frequency_penalty, presence_penalty, on_step}) -> one entry per (prompt,
-- sample), prompt-major:
-- {tokens = {...}, logprobs = {...}, finish_reason = "stop" | "length", text = ...}.
-- A prompt's samples draw from the stream of (seed, its prompt's tokens), or of (seed, key)
-- with seed_key = {key per prompt} (clrt.gen.engine.row_seed); with a tokenizer, ids it
-- cannot decode are never sampled. The requests join the model's one engine
-- (clrt.gen.scheduler): inside a clrt.sched task beside the other tasks' rows, outside one
-- the engine runs until they finish; its decoder grows to the largest request seen.
function Model:generate(prompts, opts)
  check_prompts(prompts, opts)
  local checked, o = pcall(gen.options, opts, self.config.vocab_size)
  if not checked then error(o, 2) end
  local longest = 0
  for _, p in ipairs(prompts) do if #p > longest then longest = #p end end
  local limit = self.config.max_position_embeddings
  if limit and longest + o.max_new_tokens > limit then
    error(("generate: a prompt of %d tokens + max_new_tokens %d exceeds the model's context of %d"):format(longest, o.max_new_tokens, limit), 2)
  end
  local keys = o.seed_key
  if keys ~= nil and type(keys) ~= "table" then keys = { keys } end
  if keys and #keys ~= #prompts then
    error(("generate: seed_key lists %d keys for %d prompts (one per prompt)"):format(#keys, #prompts), 2)
  end
  for p, prompt in ipairs(prompts) do
    local ok, err = pcall(gen.check_prompt, p, prompt, self.config.vocab_size, o, limit or math.huge)
    if not ok then error(err, 2) end
  end
  local ok, res = pcall(sched.generate_all, self, prompts, o, keys, opts and opts.on_step)
  if not ok then error(res, 2) end
  return res
end

return M
