-- clrt.gen.model_methods — generation for clrt.model, put into its Model class when this loads:
-- m:decoder(slots, max_len), m:generate(prompts, opts) and m:chat([tok,] text). clrt.model is
-- the transformer alone and requires nothing of generation; the binary's `clrt` (init.lua)
-- loads this with it, by whichever name the model is reached, and a script outside the
-- binary requires it once. m:generate submits to the model's one engine (clrt.gen.scheduler).
local models = require("clrt.model")
local decoder = require("clrt.gen.decoder")
local G = require("clrt.gen.scheduler")
local GC = require("clrt.generation_config")

local Model = models.Model

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
  -- generation_config.json (clrt.model.load keeps it): its eos ids end every row beside the
  -- caller's stops, its sampling settings are the defaults of the options not given
  local gc = self.generation_config
  if gc then
    opts = GC.apply_defaults(gc, opts)
    local stop = {}
    for _, id in ipairs(GC.stop_ids(gc)) do stop[#stop + 1] = id end
    local given = opts.stop
    if given ~= nil and type(given) ~= "table" then given = { given } end
    for _, s in ipairs(given or {}) do stop[#stop + 1] = s end
    opts.stop = stop
  end
  local ok, res = pcall(G.generate, self, prompts, opts)
  if not ok then error(res, 2) end
  return res
end

-- chat([tok,] text or messages[, opts]) -> the assistant's reply as text (and the generate
-- entry): a text is one user message; messages a list of {role =, content =}. Rendered
-- with the model's chat template (clrt.chat.generate). Without tok, m:tokenizer(). opts as
-- m:generate's; by default generation_config.json's sampling (else temperature 0.7) and up to
-- 512 new tokens (what `clrt chat` uses).
function Model:chat(tok, input, opts)
  local usage = "m:chat([tok,] text or messages[, opts])"
  if not (type(tok) == "table" and type(tok.encode) == "function") then
    if tok ~= nil and type(tok) ~= "string" and type(tok) ~= "table" then
      error(("%s: the first argument must be a tokenizer, a text or a list of messages, got a %s"):format(usage, type(tok)), 2)
    end
    tok, input, opts = nil, tok, input
  end
  local messages = input
  if type(input) == "string" then
    messages = { { role = "user", content = input } }
  elseif type(input) ~= "table" or #input == 0 then
    error(("%s: give a text or a non-empty list of {role =, content =} messages, got %s"):format(usage,
      type(input) == "table" and "an empty table" or "a " .. type(input)), 2)
  else
    for i, msg in ipairs(input) do
      if type(msg) ~= "table" or type(msg.role) ~= "string" or type(msg.content) ~= "string" then
        error(("%s: message %d must be {role = \"user\"|\"assistant\"|\"system\", content = text}"):format(usage, i), 2)
      end
    end
  end
  if opts ~= nil and type(opts) ~= "table" then error(("%s: opts must be a table, got a %s"):format(usage, type(opts)), 2) end
  if not tok then
    local okt, t = pcall(self.tokenizer, self)
    if not okt then error(("%s: %s"):format(usage, tostring(t)), 2) end
    tok = t
  end
  -- without a generation_config.json (whose defaults m:generate applies), temperature 0.7
  local o = { temperature = not self.generation_config and 0.7 or nil }
  for k, v in pairs(opts or {}) do o[k] = v end
  local chat = require("clrt.chat")
  if o.max_new_tokens == nil then
    local room = (self.config.max_position_embeddings or 4096) - #chat.render(tok, messages, { add_generation_prompt = true })
    o.max_new_tokens = math.max(1, math.min(512, room))
  end
  local okg, text, raw = pcall(chat.generate, self, tok, messages, o)
  if not okg then error(text, 2) end
  return text, raw
end

-- A model's KV cache and prefix cache go before it frees or moves its arenas.
models.on_release[#models.on_release + 1] = G.drop

-- Loading this module is its whole use: it has nothing to call.
return {}
