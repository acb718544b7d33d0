-- clrt.llm_reply — the one place where a model's JSON reply that cannot be used is asked
-- again (DESIGN.md "Retries in two places"). Judges (lua/metrics/lib/judge.lua) and the LLM
-- user (lua/interactions/collabllm_user.lua) both go through ask_json; transport failures
-- (connection, timeout, 429/5xx, Retry-After) are the HTTP client's business (clrt.llm) and
-- are never retried here: a client that raises ends the call at once.
--
--   local value, obj, attempts = llm_reply.ask_json(client, messages, request_opts, validate, {
--     parse_retries = 1,            -- extra requests after an unusable reply (default 1)
--     extract_json = clrt.llm.extract_json,
--     what = "accuracy",            -- names the caller in errors
--     counters = ctx.counters, counter = "judge"})
--
-- validate(obj) -> value, or nil and why: the reply is unusable (a missing key, a value out
-- of range). A reply that is not a table of JSON counts the same way.
--
-- Counters (when opts.counters is a table and opts.counter a prefix such as "judge"):
--   <prefix>_calls      ask_json calls (one per score / per user turn)
--   <prefix>_attempts   requests sent by them (calls + parse retries; the HTTP client's own
--                       transport retries are in clrt.llm.stats().retries, not here)
--   <prefix>_failures   calls that raised (out of parse retries, or the client raised)
-- so attempts per score = <prefix>_attempts / <prefix>_calls.
local M = {}

local function count(opts, suffix)
  local c = opts.counters
  if type(c) == "table" and opts.counter then
    local k = opts.counter .. "_" .. suffix
    c[k] = (c[k] or 0) + 1
  end
end

-- A JSON scalar as the text a model meant: the lenient parser reads "5" as the number 5,
-- which is written back as "5" (not "5.0"); 0.1 as "0.1"; booleans as "true" / "false".
-- Strings pass through; anything else (a table, nil, JSON null) is nil.
function M.text(v)
  local t = type(v)
  if t == "string" then return v end
  if t == "boolean" then return v and "true" or "false" end
  if t ~= "number" then return nil end
  if v ~= v or v == math.huge or v == -math.huge then return tostring(v) end
  if v == math.floor(v) and math.abs(v) < 2 ^ 53 then return ("%d"):format(v) end
  for digits = 14, 17 do       -- the shortest form that reads back as the same number
    local s = ("%." .. digits .. "g"):format(v)
    if tonumber(s) == v then return s end
  end
  return ("%.17g"):format(v)
end

function M.ask_json(client, messages, request_opts, validate, opts)
  opts = opts or {}
  local what = opts.what or "llm"
  local parse = opts.extract_json
  if type(parse) ~= "function" then error(what .. ": no JSON parser (extract_json)", 0) end
  local retries = opts.parse_retries
  if retries == nil then retries = 1 end
  if type(retries) ~= "number" or retries < 0 or retries ~= math.floor(retries) then
    error(("%s: parse_retries must be a whole number >= 0, got %s"):format(what, tostring(retries)), 0)
  end
  count(opts, "calls")
  local last
  for attempt = 1, retries + 1 do
    count(opts, "attempts")
    local o = request_opts
    if attempt > 1 and type(request_opts) == "table" then
      -- the same request again: a reply cache (clrt.llm) must not hand back the unusable one
      o = {}
      for k, v in pairs(request_opts) do o[k] = v end
      o.cache = "refresh"
    end
    local ok, reply = pcall(client.chat, client, messages, o)
    if not ok then
      count(opts, "failures")
      error(("%s: the request failed: %s"):format(what, tostring(reply)), 0)
    end
    if type(reply) ~= "table" or type(reply.content) ~= "string" then
      last = "the reply has no text content"
    else
      local pok, obj = pcall(parse, reply.content)
      if not pok or type(obj) ~= "table" then
        last = "the reply is not a JSON object: " .. reply.content:sub(1, 120)
      else
        local value, why = validate(obj)
        if value ~= nil then return value, obj, attempt end
        last = (why or "the reply has an invalid value") .. ": " .. reply.content:sub(1, 120)
      end
    end
  end
  count(opts, "failures")
  error(("%s: no usable reply after %d attempts (%s)"):format(what, retries + 1, last), 0)
end

return M
