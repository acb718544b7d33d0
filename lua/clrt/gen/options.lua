-- clrt.gen.options — what a generation request may ask, checked once before it queues: the
-- options (every caller's: m:generate, clrt.sched.generate, `clrt chat`, `clrt serve`), the
-- prompts against the vocabulary and the context, and the seed keys that name the requests'
-- random streams. The engine (clrt.gen.engine) and the scheduler (clrt.gen.scheduler) take
-- what this returns and check nothing of it again.
--
--   local o = options.check(opts, V)            -- the normalised copy rows keep
--   options.check_prompt(p, prompt, V, o, max_len)
--   options.context(model)                      -- the model's context (nil: no bound)
--   local keys = options.seed_keys(o, #prompts) -- one key (or false) per prompt, or nil
local M = {}

-- The options generate takes (anything else is a mistake worth naming: max_tokens for
-- max_new_tokens would otherwise be ignored without a word).
local KNOWN_OPTIONS = { "n", "max_new_tokens", "temperature", "top_p", "top_k", "seed", "seed_key", "stop", "tokenizer",
  "top_logprobs", "logit_bias", "frequency_penalty", "presence_penalty", "stream_text", "mask", "json_schema", "json",
  "json_whitespace", "on_step" }
local known_option = {}
for _, k in ipairs(KNOWN_OPTIONS) do known_option[k] = true end

-- logit_bias {[token id] = bias in [-100, 100]} -> parallel arrays, ids in increasing order.
local function parse_logit_bias(lb, vocab, bad)
  if type(lb) ~= "table" then bad("logit_bias", "must be a table {[token id] = bias}") end
  local ids = {}
  for id, b in pairs(lb) do
    if type(id) ~= "number" or id ~= math.floor(id) or id < 0 or id >= vocab then
      bad("logit_bias", ("has key %s, not a token id in [0, %d)"):format(tostring(id), vocab))
    end
    if type(b) ~= "number" or not (b >= -100 and b <= 100) then
      bad("logit_bias", ("[%d] = %s is not a number in [-100, 100]"):format(id, tostring(b)))
    end
    ids[#ids + 1] = id
  end
  if #ids == 0 then return nil end
  table.sort(ids)
  local vals = {}
  for i, id in ipairs(ids) do vals[i] = lb[id] end
  return { ids = ids, vals = vals }
end

-- Validate options once per request; returns the normalised copy rows keep.
function M.check(opts, vocab)
  opts = opts or {}
  if type(opts) ~= "table" then error(("generate: opts must be a table of options, got a %s"):format(type(opts)), 0) end
  for k in pairs(opts) do
    if not known_option[k] then
      error(("generate: unknown option '%s' (the options are: %s)"):format(tostring(k), table.concat(KNOWN_OPTIONS, ", ")), 0)
    end
  end
  local o = {
    n = opts.n or 1,
    max_new_tokens = opts.max_new_tokens or 64,
    temperature = opts.temperature or 1.0,
    top_p = opts.top_p or 1.0,
    top_k = opts.top_k or 0,
    seed = opts.seed or 0,
  }
  -- the value given is named: {temperature = "hot"} is not a number, not "below 0"
  local function bad(k, why)
    local v = o[k]
    local shown = type(v) == "string" and ("%q"):format(v) or tostring(v)
    if type(v) ~= "number" and k ~= "seed" and not why:match("^must be a number") then
      why = "must be a number (" .. why:gsub("^must be ", "") .. ")"
    end
    error(("generate: option %s %s, got %s"):format(k, why, shown), 0)
  end
  if type(o.n) ~= "number" or o.n < 1 or o.n ~= math.floor(o.n) then bad("n", "must be a positive integer") end
  if type(o.max_new_tokens) ~= "number" or o.max_new_tokens < 0 then bad("max_new_tokens", "must be >= 0") end
  if type(o.temperature) ~= "number" or o.temperature < 0 then bad("temperature", "must be >= 0") end
  if type(o.top_p) ~= "number" or o.top_p <= 0 or o.top_p > 1 then bad("top_p", "must be in (0, 1]") end
  if type(o.top_k) ~= "number" or o.top_k < 0 then bad("top_k", "must be >= 0") end
  if type(o.seed) ~= "number" then bad("seed", "must be a number") end
  -- who asks (clrt.sched: "rl/step 3/prompt 2/future 1/turn 2"): with the seed it names the
  -- request's random stream; a list gives m:generate one key per prompt
  local key = opts.seed_key
  if key ~= nil then
    local ok = type(key) == "string" or type(key) == "number"
    if type(key) == "table" then
      ok = #key > 0
      for _, k in ipairs(key) do ok = ok and (type(k) == "string" or type(k) == "number" or k == false) end
    end
    if not ok then bad("seed_key", "must be a string or number naming the request (or, for m:generate, a list of them, one per prompt)") end
    o.seed_key = key
  end
  local stop = opts.stop
  if stop ~= nil and type(stop) ~= "table" then stop = { stop } end
  o.stop_ids, o.stop_strings = {}, {}
  for _, s in ipairs(stop or {}) do
    if type(s) == "number" then
      if s < 0 or s >= vocab then bad("stop", ("has token id %d outside the vocabulary of %d"):format(s, vocab)) end
      o.stop_ids[s] = true
    elseif type(s) == "string" then
      if s == "" then bad("stop", "has an empty string") end
      o.stop_strings[#o.stop_strings + 1] = s
    else
      bad("stop", "entries must be token ids or strings")
    end
  end
  -- report the model's own log-probabilities (temperature 1) of each sampled token and of
  -- the top_logprobs most likely ones: row.model_logprobs[i] = {lp, top = {{id, lp}, ...}}
  if opts.top_logprobs ~= nil then
    local k = opts.top_logprobs
    if type(k) ~= "number" or k < 0 or k > 64 or k ~= math.floor(k) then bad("top_logprobs", "must be an integer in [0, 64]") end
    o.top_logprobs = math.min(k, vocab)
  end
  if opts.logit_bias ~= nil then o.logit_bias = parse_logit_bias(opts.logit_bias, vocab, bad) end
  -- OpenAI's penalties: a token's logit drops by count * frequency_penalty + presence_penalty
  -- once the row has sampled it count (> 0) times
  o.frequency_penalty, o.presence_penalty = opts.frequency_penalty or 0, opts.presence_penalty or 0
  for _, k in ipairs({ "frequency_penalty", "presence_penalty" }) do
    if type(o[k]) ~= "number" or not (o[k] >= -2 and o[k] <= 2) then bad(k, "must be a number in [-2, 2]") end
  end
  o.tokenizer = opts.tokenizer
  if (#o.stop_strings > 0 or opts.stream_text) and not o.tokenizer then
    bad("stop", "has strings but no tokenizer was given (opts.tokenizer) to decode with")
  end
  o.mask = opts.mask   -- function(row) -> uint8_t* [V], nil (no mask) or false (end the row)
  local js = opts.json_schema
  if js == nil and opts.json then js = opts.json end   -- true: any value; "object": any object
  if js ~= nil and js ~= false then
    if o.mask then bad("json", "cannot be combined with a mask") end
    if not o.tokenizer then bad("json", "needs the tokenizer (opts.tokenizer) for the bytes of every token") end
    local JC = require("clrt.gen.json_constraint")
    local stop_ids = {}
    for id in pairs(o.stop_ids) do stop_ids[#stop_ids + 1] = id end
    table.sort(stop_ids)
    local grammar = type(js) == "table" and js.grammar and js or JC.compile(js, { max_ws = opts.json_whitespace })
    local c = JC.new({ tokenizer = o.tokenizer, V = vocab, grammar = grammar, stop_ids = stop_ids })
    o.constraint = c
    o.mask = function(row) return c:mask(row) end
  end
  return o
end

-- A prompt (index p, for the message) is a non-empty list of ids in [0, V) that leaves room
-- for o.max_new_tokens within max_len tokens: the one context check, asked before a request
-- queues (max_len: the model's context) and when the engine starts its rows (its decoder's).
function M.check_prompt(p, prompt, V, o, max_len)
  if type(prompt) ~= "table" or #prompt == 0 then
    error(("generate: prompt %d must be a non-empty list of token ids"):format(p), 0)
  end
  for i, t in ipairs(prompt) do
    if type(t) ~= "number" or t < 0 or t >= V or t ~= math.floor(t) then
      error(("generate: prompt %d token %d (%s) is not an id in [0, %d)"):format(p, i, tostring(t), V), 0)
    end
  end
  if #prompt + o.max_new_tokens > max_len then
    error(("generate: prompt %d has %d tokens + max_new_tokens %d = %d, more than the context of %d")
      :format(p, #prompt, o.max_new_tokens, #prompt + o.max_new_tokens, max_len), 0)
  end
end

-- The most tokens (prompt + new) the model takes: its config's max_position_embeddings, or nil
-- (a model that does not say, a test's fake).
function M.context(model)
  local c = type(model) == "table" and model.config
  return type(c) == "table" and c.max_position_embeddings or nil
end

-- The seed key of each of n prompts, from o.seed_key (checked by M.check): a list is one key
-- per prompt (m:generate), a single key names a lone prompt's request. nil: no key, the
-- prompts' tokens name their streams (clrt.gen.engine.stream_name).
function M.seed_keys(o, n)
  local keys = o.seed_key
  if keys == nil then return nil end
  if type(keys) ~= "table" then keys = { keys } end
  if #keys ~= n then
    error(("generate: seed_key lists %d keys for %d prompts (one per prompt)"):format(#keys, n), 0)
  end
  return keys
end

return M

