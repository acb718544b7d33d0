-- clrt.llm — a client for any OpenAI-compatible /v1/chat/completions endpoint (OpenAI, vLLM,
-- SGLang, llama.cpp server, Ollama, a LiteLLM proxy, `clrt serve`).
--
--   local c = clrt.llm.client{base_url = "http://127.0.0.1:8000/v1", model = "gpt-4o-mini",
--                             api_key_env = "OPENAI_API_KEY", timeout = 60, max_retries = 5,
--                             max_concurrency = 32, defaults = {temperature = 0.7}}
--   local r = c:chat({{role = "user", content = "hi"}}, {max_tokens = 64})
--   r.content, r.finish_reason, r.usage.total_tokens
--
-- Inside clrt.sched.run functions c:chat yields, so hundreds of calls are in flight at once
-- (at most max_concurrency per client); elsewhere it blocks. Connection errors, timeouts,
-- 429, 500, 502, 503, 504 and a 200 whose body is not a chat completion are retried with
-- exponential back-off and jitter (at least as long as a Retry-After header asks) up to
-- max_retries times; any other 4xx fails at once with the server's own message. When the
-- retries run out the error lists what happened on each attempt.
--
-- The key is read once from the environment variable api_key_env, kept out of the client
-- table, sent only in the Authorization header, and scrubbed from every error and record.
-- opts other than timeout/max_retries go into the request body as they are (response_format,
-- stop, seed, ...), over the client's defaults.
--
-- Options: base_url (with /v1; "/chat/completions" is appended), model, api_key_env, timeout
-- (s per attempt, 60), max_retries (5), max_concurrency (32 in flight), defaults (body fields),
-- backoff (first wait, 0.5 s; doubles, times a jitter in [0.5, 1]), max_backoff (30 s),
-- max_retry_after (cap on a server's Retry-After, 300 s), headers (extra, {Name = value}),
-- ca_file (a PEM bundle to trust instead of the system's CAs; verification is always on).
-- Spend (docs/api_cost.md): role (what the calls are for, "user" or "judge"; a call's
-- opts.role wins, e.g. "judge/accuracy"), price ({input, cached_input, output} dollars per
-- million tokens; default clrt.api.prices' table for the model, none for an unknown model),
-- rpm / tpm (requests and tokens per minute, shared by every client of the same base URL and
-- key: clrt.api.rate_limit; rate_window, 60 s, is shortened only by tests), cache (a
-- clrt.api.reply_cache: replies to deterministic requests, temperature 0, are stored and
-- reused; cache_all = true or a call's opts.cache = true stores every reply, opts.cache =
-- false none, opts.cache = "refresh" asks anew and replaces the stored reply: a parse retry's,
-- since the stored one was unusable). Identical cacheable requests in flight at once are sent once.
--
-- Records: every call appends {model, base_url, role, ok, attempts, retries, status, latency,
-- prompt_tokens, completion_tokens, total_tokens, cached_tokens, cost_usd (nil: no price),
-- unpriced, cache ("hit" / "miss" when cacheable), rate_wait_s, outcomes (one line per failed
-- attempt), error} to c.records and to clrt.llm.records(); c:stats() and clrt.llm.stats() sum them up,
-- clrt.llm.drain_records() hands them to a run's log and starts afresh.
local http = require("clrt.net.http")
local request = require("clrt.net.request").request
local sched = require("clrt.sched")
local prices, rate_limit   -- clrt.api.prices / rate_limit, loaded with the first client
local json = require("clrt.json")

local M = {}
local Client = {}
Client.__index = Client

local secret = setmetatable({}, { __mode = "k" })   -- client -> {header =, key =}
local all_records = {}

-- Jitter comes from its own generator so retries never disturb math.random's sequence.
local rng_state = math.floor((http.now() % 1) * 2 ^ 31) + 12345
local function jitter()
  rng_state = (rng_state * 1103515245 + 12345) % 2147483648
  return rng_state / 2147483648
end

local CONFIG_KEYS = {
  base_url = true, model = true, api_key_env = true, timeout = true, max_retries = true,
  max_concurrency = true, defaults = true, backoff = true, max_backoff = true, max_retry_after = true,
  headers = true, ca_file = true, role = true, price = true, rpm = true, tpm = true, rate_window = true, cache = true,
  cache_all = true,
}
-- call options never sent: tag names who asked (one future of an RL step) in the call's record
local CALL_KEYS = { timeout = true, max_retries = true, role = true, cache = true, tag = true }
local inflight = {}   -- cache key hash -> tasks waiting for the same request's reply
local RETRY_STATUS = { [429] = true, [500] = true, [502] = true, [503] = true, [504] = true }

local function sorted_keys(t)
  local ks = {}
  for k in pairs(t) do ks[#ks + 1] = k end
  table.sort(ks)
  return ks
end

function M.client(cfg)
  if type(cfg) ~= "table" then error("clrt.llm.client: expected a table of options", 2) end
  for k in pairs(cfg) do
    if k == "api_key" then
      error("clrt.llm.client: pass the key through api_key_env (the name of an environment variable), " ..
            "never as a value, so it stays out of configs, logs and checkpoints", 2)
    end
    if not CONFIG_KEYS[k] then
      error(("clrt.llm.client: unknown option '%s' (known: %s)"):format(tostring(k),
            table.concat(sorted_keys(CONFIG_KEYS), ", ")), 2)
    end
  end
  if type(cfg.base_url) ~= "string" or not cfg.base_url:match("^https?://") then
    error("clrt.llm.client: base_url must be an http:// or https:// URL such as http://127.0.0.1:8000/v1, got "
          .. tostring(cfg.base_url), 2)
  end
  if type(cfg.model) ~= "string" or cfg.model == "" then error("clrt.llm.client: model must be a non-empty string", 2) end
  local key
  if cfg.api_key_env ~= nil then
    key = os.getenv(cfg.api_key_env)
    if not key or key == "" then
      error(("clrt.llm.client: the environment variable %s (api_key_env) is not set"):format(cfg.api_key_env), 2)
    end
  end
  local max_conc = cfg.max_concurrency or 32
  if type(max_conc) ~= "number" or max_conc < 1 then error("clrt.llm.client: max_concurrency must be >= 1", 2) end
  for _, k in ipairs({ "rpm", "tpm", "rate_window" }) do
    if cfg[k] ~= nil and (type(cfg[k]) ~= "number" or cfg[k] <= 0) then
      error(("clrt.llm.client: %s must be a number > 0, got %s"):format(k, tostring(cfg[k])), 2)
    end
  end
  prices = prices or require("clrt.api.prices")
  rate_limit = rate_limit or require("clrt.api.rate_limit")
  local c = setmetatable({
    base_url = cfg.base_url:gsub("/+$", ""),
    model = cfg.model,
    timeout = cfg.timeout or 60,
    max_retries = cfg.max_retries or 5,
    max_concurrency = max_conc,
    defaults = cfg.defaults or {},
    backoff = cfg.backoff or 0.5,           -- first back-off, seconds; doubles each retry
    max_backoff = cfg.max_backoff or 30,
    max_retry_after = cfg.max_retry_after or 300,
    ca_file = cfg.ca_file,                  -- trust this PEM bundle instead of the system's CAs
    records = {},
    slots = sched.semaphore(max_conc),
    role = cfg.role,
    price = prices.lookup(cfg.model, cfg.price),
    cache = cfg.cache or nil,
    cache_all = cfg.cache_all,
  }, Client)
  -- one limiter per endpoint and credential: clients that share both share the provider's limits
  c.limiter = rate_limit.shared(c.base_url .. "\0" .. (key or ""), { rpm = cfg.rpm, tpm = cfg.tpm, window = cfg.rate_window })
  c.url = c.base_url .. "/chat/completions"
  local headers = { "Content-Type: application/json", "Accept: application/json" }
  for k, v in pairs(cfg.headers or {}) do headers[#headers + 1] = k .. ": " .. v end
  if key then headers[#headers + 1] = "Authorization: Bearer " .. key end
  secret[c] = { headers = headers, key = key }
  return c
end

function Client:__tostring()
  return ("clrt.llm.client(%s at %s)"):format(self.model, self.base_url)
end

-- Every string that leaves this module passes through here.
local function redact(c, s)
  s = tostring(s)
  local key = secret[c] and secret[c].key
  if not key then return s end
  local out, i = {}, 1
  while true do
    local a, b = s:find(key, i, true)
    if not a then break end
    out[#out + 1] = s:sub(i, a - 1)
    out[#out + 1] = "[redacted]"
    i = b + 1
  end
  out[#out + 1] = s:sub(i)
  return table.concat(out)
end

local function clip(s, n)
  s = s:gsub("%s+", " "):gsub("^ ", ""):gsub(" $", "")
  if #s > n then s = s:sub(1, n) .. "..." end
  return s
end

-- The server's own words: error.message from a JSON body, else the body's text.
local function server_message(body)
  local ok, obj = pcall(json.decode, body)
  if ok and type(obj) == "table" then
    local e = obj.error
    if type(e) == "table" and type(e.message) == "string" then return clip(e.message, 500) end
    if type(e) == "string" then return clip(e, 500) end
    if type(obj.message) == "string" then return clip(obj.message, 500) end
    if type(obj.detail) == "string" then return clip(obj.detail, 500) end
  end
  local text = body:gsub("<[^>]*>", " ")
  if text:match("^%s*$") then return "(empty body)" end
  return clip(text, 200)
end

local function null_to_nil(v)
  if v == json.null then return nil end
  return v
end

-- A 2xx body that is a chat completion, or nil and why not.
local function parse_completion(body)
  local ok, obj = pcall(json.decode, body)
  if not ok or type(obj) ~= "table" then return nil, "body is not JSON: " .. clip(body, 120) end
  local choice = type(obj.choices) == "table" and obj.choices[1]
  local msg = type(choice) == "table" and choice.message
  if type(msg) ~= "table" then return nil, "JSON without choices[1].message: " .. clip(body, 120) end
  local content = null_to_nil(msg.content)
  if content ~= nil and type(content) ~= "string" then
    return nil, "choices[1].message.content is a " .. type(content)
  end
  local usage = {}
  if type(obj.usage) == "table" then
    for k, v in pairs(obj.usage) do if type(v) == "number" then usage[k] = v end end
    -- OpenAI reports the prompt tokens served from its prompt cache here (billed lower)
    local details = obj.usage.prompt_tokens_details
    if type(details) == "table" and type(details.cached_tokens) == "number" then usage.cached_tokens = details.cached_tokens end
  end
  return {
    content = content or "",
    finish_reason = null_to_nil(choice.finish_reason),
    usage = usage,
    model = null_to_nil(obj.model),
    raw = obj,
  }
end

local function check_messages(messages)
  if type(messages) ~= "table" or #messages == 0 then
    error("clrt.llm: chat needs a non-empty list of messages", 3)
  end
  for i, m in ipairs(messages) do
    if type(m) ~= "table" or type(m.role) ~= "string" then
      error(("clrt.llm: messages[%d] must be a table with a string role"):format(i), 3)
    end
    if m.content ~= nil and type(m.content) ~= "string" and type(m.content) ~= "table" then
      error(("clrt.llm: messages[%d].content is a %s"):format(i, type(m.content)), 3)
    end
  end
end

local function add_record(c, rec)
  c.records[#c.records + 1] = rec
  all_records[#all_records + 1] = rec
end

-- What the provider counts against a tokens-per-minute limit before a reply exists: the
-- request's size at about four bytes a token plus the reply it may take (OpenAI's rule).
local function token_estimate(json, body)
  local reply = body.max_completion_tokens or body.max_tokens
  return math.ceil(#json / 4) + (type(reply) == "number" and reply or 0)
end

local function record_usage(c, rec, usage)
  rec.prompt_tokens = usage.prompt_tokens
  rec.completion_tokens = usage.completion_tokens
  rec.total_tokens = usage.total_tokens
  rec.cached_tokens = usage.cached_tokens
  if c.price then rec.cost_usd = prices.cost(c.price, usage) else rec.unpriced = true end
end

-- A reply another call in flight is fetching for the same key: wait for it, then read the
-- cache again (nil when that call failed: this one then asks itself).
local function wait_inflight(c, ck)
  local task = sched.current()
  local waiters = inflight[ck.hash]
  if not task or not waiters then return nil end
  waiters[#waiters + 1] = task
  sched.suspend(function()
    for i, w in ipairs(waiters) do if w == task then table.remove(waiters, i) break end end
  end)
  return c.cache:get(ck)
end

local function release_inflight(ck)
  local waiters = inflight[ck.hash]
  inflight[ck.hash] = nil
  for _, t in ipairs(waiters or {}) do sched.wake(t) end
end

function Client:chat(messages, opts)
  check_messages(messages)
  opts = opts or {}
  local body = { model = self.model }
  for k, v in pairs(self.defaults) do body[k] = v end
  for k, v in pairs(opts) do if not CALL_KEYS[k] then body[k] = v end end
  body.messages = messages
  local ok, text = pcall(json.encode, body)
  if not ok then error("clrt.llm: cannot encode the request as JSON: " .. tostring(text), 2) end
  local max_retries = opts.max_retries or self.max_retries
  local timeout = opts.timeout or self.timeout
  local req = { method = "POST", url = self.url, headers = secret[self].headers, body = text, timeout = timeout,
                ca_file = self.ca_file }
  local t0 = http.now()
  local outcomes = {}
  local rec = { model = body.model, base_url = self.base_url, role = opts.role or self.role, attempts = 0, retries = 0,
                ok = false, rate_wait_s = 0, tag = opts.tag }
  local slots = self.slots

  -- a deterministic request (temperature 0) or one asked to be cached: the stored reply, if any
  local ck
  if self.cache and opts.cache ~= false
      and (opts.cache == true or opts.cache == "refresh" or self.cache_all or body.temperature == 0) then
    ck = self.cache:key(self.base_url, body.model, body)
    local text = opts.cache ~= "refresh" and (self.cache:get(ck) or wait_inflight(self, ck))
    local res = text and parse_completion(text)
    if res then
      rec.ok, rec.cache, rec.latency, rec.cost_usd = true, "hit", http.now() - t0, 0
      add_record(self, rec)
      return res
    end
    rec.cache = "miss"
    if inflight[ck.hash] then ck = nil else inflight[ck.hash] = {} end   -- (the leader failed: ask, don't lead)
  end
  local function finish_inflight() if ck then release_inflight(ck) end end

  local estimate = token_estimate(text, body)
  for attempt = 1, max_retries + 1 do
    slots.acquire()
    local ok_rl, ticket, waited = pcall(self.limiter.acquire, self.limiter, estimate)
    if not ok_rl then
      slots.release()
      finish_inflight()
      error(("clrt.llm: %s at %s: %s"):format(body.model, self.url, tostring(ticket)), 2)
    end
    rec.rate_wait_s = rec.rate_wait_s + waited
    local released = false
    local r = request(req, function()
      if not released then released = true; slots.release(); self.limiter:settle(ticket); finish_inflight() end
    end)
    released = true
    slots.release()
    self.limiter:observe(r)
    self.limiter:settle(ticket)   -- answered now (its tokens corrected below when usage came)
    rec.attempts = attempt
    rec.retries = attempt - 1
    rec.status = r.status
    local why, retry
    if r.error_code ~= 0 then
      why, retry = (r.timed_out and "timeout: " or "connection error: ") .. r.error, true
    elseif r.status >= 200 and r.status < 300 then
      local res, bad = parse_completion(r.body)
      if res then
        rec.ok = true
        rec.latency = http.now() - t0
        record_usage(self, rec, res.usage)
        self.limiter:settle(ticket, res.usage.total_tokens)
        if #outcomes > 0 then rec.outcomes = outcomes end
        -- billed before the reply is cached: a stop (Ctrl-C, SIGTERM to an async worker) that
        -- lands between the two then leaves a billed reply that is asked again, never a cached
        -- one that no record paid for
        add_record(self, rec)
        if ck then
          local put_ok, err = pcall(self.cache.put, self.cache, ck, r.body)
          if not put_ok then rec.cache_error = tostring(err) end
          finish_inflight()
        end
        return res
      end
      why, retry = ("HTTP %d with an unexpected body (%s)"):format(r.status, bad), true
    else
      why = ("HTTP %d: %s"):format(r.status, server_message(r.body))
      retry = RETRY_STATUS[r.status] or false
    end
    why = redact(self, why)
    outcomes[#outcomes + 1] = why
    if not retry then
      if r.status == 401 or r.status == 403 then
        -- a refused key fails every later call too: the run that owns this client asks
        -- c:take_auth_error() between phases and stops
        self.auth_error = self.auth_error or ("%s at %s refused the request: %s"):format(body.model, self.url, why)
      end
      rec.latency = http.now() - t0
      rec.outcomes = outcomes
      rec.error = why
      add_record(self, rec)
      finish_inflight()
      error(("clrt.llm: %s at %s: %s"):format(body.model, self.url, why), 2)
    end
    if attempt <= max_retries then
      local wait = math.min(self.max_backoff, self.backoff * 2 ^ (attempt - 1)) * (0.5 + 0.5 * jitter())
      if r.retry_after and r.retry_after >= 0 then wait = math.max(wait, math.min(r.retry_after, self.max_retry_after)) end
      sched.sleep(wait)
    end
  end
  local lines = {}
  for i, o in ipairs(outcomes) do lines[i] = ("  attempt %d: %s"):format(i, o) end
  rec.latency = http.now() - t0
  rec.outcomes = outcomes
  rec.error = "gave up after " .. #outcomes .. " attempts"
  add_record(self, rec)
  finish_inflight()
  error(("clrt.llm: %s at %s: gave up after %d attempts:\n%s"):format(body.model, self.url, #outcomes,
        table.concat(lines, "\n")), 2)
end

local function percentile(sorted, p)
  if #sorted == 0 then return nil end
  return sorted[math.max(1, math.ceil(p * #sorted))]
end

local function summarize(records)
  local s = { calls = #records, ok = 0, failed = 0, retries = 0, attempts = 0,
              prompt_tokens = 0, completion_tokens = 0, total_tokens = 0 }
  local lat = {}
  for _, r in ipairs(records) do
    if r.ok then s.ok = s.ok + 1 else s.failed = s.failed + 1 end
    s.retries = s.retries + r.retries
    s.attempts = s.attempts + r.attempts
    s.prompt_tokens = s.prompt_tokens + (r.prompt_tokens or 0)
    s.completion_tokens = s.completion_tokens + (r.completion_tokens or 0)
    s.total_tokens = s.total_tokens + (r.total_tokens or 0)
    lat[#lat + 1] = r.latency
  end
  table.sort(lat)
  local sum = 0
  for _, v in ipairs(lat) do sum = sum + v end
  s.latency_mean = #lat > 0 and sum / #lat or nil
  s.latency_p50, s.latency_p95, s.latency_max = percentile(lat, 0.5), percentile(lat, 0.95), lat[#lat]
  return s
end

-- This client's calls so far, summed up: calls, ok, failed, retries, tokens, latency.
-- GET <base_url>/models, once, before a run's first step (clrt.train.endpoints): the status
-- and the served model ids, or the transport error. Not counted in the client's records.
function Client:list_models()
  local r = request({ method = "GET", url = self.base_url .. "/models", headers = secret[self].headers,
    timeout = math.min(self.timeout, 15), ca_file = self.ca_file })
  if r.error_code ~= 0 then return { error = redact(self, tostring(r.error)) } end
  local ids = {}
  if r.status >= 200 and r.status < 300 then
    local ok, doc = pcall(json.decode, r.body or "")
    if ok and type(doc) == "table" and type(doc.data) == "table" then
      for _, m in ipairs(doc.data) do
        if type(m) == "table" and type(m.id) == "string" then ids[#ids + 1] = m.id end
      end
    end
  end
  return { status = r.status, ids = ids, message = r.status >= 300 and redact(self, server_message(r.body) or "") or nil }
end

function Client:stats() return summarize(self.records) end
function Client:reset_stats() self.records = {} end
-- The first 401/403 answer this client got since the last call ("MODEL at URL refused the
-- request: HTTP 401: ..."), or nil; taking it clears it.
function Client:take_auth_error()
  local e = self.auth_error
  self.auth_error = nil
  return e
end

-- Every call of every client in this process: {model, base_url, ok, attempts, retries,
-- status, latency (s), prompt_tokens, completion_tokens, total_tokens, outcomes, error}.
function M.records() return all_records end
function M.stats() return summarize(all_records) end
-- Hand the records to the run's log and start afresh (a long run calls this every step).
-- Records made elsewhere (other data-parallel ranks' calls), counted with this process's.
function M.add_records(list)
  for _, rec in ipairs(list) do all_records[#all_records + 1] = rec end
end

function M.drain_records()
  local r = all_records
  all_records = {}
  return r
end


M.extract_json = require("clrt.net.llm_json").extract_json

return M
