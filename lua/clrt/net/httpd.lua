-- clrt.net.httpd — the HTTP plumbing under `clrt serve`: requests queue up in C (one thread per
-- connection) and this engine-side handle takes them, answers them, or streams to them.
local ffi = require("ffi")
local core = require("clrt.core.ffi")
local C = core.C

local M = {}
local Server = {}
Server.__index = Server

-- start{host = "127.0.0.1", port = 0 (ephemeral), max_body = bytes, header_timeout = s,
--       idle_timeout = s, max_connections = n, max_per_client = n} (nil: the C defaults)
function M.start(opts)
  opts = opts or {}
  local lim = ffi.new("clrt_server_limits", { max_body = opts.max_body or 0, header_timeout_s = opts.header_timeout or 0,
    idle_timeout_s = opts.idle_timeout or 0, max_connections = opts.max_connections or 0, max_per_client = opts.max_per_client or 0 })
  local s = C.clrt_server_start(opts.host or "127.0.0.1", opts.port or 0, lim)
  if s == nil then core.fail(2) end
  local self = setmetatable({ handle = s, info = ffi.new("clrt_server_request_info") }, Server)
  return self
end

function Server:port() return C.clrt_server_port(self.handle) end

-- The next request, or nil when none arrives within timeout_ms (0: do not wait).
function Server:next(timeout_ms)
  if self.handle == nil then error("server: stopped", 2) end
  if C.clrt_server_next(self.handle, timeout_ms or 0, self.info) == 0 then return nil end
  local i = self.info
  return {
    id = tonumber(i.id),
    method = ffi.string(i.method),
    path = ffi.string(i.path),
    authorization = i.authorization ~= nil and ffi.string(i.authorization) or nil,
    body = ffi.string(i.body, i.body_len),
  }
end

function Server:respond(id, status, body, content_type)
  body = body or ""
  core.ok(C.clrt_server_respond(self.handle, id, status, content_type or "application/json", body, #body), 2)
end

function Server:stream_begin(id, status, content_type)
  core.ok(C.clrt_server_stream_begin(self.handle, id, status or 200, content_type or "text/event-stream"), 2)
end

-- Returns false when the client has gone away (the caller should stop working for it).
function Server:write(id, data)
  local rc = C.clrt_server_stream_write(self.handle, id, data, #data)
  if rc < 0 then core.fail(2) end
  return rc == 0
end

function Server:stream_end(id) core.ok(C.clrt_server_stream_end(self.handle, id), 2) end

function Server:is_open(id) return C.clrt_server_is_open(self.handle, id) == 1 end

function Server:stop()
  if self.handle ~= nil then
    C.clrt_server_stop(self.handle)
    self.handle = nil
  end
end

return M
