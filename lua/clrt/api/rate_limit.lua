-- clrt.api.rate_limit — requests-per-minute and tokens-per-minute limits of one endpoint,
-- enforced before a request leaves.
--   local lim = rate_limit.shared(key, {rpm = 500, tpm = 200000})  -- one per base URL + API key
--   local ticket, waited = lim:acquire(estimated_tokens)            -- waits (yields in a task)
--   lim:settle(ticket, actual_tokens)                               -- the response's usage
--   lim:observe(response)                                           -- rate-limit headers, 429
-- A token bucket whose tokens come back exactly `window` seconds (60) after the request that
-- spent them was answered: every admitted request is kept with its tokens while in flight
-- and for `window` seconds after its answer, and a request is admitted only when the
-- requests and tokens kept plus its own stay within rpm and tpm. The provider counts a
-- request somewhere between its sending and its answer; counting it from sending to answer +
-- window covers every such moment, so no window of that length, as the provider sees it,
-- holds more than the limits (a bucket refilling at L per minute with capacity L admits up
-- to 2L in one). Tokens are the caller's
-- estimate (what the provider counts against the limit: the prompt's size plus max_tokens)
-- until settle() replaces them with the usage the response reports.
-- The provider's own view slows the limiter down: x-ratelimit-remaining-requests /
-- -tokens at zero (or below the next request's tokens) hold every request to the endpoint
-- until x-ratelimit-reset-requests / -tokens, and a 429's Retry-After holds them for that long.
local http = require("clrt.net.http")
local M = {}
local Limiter = {}
Limiter.__index = Limiter

local registry = {}   -- key -> limiter (the key names an endpoint and its credential; never logged)

function M.new(opts)
  opts = opts or {}
  return setmetatable({ rpm = opts.rpm, tpm = opts.tpm, window = opts.window or 60, sent = {},
    hold_until = 0, provider = {}, waited = 0, now = opts.now or http.now, sleep = opts.sleep }, Limiter)
end

-- The limiter of an endpoint: clients with the same key share it; the tighter of two limits
-- given for it holds.
function M.shared(key, opts)
  local lim = registry[key]
  if not lim then
    lim = M.new(opts)
    registry[key] = lim
    return lim
  end
  for _, k in ipairs({ "rpm", "tpm" }) do
    if opts and opts[k] and (not lim[k] or opts[k] < lim[k]) then lim[k] = opts[k] end
  end
  if opts and opts.window then lim.window = opts.window end
  return lim
end

-- Forget every shared limiter (tests; a new run in the same process).
function M.reset() registry = {} end

-- Entries still in the window: those in flight (t = nil) and those answered less than
-- `window` seconds ago. Returns their count and tokens, and the answered ones' times sorted.
local function in_window(self, now)
  local cut = now - self.window
  local kept, n, tokens = {}, 0, 0
  for _, e in ipairs(self.sent) do
    if e.t == nil or e.t > cut then
      n = n + 1
      kept[n] = e
      tokens = tokens + e.tokens
    end
  end
  self.sent = kept
  return n, tokens
end

local POLL = 0.05   -- how often a request waiting only on others in flight looks again

-- Seconds until `tokens` more can be admitted (0: now).
function Limiter:delay(tokens)
  local now = self.now()
  local wait = math.max(0, self.hold_until - now)
  local p = self.provider
  if p.requests_left and p.requests_left <= 0 and p.requests_reset and p.requests_reset > now then
    wait = math.max(wait, p.requests_reset - now)
  end
  if p.tokens_left and p.tokens_left < tokens and p.tokens_reset and p.tokens_reset > now then
    wait = math.max(wait, p.tokens_reset - now)
  end
  local n, used = in_window(self, now)
  local over_n = self.rpm and n + 1 - self.rpm or 0
  local over_t = self.tpm and used + tokens - self.tpm or 0
  if over_n > 0 or over_t > 0 then
    -- answered entries leave the window in the order they were answered
    local done = {}
    for _, e in ipairs(self.sent) do if e.t then done[#done + 1] = e end end
    table.sort(done, function(x, y) return x.t < y.t end)
    local until_ok = POLL
    for _, e in ipairs(done) do
      over_n, over_t = over_n - 1, over_t - e.tokens
      if over_n <= 0 and over_t <= 0 then until_ok = e.t + self.window - now; break end
    end
    wait = math.max(wait, until_ok)
  end
  return wait
end

function Limiter:acquire(tokens)
  tokens = tokens or 0
  if self.tpm and tokens > self.tpm then
    error(("rate limit: one request needs about %d tokens (prompt + max_tokens), more than tpm=%d allows in a minute; "
      .. "raise tpm or lower max_tokens"):format(tokens, self.tpm), 0)
  end
  local sleep = self.sleep or require("clrt.sched").sleep
  local waited = 0
  while true do
    local d = self:delay(tokens)
    if d <= 0 then break end
    d = d + 1e-3   -- past the boundary, so the entry has left the window when we look again
    sleep(d)
    waited = waited + d
  end
  -- in flight: counted in every window until its answer comes (t = nil), so the provider,
  -- whichever moment between sending and answering it counts the request at, never sees more
  local ticket = { tokens = tokens }
  self.sent[#self.sent + 1] = ticket
  local p = self.provider
  if p.requests_left then p.requests_left = p.requests_left - 1 end
  if p.tokens_left then p.tokens_left = p.tokens_left - tokens end
  self.waited = self.waited + waited
  return ticket, waited
end

-- The answer came (or the attempt failed): the entry's time is now, and the tokens the
-- response reported (when given) replace the estimate.
function Limiter:settle(ticket, tokens)
  if not ticket then return end
  ticket.t = self.now()
  if type(tokens) == "number" and tokens >= 0 then ticket.tokens = tokens end
end

-- "6m0s", "1.5s", "20ms", "1h2m3s" or plain seconds -> seconds; nil when unreadable.
function M.duration(s)
  if type(s) ~= "string" then return nil end
  s = s:match("^%s*(.-)%s*$")
  if tonumber(s) then return tonumber(s) end
  local total, any = 0, false
  for num, unit in s:gmatch("([%d%.]+)(%a+)") do
    local v = tonumber(num)
    local scale = ({ h = 3600, m = 60, s = 1, ms = 1e-3 })[unit]
    if not v or not scale then return nil end
    total, any = total + v * scale, true
  end
  return any and total or nil
end

-- Header lines ("Name: value\r\n"...) -> {lower-case name = value}.
function M.headers(text)
  local h = {}
  for name, value in tostring(text or ""):gmatch("([%w%-]+):[ \t]*([^\r\n]*)") do h[name:lower()] = value end
  return h
end

-- A response (clrt.net.http's result: status, headers, retry_after): the provider's counts
-- and a 429's Retry-After.
function Limiter:observe(r)
  local now = self.now()
  local h = M.headers(r.headers)
  local p = self.provider
  local rl, tl = tonumber(h["x-ratelimit-remaining-requests"]), tonumber(h["x-ratelimit-remaining-tokens"])
  if rl then
    p.requests_left = rl
    p.requests_reset = now + (M.duration(h["x-ratelimit-reset-requests"]) or 1)
  end
  if tl then
    p.tokens_left = tl
    p.tokens_reset = now + (M.duration(h["x-ratelimit-reset-tokens"]) or 1)
  end
  if r.status == 429 then
    local after = (r.retry_after and r.retry_after >= 0) and r.retry_after or M.duration(h["retry-after"]) or 1
    self.hold_until = math.max(self.hold_until, now + after)
  end
end

return M
