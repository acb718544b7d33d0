-- clrt.net.http — the process's one HTTP event loop (runtime/net/http.c, libcurl multi) seen from Lua.
--   id = http.submit({method=, url=, headers={...}, body=, timeout=, ca_file=}, on_done)
--   http.pump(timeout_ms)     -- drive transfers; calls on_done(result) for each finished one
-- A result is {id, status, ok_transport, error, error_code, timed_out, retry_after, elapsed,
-- body, headers}; status is 0 when no response arrived. Submitting and waiting (a yield inside
-- a clrt.sched task, else a blocking pump) is clrt.net.request, which clients (clrt.llm) use.
local core = require("clrt.core.ffi")
local ffi = require("ffi")
local C = core.C

local M = {}
local loop                 -- clrt_http*, created on first use
local callbacks = {}       -- id -> on_done
local pending = 0
local result = ffi.new("clrt_http_result")

local function get_loop()
  if not loop then loop = ffi.gc(core.check(C.clrt_http_new(0), 3), C.clrt_http_free) end
  return loop
end

function M.now() return C.clrt_http_now() end
function M.pending() return pending end

-- headers: a list of "Name: value" strings or a map {Name = value}.
local function header_text(h)
  if not h then return nil end
  local lines = {}
  for k, v in pairs(h) do
    local line = type(k) == "number" and v or (k .. ": " .. v)
    if line:find("[\r\n]") then error("http: a header line contains a line break", 3) end
    lines[#lines + 1] = line
  end
  return table.concat(lines, "\n")
end

function M.submit(req, on_done)
  local l = get_loop()
  local body = req.body
  local id = C.clrt_http_submit(l, req.method or "GET", req.url, header_text(req.headers),
                                body, body and #body or 0, req.timeout or 60, req.ca_file)
  if id < 0 then core.fail(2) end
  id = tonumber(id)
  callbacks[id] = on_done or false
  pending = pending + 1
  return id
end

function M.cancel(id)
  if callbacks[id] == nil then return false end
  callbacks[id] = nil
  pending = pending - 1
  C.clrt_http_cancel(get_loop(), id)
  return true
end

-- Drive the loop, waiting up to timeout_ms (0: never wait) when nothing has finished; with
-- nothing in flight this sleeps timeout_ms. fds (optional): a list of descriptors (child
-- processes' pidfds) whose readability also ends the wait. Returns how many results were
-- delivered.
local fd_buf, fd_cap = nil, 0
function M.pump(timeout_ms, fds)
  timeout_ms = math.max(0, math.floor(timeout_ms or 0))
  if pending == 0 and timeout_ms == 0 then return 0 end
  local l = get_loop()
  local nfd = fds and #fds or 0
  if nfd > fd_cap then fd_buf, fd_cap = ffi.new("int[?]", nfd), nfd end
  for i = 1, nfd do fd_buf[i - 1] = fds[i] end
  if C.clrt_http_poll_fds(l, timeout_ms, fd_buf, nfd) < 0 then core.fail(2) end
  local n = 0
  while C.clrt_http_next(l, result) == 1 do
    local r = {
      id = tonumber(result.id), status = result.status, error_code = result.error_code,
      timed_out = result.timed_out ~= 0, retry_after = result.retry_after,
      elapsed = result.elapsed, error = ffi.string(result.error),
      body = ffi.string(result.body, result.body_len),
      headers = ffi.string(result.headers, result.headers_len),
    }
    local cb = callbacks[r.id]
    if cb ~= nil then
      callbacks[r.id] = nil
      pending = pending - 1
      n = n + 1
      if cb then cb(r) end
    end
  end
  return n
end

-- Sleep without a scheduler, still driving transfers other code has in flight.
function M.sleep(seconds)
  local t_end = M.now() + seconds
  while true do
    local left = t_end - M.now()
    if left <= 0 then return end
    M.pump(math.max(1, math.ceil(left * 1000)))
  end
end

return M
