-- clrt.net.openai_server — an OpenAI-compatible chat server over one model: POST /v1/chat/completions
-- (JSON or server-sent events; logprobs; tools through the chat template), POST /v1/completions
-- (a plain prompt continued; no chat template), GET /v1/models,
-- GET /v1/models/{id}, GET /health (open without the key). Every request's rows join the
-- model's one generation engine (clrt.gen.scheduler: admission, slots, the KV cache), so
-- requests that arrive together decode in the same batched steps, and a request that arrives
-- mid-way joins at the next step.
local json = require("clrt.json")   -- strict: NaN, Infinity and 0x.. are not JSON; [] stays apart from {}
local options = require("clrt.gen.options")
local G = require("clrt.gen.scheduler")
local reply = require("clrt.net.openai_reply")   -- what a request's rows write back
local http = require("clrt.net.http")   -- its clock: the access log's milliseconds

local M = {}

local default_code = { [400] = "invalid_request_error", [401] = "invalid_api_key", [404] = "not_found",
  [405] = "method_not_allowed", [413] = "request_too_large", [500] = "server_error" }

-- An OpenAI-shaped error: {error: {message, type, param, code}}, code always a string.
local function json_error(status, message, param, kind, code)
  return status, json.encode({ error = {
    message = message, type = kind or "invalid_request_error", param = param or json.null,
    code = code or default_code[status] or "error" } })
end
M.json_error = json_error

local function is_int(x) return type(x) == "number" and x == math.floor(x) end
local is_utf8 = reply.is_utf8

-- The first string (key or value) in a decoded request that is not UTF-8, as a field path
-- like "messages[0].content"; nil when all are. Stop strings are left out: they are matched
-- byte for byte against the reply and go neither to the tokenizer nor into a response.
local function bad_utf8_field(v, path, tick, seen)
  if type(v) == "string" then return not is_utf8(v) and path or nil end
  if type(v) ~= "table" then return nil end
  seen = seen or { 0 }
  for k, x in pairs(v) do
    seen[1] = seen[1] + 1
    if tick and seen[1] % 1024 == 0 then tick() end
    local sub
    if type(k) == "number" then
      sub = ("%s[%d]"):format(path, k - 1)
    else
      if type(k) == "string" and not is_utf8(k) then return path ~= "" and path or "(a key)" end
      sub = path == "" and tostring(k) or path .. "." .. tostring(k)
    end
    local bad = sub ~= "stop" and bad_utf8_field(x, sub, tick, seen)
    if bad then return bad end
  end
  return nil
end

-- An error message as a client may see it: no source positions ("/path/x.lua:12: "), which
-- say nothing to a client and tell it where the server is installed.
local function without_source(msg)
  return (tostring(msg):gsub("[^%s:]*%.lua:%d+: ", ""):gsub("%[string [^%]]*%]:%d+: ", ""))
end
M.without_source = without_source

-- The request parameters this server reads; any other is a 400 naming it (OpenAI's answer
-- to an unknown argument), so no parameter is accepted and then ignored.
local function set(list)
  local t = {}
  for _, k in ipairs(list) do t[k] = true end
  return t
end
local SHARED = { "model", "stream", "stream_options", "temperature", "top_p", "max_tokens", "n", "seed", "stop",
  "logit_bias", "frequency_penalty", "presence_penalty", "user" }
local CHAT_PARAMETERS = set({ "messages", "max_completion_tokens", "logprobs", "top_logprobs", "tools", "tool_choice",
  "parallel_tool_calls", "response_format", unpack(SHARED) })
local COMPLETION_PARAMETERS = set({ "prompt", "echo", "suffix", "best_of", "logprobs", unpack(SHARED) })
-- The fields of a message; others (name, ...) would be dropped by the chat template.
local MESSAGE_FIELDS = { role = true, content = true, tool_calls = true, tool_call_id = true, refusal = true }
local MAX_LOGIT_BIAS = 300   -- OpenAI's limit on logit_bias entries

-- logit_bias {"token id": bias in [-100, 100]} -> {[id] = bias}, or nil and the reason.
local function parse_logit_bias(lb, vocab)
  if type(lb) ~= "table" or (next(lb) ~= nil and type(next(lb)) ~= "string") then
    return nil, "must be an object mapping token ids (strings of digits) to biases in [-100, 100]"
  end
  local out, count = {}, 0
  for k, v in pairs(lb) do
    count = count + 1
    if count > MAX_LOGIT_BIAS then return nil, ("has more than %d entries"):format(MAX_LOGIT_BIAS) end
    if type(k) ~= "string" or not k:match("^%d+$") or #k > 9 then
      return nil, ("has key '%s', which is not a token id (a non-negative integer)"):format(tostring(k))
    end
    local id = tonumber(k)
    if vocab and id >= vocab then return nil, ("has token id %d, outside the vocabulary of %d"):format(id, vocab) end
    if type(v) ~= "number" or not (v >= -100 and v <= 100) then
      return nil, ("['%s'] must be a number in [-100, 100]"):format(k)
    end
    out[id] = v
  end
  return out
end

-- A 400 naming a field: nil, status, body.
local function bad(field, why) return nil, json_error(400, ("'%s' %s"):format(field, why), field) end

-- A request body as a JSON object whose strings are UTF-8 and whose keys are all `known`
-- parameters. Returns it or (nil, status, body).
local function decode_body(body, known, tick, limits)
  -- each object's key order is kept: the template's tojson renders tools as the client sent them
  local ok, req = pcall(json.decode, body, "request", { key_order = true, tick = tick })
  local err = not ok and req or nil
  if not ok or type(req) ~= "table" or (next(req) ~= nil and type(next(req)) ~= "string") then
    return nil, json_error(400, "request body is not valid JSON: " .. tostring(err or "not an object"))
  end
  -- too many messages is refused before anything walks them
  if limits and limits.max_messages and type(req.messages) == "table" and #req.messages > limits.max_messages then
    return bad("messages", ("has %d messages: more than %d on this server (clrt serve --max-messages)")
      :format(#req.messages, limits.max_messages))
  end
  local not_utf8 = bad_utf8_field(req, "", tick)
  if not_utf8 then return bad(not_utf8, "is not valid UTF-8") end
  for k in pairs(req) do
    if not known[k] then return bad(tostring(k), "is not a parameter this server supports") end
  end
  return req
end

local parse_numbers, parse_rules

-- The parameters both endpoints share (model, stream, sampling, length, stop, logit_bias)
-- into `out`. Returns true or (nil, status, body).
local function parse_sampling(req, out, limits)
  if req.model ~= nil and req.model ~= json.null then
    if type(req.model) ~= "string" then return bad("model", "must be a string") end
    out.model = req.model
  end
  if req.stream ~= nil and req.stream ~= json.null then
    if type(req.stream) ~= "boolean" then return bad("stream", "must be a boolean") end
    out.stream = req.stream
  end
  local so = req.stream_options
  if so ~= nil and so ~= json.null then
    if type(so) ~= "table" then return bad("stream_options", "must be an object") end
    if so.include_usage ~= nil and so.include_usage ~= json.null and type(so.include_usage) ~= "boolean" then
      return bad("stream_options.include_usage", "must be a boolean")
    end
    out.include_usage = so.include_usage == true
  end
  return parse_numbers(req, out, limits)
end

-- temperature, top_p, max_tokens, n, seed into `out`, then the rest (parse_rules).
parse_numbers = function(req, out, limits)
  local t = req.temperature
  if t ~= nil and t ~= json.null then
    if type(t) ~= "number" or t < 0 or t > 2 then return bad("temperature", "must be a number in [0, 2]") end
    out.temperature = t
  end
  local p = req.top_p
  if p ~= nil and p ~= json.null then
    if type(p) ~= "number" or p <= 0 or p > 1 then return bad("top_p", "must be a number in (0, 1]") end
    out.top_p = p
  end
  local mt = req.max_completion_tokens or req.max_tokens
  local mt_name = req.max_completion_tokens and "max_completion_tokens" or "max_tokens"
  if mt ~= nil and mt ~= json.null then
    if not is_int(mt) or mt < 1 then return bad(mt_name, "must be a positive integer") end
    if mt > limits.max_tokens then return bad(mt_name, ("must be at most %d on this server"):format(limits.max_tokens)) end
    out.max_tokens = mt
  end
  local n = req.n
  if n ~= nil and n ~= json.null then
    if not is_int(n) or n < 1 or n > limits.max_n then return bad("n", ("must be an integer in [1, %d]"):format(limits.max_n)) end
    out.n = n
  end
  local seed = req.seed
  if seed ~= nil and seed ~= json.null then
    if not is_int(seed) then return bad("seed", "must be an integer") end
    out.seed = seed
  end
  return parse_rules(req, out, limits)
end

-- stop, the penalties, user and logit_bias into `out`. Returns true or (nil, status, body).
parse_rules = function(req, out, limits)
  local stop = req.stop
  if stop ~= nil and stop ~= json.null then
    if type(stop) == "string" then stop = { stop } end
    if type(stop) ~= "table" or #stop > 4 then return bad("stop", "must be a string or an array of up to 4 strings") end
    for i, s in ipairs(stop) do
      if type(s) ~= "string" or s == "" then return bad(("stop[%d]"):format(i - 1), "must be a non-empty string") end
    end
    out.stop = stop
  end
  for _, k in ipairs({ "frequency_penalty", "presence_penalty" }) do
    local v = req[k]
    if v ~= nil and v ~= json.null then
      if type(v) ~= "number" or v < -2 or v > 2 then return bad(k, "must be a number in [-2, 2]") end
      out[k] = v
    end
  end
  if req.user ~= nil and req.user ~= json.null and type(req.user) ~= "string" then return bad("user", "must be a string") end
  local lb = req.logit_bias
  if lb ~= nil and lb ~= json.null then
    local bias, why = parse_logit_bias(lb, limits.vocab_size)
    if not bias then return bad("logit_bias", why) end
    out.logit_bias = bias
  end
  return true
end

-- One message of a chat request (f: its field path) as the chat template takes it, or nil,
-- status, body.
local function parse_message(m, f)
  if type(m) ~= "table" then return bad(f, "must be an object") end
  for k in pairs(m) do
    if not MESSAGE_FIELDS[k] then return bad(f .. "." .. tostring(k), "is not supported (the chat template has no place for it)") end
  end
  if m.refusal ~= nil and m.refusal ~= json.null then return bad(f .. ".refusal", "must be null (a refusal is not rendered)") end
  local role = m.role == "developer" and "system" or m.role   -- OpenAI's newer name for system
  if role ~= "system" and role ~= "user" and role ~= "assistant" and role ~= "tool" then
    return bad(f .. ".role", "must be 'system', 'developer', 'user', 'assistant' or 'tool'")
  end
  local content = m.content
  local calls = m.tool_calls
  if calls == json.null then calls = nil end
  if calls ~= nil then
    if role ~= "assistant" or type(calls) ~= "table" then return bad(f .. ".tool_calls", "must be an array on an assistant message") end
    for j, c in ipairs(calls) do
      local fn = type(c) == "table" and c["function"]
      if type(fn) ~= "table" or type(fn.name) ~= "string" or type(fn.arguments) ~= "string" then
        return bad(("%s.tool_calls[%d]"):format(f, j - 1), "must be {id, type: 'function', function: {name, arguments (a JSON string)}}")
      end
    end
    if content == nil or content == json.null then content = "" end
  end
  if role == "tool" and type(m.tool_call_id) ~= "string" then return bad(f .. ".tool_call_id", "must be a string") end
  if type(content) == "table" then   -- the array-of-parts form: text parts only
    local parts = {}
    for j, part in ipairs(content) do
      if type(part) ~= "table" or part.type ~= "text" or type(part.text) ~= "string" then
        return bad(("%s.content[%d]"):format(f, j - 1), "must be a text part ({type: 'text', text: ...})")
      end
      parts[#parts + 1] = part.text
    end
    content = table.concat(parts)
  end
  if type(content) ~= "string" then return bad(f .. ".content", "must be a string") end
  return { role = role, content = content, tool_calls = calls, tool_call_id = m.tool_call_id }
end

-- logprobs and top_logprobs into `out`. Returns true or (nil, status, body).
local function parse_logprobs(req, out)
  local lp, top = req.logprobs, req.top_logprobs
  if lp ~= nil and lp ~= json.null then
    if type(lp) ~= "boolean" then return bad("logprobs", "must be a boolean") end
    out.logprobs = lp
  end
  if top ~= nil and top ~= json.null then
    if not is_int(top) or top < 0 or top > 20 then return bad("top_logprobs", "must be an integer in [0, 20]") end
    if not out.logprobs then return bad("top_logprobs", "needs 'logprobs': true") end
    out.top_logprobs = top
  end
  return true
end

-- tools into `out` (their schemas, and the list as sent). Returns true or (nil, status, body).
local function parse_tools(req, out)
  local tools = req.tools
  if tools == nil or tools == json.null then return true end
  if type(tools) ~= "table" then return bad("tools", "must be an array") end
  out.tool_schemas = {}
  for j, t in ipairs(tools) do
    local fn = type(t) == "table" and t.type == "function" and t["function"]
    if type(fn) ~= "table" or type(fn.name) ~= "string" or not fn.name:match("^[%w_%-]+$") then
      return bad(("tools[%d]"):format(j - 1), "must be {type: 'function', function: {name ([a-zA-Z0-9_-]+), description, parameters}}")
    end
    local params = fn.parameters
    if params ~= nil and params ~= json.null and type(params) ~= "table" then
      return bad(("tools[%d].function.parameters"):format(j - 1), "must be a JSON Schema object")
    end
    out.tool_schemas[j] = { name = fn.name, parameters = (params ~= json.null and params) or nil }
  end
  if #tools > 0 then out.tools = tools end   -- decoded with their key order (decode_body)
  return true
end

-- tool_choice, response_format and parallel_tool_calls into `out`. Returns true or (nil, status, body).
local function parse_tool_choice(req, out)
  local choice = req.tool_choice
  if choice ~= nil and choice ~= json.null then
    local named = type(choice) == "table" and type(choice["function"]) == "table" and choice["function"].name
    if choice ~= "none" and choice ~= "auto" and choice ~= "required" and type(named) ~= "string" then
      return bad("tool_choice", "must be 'none', 'auto', 'required' or {type: 'function', function: {name}}")
    end
    if choice ~= "none" and not out.tools then return bad("tool_choice", "needs 'tools'") end
    if named then
      local found = false
      for _, t in ipairs(out.tool_schemas) do found = found or t.name == named end
      if not found then return bad("tool_choice", ("names '%s', which is not in 'tools'"):format(named)) end
    end
    out.tool_choice = named and { name = named } or choice
  end
  if req.response_format ~= nil and req.response_format ~= json.null then
    out.response_format = req.response_format
  end
  local ptc = req.parallel_tool_calls
  if ptc ~= nil and ptc ~= json.null then
    if type(ptc) ~= "boolean" then return bad("parallel_tool_calls", "must be a boolean") end
    out.single_tool_call = ptc == false
  end
  return true
end

-- The JSON size of a request's schemas (tools and response_format): what constrained decoding
-- compiles and the template renders; nil when under limits.max_schema_bytes, else a 400.
local function schema_too_large(req, limits)
  local max = limits.max_schema_bytes
  if not max then return nil end
  for _, k in ipairs({ "tools", "response_format" }) do
    local v = req[k]
    if type(v) == "table" then
      local ok, text = pcall(json.encode, v)
      local n = ok and #text or math.huge
      if n > max then
        return bad(k, ("is %s bytes of JSON: more than %d on this server (clrt serve --max-schema-bytes)")
          :format(n == math.huge and "too many" or tostring(n), max))
      end
    end
  end
end

-- Validate a chat-completions body. Returns the request table or (nil, status, body).
-- limits: max_tokens, max_n, vocab_size, max_messages, max_schema_bytes; tick: called now and
-- then while a large body is worked through (the server yields there).
function M.parse_chat_request(body, limits, tick)
  local req, status, err = decode_body(body, CHAT_PARAMETERS, tick, limits)
  if not req then return nil, status, err end
  if type(req.messages) ~= "table" or #req.messages == 0 then return bad("messages", "must be a non-empty array") end
  if limits.max_messages and #req.messages > limits.max_messages then
    return bad("messages", ("has %d messages: more than %d on this server (clrt serve --max-messages)")
      :format(#req.messages, limits.max_messages))
  end
  local _, s1, b1 = schema_too_large(req, limits)
  if s1 then return nil, s1, b1 end
  local msgs, uses_tools = {}, false
  for i, m in ipairs(req.messages) do
    if tick and i % 256 == 0 then tick() end
    local msg, s2, e2 = parse_message(m, ("messages[%d]"):format(i - 1))
    if not msg then return nil, s2, e2 end
    msgs[i] = msg
    if msg.tool_calls or msg.role == "tool" then uses_tools = true end
  end
  local out = { messages = msgs, stream = false, n = 1 }
  for _, parse in ipairs({ parse_sampling, parse_logprobs, parse_tools, parse_tool_choice }) do
    local ok, s3, e3 = parse(req, out, limits)
    if not ok then return nil, s3, e3 end
  end
  out.uses_tools = uses_tools
  return out
end

-- Validate a (legacy) completions body: one prompt, a string or an array of token ids (or an
-- array holding one of those). Returns the request table or (nil, status, body).
function M.parse_completion_request(body, limits, tick)
  local req, status, err = decode_body(body, COMPLETION_PARAMETERS, tick)
  if not req then return nil, status, err end
  local prompt = req.prompt
  if type(prompt) == "table" and #prompt > 1 and type(prompt[1]) ~= "number" then
    return bad("prompt", "holds several prompts: this server takes one prompt per request")
  end
  if type(prompt) == "table" and #prompt == 1 and type(prompt[1]) ~= "number" then prompt = prompt[1] end
  local out = { kind = "completion", stream = false, n = 1 }
  if type(prompt) == "string" and prompt ~= "" then
    out.prompt_text = prompt
  elseif type(prompt) == "table" and #prompt > 0 then
    for i, id in ipairs(prompt) do
      if not is_int(id) or id < 0 or id >= limits.vocab_size then
        return bad(("prompt[%d]"):format(i - 1), ("must be a token id in [0, %d)"):format(limits.vocab_size))
      end
    end
    out.prompt_ids = prompt
  else
    return bad("prompt", "must be a non-empty string or a non-empty array of token ids")
  end
  local ok, status2, err2 = parse_sampling(req, out, limits)
  if not ok then return nil, status2, err2 end
  -- what this server does not do is refused rather than ignored
  if req.echo ~= nil and req.echo ~= json.null and req.echo ~= false then return bad("echo", "is not supported (only false)") end
  if req.suffix ~= nil and req.suffix ~= json.null then return bad("suffix", "is not supported (no fill-in-the-middle)") end
  if req.logprobs ~= nil and req.logprobs ~= json.null then
    return bad("logprobs", "is not supported on /v1/completions (/v1/chat/completions has logprobs)")
  end
  if req.best_of ~= nil and req.best_of ~= json.null and req.best_of ~= out.n then
    return bad("best_of", "is not supported (only equal to n: every sample is returned)")
  end
  return out
end

-- The default response_format hook (OpenAI's forms): constrained decoding with a grammar
-- compiled here, so an unsupported schema feature is a 400 that names it.
function M.json_response_format(rf, gen_opts)
  if type(rf) ~= "table" then error("response_format must be an object", 0) end
  local JC = require("clrt.gen.json_constraint")
  if rf.type == "text" then return end
  if rf.type == "json_object" then
    gen_opts.json_schema = JC.compile("object")
  elseif rf.type == "json_schema" then
    local js = rf.json_schema
    if type(js) ~= "table" or (js.schema ~= nil and type(js.schema) ~= "table") then
      error("response_format.json_schema must be an object with a 'schema' object", 0)
    end
    gen_opts.json_schema = JC.compile(js.schema or true)
  else
    error(("response_format.type '%s' is not supported (text, json_object, json_schema)"):format(tostring(rf.type)), 0)
  end
end

local Server = {}
-- srv.dec and srv.engine: the scheduler's decoder and engine of the moment
Server.__index = function(srv, k)
  if k == "dec" or k == "engine" then return rawget(srv, "gen")[k == "dec" and "dec" or "eng"] end
  return Server[k]
end

-- new{model = m, tokenizer = tok, name = "model-name", host, port, api_key, slots, max_len,
--     max_tokens, max_body, log = function(line)}
function M.new(opts)
  local self = setmetatable({}, Server)
  self.model, self.tok = opts.model, opts.tokenizer
  self.name = opts.name or "clrt"
  self.api_key = opts.api_key
  -- what one request may cost before it is admitted (each a clrt serve flag, a 400 naming it)
  self.limits = { max_tokens = opts.max_tokens or 4096, max_n = math.min(opts.slots or 32, 16),
    max_messages = opts.max_messages or M.DEFAULT_MAX_MESSAGES, max_schema_bytes = opts.max_schema_bytes or M.DEFAULT_MAX_SCHEMA_BYTES }
  -- prompt caching across requests (clrt.gen.prefix_cache, docs/prefix_cache.md): MiB, 0 off
  if opts.prefix_cache_mb ~= nil then require("clrt.gen.prefix_cache").configure(self.model, { mb = opts.prefix_cache_mb }) end
  -- the model's one engine (clrt.gen.scheduler), its cache sized here; a test's decoder as given
  if opts.decoder then
    self.gen = G.attach(opts.model or opts.decoder, opts.decoder)
  else
    self.gen = G.reserve(self.model, opts.slots or 32, opts.max_len or 2048)
  end
  self.max_len = self.gen.dec.max_len
  self.limits.vocab_size = self.gen.dec.vocab_size
  self.http = require("clrt.net.httpd").start({ host = opts.host or "127.0.0.1", port = opts.port or 8000,
    max_body = opts.max_body or 4 * 1024 * 1024, header_timeout = opts.header_timeout, idle_timeout = opts.idle_timeout,
    max_connections = opts.max_connections, max_per_client = opts.max_connections_per_client })
  self.preparing = {}   -- requests being parsed, rendered, tokenized: coroutines the loop advances in turn
  self.log = opts.log or function() end
  self.created = os.time()
  self.counter = 0
  self.end_of_turn = opts.stop_ids or require("clrt.chat").stop_ids(self.tok)
  -- render(messages, {tools, prefix}) -> prompt ids; prefix: text the reply starts with
  self.supports_tools = opts.supports_tools
  self.tool_format = opts.tool_format
  if not self.tool_format and self.supports_tools == nil and not opts.render and self.tok then
    self.tool_format = require("clrt.chat").tool_format(self.tok)
  end
  if self.supports_tools == nil then self.supports_tools = self.tool_format ~= nil end
  self.tool_format = self.tool_format or require("clrt.chat").TOOL_FORMATS.qwen3
  -- the prompt is the template's text, encoded: no training masks (chat.render re-renders
  -- every assistant prefix for those, O(n^2) in the messages); a text longer than the context
  -- could hold even at the vocabulary's longest token is refused before it is tokenized
  self.render = opts.render or function(messages, extra)
    extra = extra or {}
    local chat = require("clrt.chat")
    if self.tool_format.args_object then messages = M.decoded_arguments(messages) end
    local o = { add_generation_prompt = true, tools = extra.tools, limits = { tick = extra.tick } }
    local text = chat.format(self.tok, messages, o) .. (extra.prefix or "")
    local most = self.max_len * self:longest_token()
    if #text > most then
      error(("the prompt is %d bytes: more than a context of %d tokens can hold (clrt serve --max-len)"):format(#text, self.max_len), 0)
    end
    return self.tok:encode(text, { add_special_tokens = false })
  end
  self.on_response_format = opts.on_response_format or (self.tok and M.json_response_format)
  return self
end

M.DEFAULT_MAX_MESSAGES = 2048
M.DEFAULT_MAX_SCHEMA_BYTES = 64 * 1024

-- The most bytes one token of the vocabulary decodes to (added tokens included).
function Server:longest_token()
  if self.longest then return self.longest end
  local most = 16
  for id = 0, (self.tok:vocab_size() or 0) - 1 do
    local ok, b = pcall(self.tok.token_bytes, self.tok, id)
    if ok and type(b) == "string" and #b > most then most = #b end
  end
  self.longest = most
  return most
end

function Server:port() return self.http:port() end

function Server:respond(id, status, body)
  self.http:respond(id, status, body, "application/json")
  self:access(id, status, 0)
end

-- The access log: one line per request once it is answered (method, path, status, completion
-- tokens, milliseconds), through opts.log.
function Server:access(id, status, tokens)
  local r = self.arrived and self.arrived[id]
  if not r then return end
  self.arrived[id] = nil
  self.log(("%s %s %d %d tokens %.0f ms"):format(r.method, r.path, status, tokens, (http.now() - r.t0) * 1000))
end


-- The messages with each tool call's arguments (OpenAI's JSON string) decoded, keys in order,
-- for templates that write them with tojson (a string that is not JSON stays a string).
function M.decoded_arguments(messages)
  local out = {}
  for i, m in ipairs(messages) do
    if m.tool_calls then
      local copy, calls = {}, {}
      for k, v in pairs(m) do copy[k] = v end
      for j, c in ipairs(m.tool_calls) do
        local f = c["function"]
        local ok, args = pcall(json.decode, f.arguments, "arguments", { key_order = true })
        calls[j] = { id = c.id, type = c.type, ["function"] = { name = f.name, arguments = ok and args or f.arguments } }
      end
      copy.tool_calls = calls
      out[i] = copy
    else
      out[i] = m
    end
  end
  return out
end

-- One call object {"name": ..., "<args_key>": ...} as the model wrote it -> {name, arguments
-- (a JSON string, keys in the model's order)}, or nil when it is not one.
local function tool_call_of(text, args_key)
  local ok, v = pcall(json.decode, text, "tool call", { key_order = true })
  if not ok or type(v) ~= "table" or type(v.name) ~= "string" then return nil end
  local args = v[args_key or "arguments"]
  if args == nil or args == json.null then args = json.object() end
  if type(args) ~= "string" then args = json.encode(args) end
  return { name = v.name, arguments = args }
end

-- The tool calls in a reply, in the template's format (clrt.chat.TOOL_FORMATS; Qwen's when
-- none is given): the whole text is one call object when `forced` (constrained decoding wrote
-- it after the format's prefix) or when the format is "json" (Llama 3.1: the reply is
-- {"name": ..., "parameters": ...}), else every <tool_call>...</tool_call> block. Returns
-- calls (nil when there are none, or one does not parse) and the content before the first
-- block (nil when empty).
function M.parse_tool_calls(text, forced, format)
  local key = format and format.args_key or "arguments"
  if forced then
    local call = tool_call_of(text, key)
    return call and { call } or nil, nil
  end
  if format and format.style == "json" then
    local call = tool_call_of((text:gsub("^%s*<|python_tag|>", "")), key)
    if call then return { call }, nil end
    return nil, text
  end
  local first = text:find("<tool_call>", 1, true)
  if not first then return nil, text end
  local calls = {}
  for body in text:gmatch("<tool_call>(.-)</tool_call>") do
    local call = tool_call_of(body)
    if not call then return nil, text end
    calls[#calls + 1] = call
  end
  if #calls == 0 then return nil, text end
  local content = text:sub(1, first - 1):gsub("%s+$", "")
  return calls, content ~= "" and content or nil
end

-- The JSON Schema that constrained decoding of a required/named tool call follows.
local function tool_call_schema(req, args_key)
  local names, params = {}, nil
  for _, t in ipairs(req.tool_schemas) do
    if type(req.tool_choice) ~= "table" or req.tool_choice.name == t.name then
      names[#names + 1] = t.name
      params = t.parameters
    end
  end
  -- one tool: its parameters' schema; a choice of several: any object
  local args = #names == 1 and (params or { type = "object" }) or { type = "object" }
  return { type = "object", properties = { name = { enum = names }, [args_key] = args },
    required = { "name", args_key }, additionalProperties = false }
end


-- How many bytes at the end of `text` could still grow into one of the stop strings (a stream
-- holds them back).
M.stop_holdback = reply.stop_holdback

-- The 500 of a request the engine failed: no source path in the message (the log has it all).
function Server:failure(err)
  return json_error(500, "internal error: " .. without_source(err), nil, "server_error")
end

-- ==== a request as a job for the engine =========================================================

-- What a request leaves out: generation_config.json's sampling (transformers' generate
-- defaults: greedy unless do_sample) from the tokenizer's folder or the model's, else {}
-- (OpenAI's temperature 1 and top_p 1).
function M.sampling_defaults(tok, model)
  local gc = tok and tok.generation_config or model and model.generation_config
  return gc and gc.defaults or {}
end

-- The options both endpoints share; default_max: max_new_tokens when the request sets none.
function Server:sampling(req, default_max)
  local stop = {}
  for _, id in ipairs(self.end_of_turn) do stop[#stop + 1] = id end
  for _, s in ipairs(req.stop or {}) do stop[#stop + 1] = s end
  local d = M.sampling_defaults(self.tok, self.model)
  return {
    n = req.n, max_new_tokens = req.max_tokens or default_max,
    temperature = req.temperature or d.temperature or 1.0, top_p = req.top_p or d.top_p or 1.0, top_k = d.top_k,
    seed = req.seed or math.random(0, 2 ^ 31),
    stop = stop, tokenizer = self.tok, logit_bias = req.logit_bias,
    frequency_penalty = req.frequency_penalty, presence_penalty = req.presence_penalty,
  }
end

-- The job: prompt ids, engine options, shape, ids for the response; or nil, status, body when
-- the prompt and max_tokens exceed the context (`param` names the prompt's field).
function Server:job(req, ids, opts, shape, param)
  if #ids + opts.max_new_tokens > self.max_len then
    return nil, json_error(400, ("the prompt has %d tokens and max_tokens is %d: more than the context of %d (clrt serve --max-len)")
      :format(#ids, opts.max_new_tokens, self.max_len), param, nil, "context_length_exceeded")
  end
  self.counter = self.counter + 1
  return { ids = ids, o = options.check(opts, self.limits.vocab_size), shape = shape, tok = self.tok, model = self.name,
    id = ("%s-%d-%d"):format(shape.id_prefix, self.created, self.counter), created = os.time(),
    stream = req.stream, include_usage = req.include_usage, logprobs = req.logprobs,
    tool_result = function(row) return nil, row.text end }
end

-- The chat prompt: tools checked, the messages rendered (a tool call forced by tool_choice is
-- begun in the prompt). Returns ids, tools_on, forced or nil, status, body.
function Server:chat_prompt(req)
  local tools_on = req.tools ~= nil and req.tool_choice ~= "none"
  if (req.tools or req.uses_tools) and not self.supports_tools then
    return nil, json_error(400, "tools are not supported by this model: its chat template has no tool format "
      .. "(clrt renders those of Qwen2.5, Qwen3 and Llama 3.1-3.3)", req.tools and "tools" or "messages", nil, "tools_not_supported")
  end
  -- tool_choice "required" or a named function: the reply starts as a tool call and its
  -- JSON is decoded under the call's schema
  local forced = tools_on and (req.tool_choice == "required" or type(req.tool_choice) == "table")
  local fmt = self.tool_format
  local rendered, ids = pcall(self.render, req.messages, { tools = req.tools, prefix = forced and fmt.prefix or nil, tick = req.tick })
  if not rendered then   -- the chat template refused these messages
    return nil, json_error(400, "messages could not be rendered: " .. without_source(ids), "messages")
  end
  return ids, tools_on, forced
end

-- Constrained decoding into opts: response_format's grammar, or the forced tool call's.
-- Returns true or nil, status, body.
function Server:constrain(req, opts, forced)
  if req.response_format then
    if not self.on_response_format then
      return nil, json_error(400, "'response_format' is not supported by this server", "response_format")
    end
    local ok, err = pcall(self.on_response_format, req.response_format, opts)
    if not ok then return nil, json_error(400, tostring(err), "response_format") end
  end
  if forced then
    if req.response_format then
      return nil, json_error(400, "'response_format' cannot be combined with a required tool call", "response_format")
    end
    -- compact JSON (no whitespace between tokens): the call fits a small max_tokens
    local ok, grammar = pcall(require("clrt.gen.json_constraint").compile, tool_call_schema(req, self.tool_format.args_key), { max_ws = 0 })
    if not ok then return nil, json_error(400, "tools: " .. tostring(grammar), "tools") end
    opts.json_schema = grammar
  end
  return true
end

-- A /v1/chat/completions request as a job, or nil, status, body.
function Server:chat_job(req)
  local ids, tools_on, forced = self:chat_prompt(req)
  if not ids then return nil, tools_on, forced end
  local opts = self:sampling(req, math.min(self.limits.max_tokens, self.max_len - #ids))
  opts.top_logprobs = req.logprobs and (req.top_logprobs or 0) or nil
  local ok, status, body = self:constrain(req, opts, forced)
  if not ok then return nil, status, body end
  local job, s2, b2 = self:job(req, ids, opts, reply.CHAT, "messages")
  if not job then return nil, s2, b2 end
  job.tools_on = tools_on
  -- a finished row's tool calls (OpenAI's shape) and content, when tools are on
  job.tool_result = function(row)
    if not tools_on then return nil, row.text end
    local calls, content = M.parse_tool_calls(row.text, forced, self.tool_format)
    if not calls then return nil, row.text end
    if req.single_tool_call then calls = { calls[1] } end   -- parallel_tool_calls: false
    local out = json.array()
    for j, c in ipairs(calls) do
      out[j] = { id = ("call_%s_%d_%d"):format(job.id:match("%d+%-%d+$"), row.sample, j), type = "function",
        ["function"] = { name = c.name, arguments = c.arguments } }
    end
    return out, content
  end
  return job
end

-- A /v1/completions request: the prompt continued as plain text (no chat template), until
-- max_tokens (16 by default, as OpenAI's), a stop string, or the end-of-text/turn token.
function Server:completion_job(req)
  if not self.tok then return nil, json_error(404, "/v1/completions needs the model's tokenizer", "prompt") end
  if req.prompt_text and #req.prompt_text > self.max_len * self:longest_token() then   -- refused before it is tokenized
    return nil, json_error(400, ("the prompt is %d bytes: more than a context of %d tokens can hold (clrt serve --max-len)")
      :format(#req.prompt_text, self.max_len), "prompt", nil, "context_length_exceeded")
  end
  local ids = req.prompt_ids or self.tok:encode(req.prompt_text)
  return self:job(req, ids, self:sampling(req, 16), reply.COMPLETION, "prompt")
end

-- A parsed request into the scheduler's queue (clrt.gen.scheduler: it starts when its rows fit).
function Server:submit(r, req)
  local job, status, body = (req.kind == "completion" and self.completion_job or self.chat_job)(self, req)
  if not job then return self:respond(r.id, status, body) end
  G.submit(self.gen, job.ids, job.o, reply.producer(self, job, reply.writer(self, r.id, job)), 1)
end

-- Submit a request; a failure the checks did not foresee is the server's: a 500 whose message
-- carries no source path (the log has the whole error).
function Server:submit_or_fail(r, req)
  local ok, err = pcall(self.submit, self, r, req)
  if not ok then
    self.log("request failed: " .. tostring(err))
    pcall(self.respond, self, r.id, json_error(500, "internal error: " .. without_source(err), nil, "server_error"))
  end
end

function Server:model_object()
  return { id = self.name, object = "model", created = self.created, owned_by = "clrt" }
end

local function model_not_found(name)
  return json_error(404, ("The model '%s' does not exist on this server"):format(tostring(name)), "model",
    "invalid_request_error", "model_not_found")
end

function Server:handle(r)
  self.arrived = self.arrived or {}
  self.arrived[r.id] = { method = r.method, path = r.path, t0 = http.now() }
  local path = r.path:gsub("/+$", "")
  if path == "/health" then   -- open without the key: load balancers and readiness probes
    if r.method ~= "GET" then return self:respond(r.id, json_error(405, "use GET for /health")) end
    return self:respond(r.id, 200, '{"status":"ok"}')
  end
  if self.api_key and r.authorization ~= "Bearer " .. self.api_key then
    return self:respond(r.id, json_error(401, "invalid or missing API key (Authorization: Bearer ...)", nil, "authentication_error"))
  end
  local model_id = path:match("^/v1/models/(.+)$")
  if path == "/v1/models" or model_id then
    if r.method ~= "GET" then return self:respond(r.id, json_error(405, "use GET for " .. path)) end
    if not model_id then
      return self:respond(r.id, 200, json.encode({ object = "list", data = json.array({ self:model_object() }) }))
    end
    model_id = model_id:gsub("%%(%x%x)", function(h) return string.char(tonumber(h, 16)) end)
    if model_id ~= self.name then return self:respond(r.id, model_not_found(model_id)) end
    return self:respond(r.id, 200, json.encode(self:model_object()))
  elseif path == "/v1/chat/completions" or path == "/v1/completions" then
    if r.method ~= "POST" then return self:respond(r.id, json_error(405, "use POST for " .. path)) end
    -- parsed, rendered and tokenized in a coroutine that yields every few milliseconds of
    -- work, so a large request never stops the loop from answering others (Server:tick)
    local co = coroutine.create(function() self:prepare(r, path) end)
    self.preparing[#self.preparing + 1] = { co = co, r = r }
  else
    return self:respond(r.id, json_error(404, ("no route for %s %s"):format(r.method, r.path)))
  end
end

-- A chat or completion request: parsed, checked, its prompt rendered and tokenized, submitted.
-- Runs in a coroutine (Server:handle); `yield` hands the loop back between slices of work.
function Server:prepare(r, path)
  local yield = coroutine.yield
  local parse = path == "/v1/completions" and M.parse_completion_request or M.parse_chat_request
  local parsed, req, status, body = pcall(parse, r.body, self.limits, yield)
  if not parsed then   -- a case the checks above missed: the request's fault, not the server's
    self.log("request not understood: " .. tostring(req))
    return self:respond(r.id, json_error(400, "request not understood: " .. without_source(req)))
  end
  if not req then return self:respond(r.id, status, body) end
  if req.model and req.model ~= self.name then return self:respond(r.id, model_not_found(req.model)) end
  req.tick = yield
  self:submit_or_fail(r, req)
end

-- Advance the requests being prepared, each a slice in turn, for up to budget_ms.
function Server:advance_preparing(budget_ms)
  local t0 = http.now()
  while #self.preparing > 0 do
    local keep = {}
    for _, p in ipairs(self.preparing) do
      local ok, err = coroutine.resume(p.co)
      if not ok then   -- prepare's own failure: the server's, a 500
        self.log("request failed: " .. tostring(err))
        pcall(self.respond, self, p.r.id, json_error(500, "internal error: " .. without_source(err), nil, "server_error"))
      elseif coroutine.status(p.co) ~= "dead" then
        keep[#keep + 1] = p
      end
    end
    self.preparing = keep
    if (http.now() - t0) * 1000 >= budget_ms then break end
  end
end

-- One turn of the loop: take what arrived (waiting up to idle_ms when there is nothing to
-- decode or prepare), prepare requests for a slice of time, start what fits, decode one step
-- for everyone.
function Server:tick(idle_ms)
  G.admit(self.gen)
  local wait = (G.busy(self.gen) or #self.preparing > 0) and 0 or (idle_ms or 50)
  while true do
    local r = self.http:next(wait)
    if not r then break end
    wait = 0
    self:handle(r)
  end
  self:advance_preparing(20)
  G.admit(self.gen)
  local _, err = G.step(self.gen)
  if G.is_interrupt(err) then error(err, 0) end   -- Ctrl-C stops the server
end

function Server:run(should_stop)
  while not (should_stop and should_stop()) do self:tick(100) end
end

function Server:stop() self.http:stop() end

return M
