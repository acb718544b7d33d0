-- clrt.net.openai_reply — what `clrt serve` writes back while a request's rows decode. One
-- producer turns the engine's per-row callbacks into what is left to write (each row's text and
-- logprobs as they come, held back while they could still end in a stop string, then its end,
-- then the request's end); one of two writers puts that on the wire: server-sent events
-- (job.stream) or one JSON body. The endpoint's shape (M.CHAT, M.COMPLETION) says what a chunk
-- and a choice look like.
--   local cb = reply.producer(srv, job, reply.writer(srv, request_id, job))
-- job: {ids, o (clrt.gen.options.check), shape, tok, model, id, created, stream, include_usage,
--       logprobs, tools_on, tool_result(row) -> calls, content}
local json = require("clrt.json")

local M = {}

-- Is s well-formed UTF-8 (RFC 3629: no overlong forms, surrogates or code points past
-- U+10FFFF), so it can go into a JSON string as it is and the tokenizer takes it?
local function is_utf8(s)
  if not s:find("[\128-\255]") then return true end
  local i, n = 1, #s
  while i <= n do
    local c = s:byte(i)
    local len, lo, hi = 1, 0x80, 0xBF   -- lo, hi: the range of the second byte
    if c < 0x80 then len = 1
    elseif c >= 0xC2 and c <= 0xDF then len = 2
    elseif c >= 0xE0 and c <= 0xEF then len = 3; lo = c == 0xE0 and 0xA0 or 0x80; hi = c == 0xED and 0x9F or 0xBF
    elseif c >= 0xF0 and c <= 0xF4 then len = 4; lo = c == 0xF0 and 0x90 or 0x80; hi = c == 0xF4 and 0x8F or 0xBF
    else return false end
    if i + len - 1 > n then return false end
    for j = i + 1, i + len - 1 do
      local b = s:byte(j)
      if b < (j == i + 1 and lo or 0x80) or b > (j == i + 1 and hi or 0xBF) then return false end
    end
    i = i + len
  end
  return true
end
M.is_utf8 = is_utf8

-- OpenAI's logprob entry of one token: its text (a token that splits a UTF-8 character is
-- written "bytes:\xNN..." as OpenAI does), log-probability and bytes.
local function token_entry(tok, id, lp)
  local raw = tok.token_bytes and tok:token_bytes(id) or tok:decode({ id })
  local bytes = json.array()
  for i = 1, #raw do bytes[i] = raw:byte(i) end
  local text = is_utf8(raw) and raw or "bytes:" .. raw:gsub(".", function(c) return ("\\x%02x"):format(c:byte()) end)
  return { token = text, logprob = lp, bytes = bytes }
end

-- The logprobs.content entries of a row's tokens first..last (end-of-turn ids left out).
local function logprob_entries(tok, row, first, last)
  local out = json.array()
  for i = first, last do
    local id, info = row.tokens[i], row.model_logprobs[i]
    if not row.o.stop_ids[id] then
      local e = token_entry(tok, id, info.lp)
      e.top_logprobs = json.array()
      for j, t in ipairs(info.top) do e.top_logprobs[j] = token_entry(tok, t.id, t.lp) end
      out[#out + 1] = e
    end
  end
  return out
end

local function sse(obj) return "data: " .. json.encode(obj) .. "\n\n" end

-- How many bytes at the end of `text` could still grow into one of the stop strings: the
-- longest proper prefix of a stop string that `text` ends with. A stream holds them back.
function M.stop_holdback(text, stops)
  local hold = 0
  for _, s in ipairs(stops) do
    for k = math.min(#s - 1, #text), hold + 1, -1 do
      if text:sub(-k) == s:sub(1, k) then hold = k break end
    end
  end
  return hold
end

local CHAT = { object = "chat.completion", chunk_object = "chat.completion.chunk", id_prefix = "chatcmpl" }
local COMPLETION = { object = "text_completion", chunk_object = "text_completion", id_prefix = "cmpl" }
M.CHAT, M.COMPLETION = CHAT, COMPLETION

-- A chat stream opens every sample with its role; a completion stream has no opening.
function CHAT.opening(job)
  local out = {}
  for i = 1, job.o.n do
    out[i] = { index = i - 1, delta = { role = "assistant", content = "" }, logprobs = json.null, finish_reason = json.null }
  end
  return out
end
function COMPLETION.opening() return {} end

function CHAT.delta(row, text, logprobs)
  return { index = row.sample - 1, delta = { content = text }, logprobs = logprobs or json.null, finish_reason = json.null }
end
function COMPLETION.delta(row, text)
  return { index = row.sample - 1, text = text, logprobs = json.null, finish_reason = json.null }
end

-- A row's last chunks: the rest of its text (nil: none) or its tool calls, and its finish reason.
function CHAT.closing(row, text, logprobs, calls)
  local out = {}
  if calls then
    for j, c in ipairs(calls) do c.index = j - 1 end
    out[1] = { index = row.sample - 1, delta = { tool_calls = calls }, logprobs = json.null, finish_reason = json.null }
  elseif text then
    out[1] = CHAT.delta(row, text, logprobs)
  end
  out[#out + 1] = { index = row.sample - 1, delta = json.object(), logprobs = json.null,
    finish_reason = calls and "tool_calls" or row.finish_reason }
  return out
end
function COMPLETION.closing(row, text)
  return { { index = row.sample - 1, text = text or "", logprobs = json.null, finish_reason = row.finish_reason } }
end

-- A finished row as a choice of the whole response.
function CHAT.choice(job, row, i)
  local logprobs = json.null
  if job.logprobs then logprobs = { content = logprob_entries(job.tok, row, 1, #row.tokens), refusal = json.null } end
  local calls, content = job.tool_result(row)
  return { index = i - 1, message = { role = "assistant", content = content or json.null, refusal = json.null,
    tool_calls = calls }, logprobs = logprobs, finish_reason = calls and "tool_calls" or row.finish_reason }
end
function COMPLETION.choice(_, row, i)
  return { index = i - 1, text = row.text, logprobs = json.null, finish_reason = row.finish_reason }
end

local function usage(job, rows)
  local c = 0
  for _, row in ipairs(rows) do c = c + #row.tokens end
  -- OpenAI's prompt caching field: the prompt tokens served from the prefix cache
  local cached = rows[1] and rows[1].cached_tokens or 0
  return { prompt_tokens = #job.ids, completion_tokens = c, total_tokens = #job.ids + c,
           prompt_tokens_details = { cached_tokens = cached } }
end

local function envelope(job, object, choices, use)
  return { id = job.id, object = object, created = job.created, model = job.model, choices = choices, usage = use }
end

-- The stream writer: a chunk per event, [DONE] at the end.
local Stream = { streams = true }
Stream.__index = Stream
function Stream:is_open() return self.open end
function Stream:send(obj)
  if self.open and not self.http:write(self.id, sse(obj)) then self.open = false end
end
function Stream:chunk(choice) self:send(envelope(self.job, self.job.shape.chunk_object, json.array({ choice }))) end
function Stream:start()
  self.http:stream_begin(self.id, 200, "text/event-stream")
  self.started = true
  for _, c in ipairs(self.job.shape.opening(self.job)) do self:chunk(c) end
end
function Stream:delta(row, text, logprobs) self:chunk(self.job.shape.delta(row, text, logprobs)) end
function Stream:done(row, text, logprobs, calls)
  for _, c in ipairs(self.job.shape.closing(row, text, logprobs, calls)) do self:chunk(c) end
end
function Stream:close(rows)
  if self.open and self.job.include_usage then
    self:send(envelope(self.job, self.job.shape.chunk_object, json.array(), usage(self.job, rows)))
  end
  if self.open then self.http:write(self.id, "data: [DONE]\n\n") end
  self.http:stream_end(self.id)
end
function Stream:fail(status, body)
  if not self.started then return self.srv:respond(self.id, status, body) end
  self.http:stream_end(self.id)   -- the status went out with the first chunk
end

-- The whole-body writer: one response once every row has finished.
local Whole = { streams = false }
Whole.__index = Whole
function Whole:is_open() return self.http:is_open(self.id) end
function Whole:start() end
function Whole:delta() end
function Whole:done() end
function Whole:close(rows)
  local choices = json.array()
  for i, row in ipairs(rows) do choices[i] = self.job.shape.choice(self.job, row, i) end
  if self:is_open() then
    -- answered here without the server's access line: the producer logs it with its tokens
    self.http:respond(self.id, 200, json.encode(envelope(self.job, self.job.shape.object, choices, usage(self.job, rows))),
      "application/json")
  end
end
function Whole:fail(status, body) self.srv:respond(self.id, status, body) end

-- The writer of request `id` (the server's: srv.http, srv:respond) for job.stream.
function M.writer(srv, id, job)
  return setmetatable({ srv = srv, http = srv.http, id = id, job = job, open = true }, job.stream and Stream or Whole)
end

-- The producer: what a row has that the writer has not written yet, up to byte `limit` of its
-- text (at the end, `final`, with whatever logprobs remain); nil when nothing.
local Producer = {}
Producer.__index = Producer
function Producer:unsent(row, limit, final)
  local from = #(self.sent[row] or "")
  local lp_from = (self.lp_sent[row] or 0) + 1
  local logprobs = nil
  if self.job.logprobs and #row.tokens >= lp_from then
    logprobs = { content = logprob_entries(self.job.tok, row, lp_from, #row.tokens), refusal = json.null }
  end
  if not (limit > from or (final and logprobs and #logprobs.content > 0)) then return nil end
  self.sent[row], self.lp_sent[row] = row.text:sub(1, limit), #row.tokens
  return row.text:sub(from + 1, limit), logprobs
end

function Producer:on_token(row)
  local job, w = self.job, self.writer
  -- a stop string matched: the rest goes out at the end; with tools on, all of it does (a
  -- tool call is known only once its block is complete)
  if w.streams and not row.text_cut and not job.tools_on then
    local text, logprobs = self:unsent(row, #row.text - M.stop_holdback(row.text, job.o.stop_strings))
    if text then w:delta(row, text, logprobs) end
  end
  if not w:is_open() then
    row.cancelled = true
    if not self.gone then
      self.gone = true
      self.log(("request %d: client went away"):format(w.id))
    end
  end
end

function Producer:on_done(row)
  self.left = self.left - 1
  if row.finish_reason ~= "cancelled" then
    local calls = self.job.tool_result(row)
    local text, logprobs
    if not calls and self.writer.streams then
      -- the final text extends what was sent (held-back text never passes a stop match)
      local sent = self.sent[row] or ""
      if row.text:sub(1, #sent) == sent then
        text, logprobs = self:unsent(row, #row.text, true)
      else
        self.log(("request %d: the final text does not extend the streamed text"):format(self.writer.id))
      end
    end
    self.writer:done(row, text, logprobs, calls)
  end
  if self.left == 0 then
    local tokens = 0
    for _, r in ipairs(self.rows or {}) do tokens = tokens + #(r.tokens or {}) end
    self.writer:close(self.rows)
    if self.srv.access then self.srv:access(self.writer.id, self.gone and 499 or 200, tokens) end
  end
end

-- The scheduler's callbacks for one request (clrt.gen.scheduler.submit): srv.log takes a line,
-- srv:failure(err) gives the status and body of a request the engine failed.
function M.producer(srv, job, w)
  local p = setmetatable({ job = job, writer = w, log = srv.log, srv = srv, sent = {}, lp_sent = {}, left = job.o.n }, Producer)
  return {
    on_start = function(rows) p.rows = rows; w:start() end,
    on_token = function(row) p:on_token(row) end,
    on_done = function(row) p:on_done(row) end,
    on_fail = function(err)
      srv.log(("request %d failed: %s"):format(w.id, tostring(err)))
      local status, body = srv:failure(err)
      w:fail(status, body)
      if srv.access then srv:access(w.id, status, 0) end
    end,
  }
end

return M
