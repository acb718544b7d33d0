-- Start tests/support/fake_openai.py for a test and stop it afterwards.
--   local srv = dofile(T.source_dir() .. "/tests/support/fake_openai.lua").start{"--latency-ms", "100"}
--   ... srv.base_url ...   srv:stop()
-- The server binds 127.0.0.1 on an ephemeral port and exits by itself after --lifetime
-- seconds (600 unless given), so a crashed test leaves nothing running for long.
local M = {}

local function shell_quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

function M.start(args, env)
  local src = os.getenv("CLRT_SOURCE_DIR") or "."
  local cmd = {}
  for k, v in pairs(env or {}) do cmd[#cmd + 1] = k .. "=" .. shell_quote(v) end
  cmd[#cmd + 1] = "exec /usr/bin/python3 " .. shell_quote(src .. "/tests/support/fake_openai.py")
  local has_lifetime = false
  for _, a in ipairs(args or {}) do
    if a == "--lifetime" then has_lifetime = true end
    cmd[#cmd + 1] = shell_quote(a)
  end
  if not has_lifetime then cmd[#cmd + 1] = "--lifetime 600" end
  local p = assert(io.popen(table.concat(cmd, " ")))
  local line = p:read("*l")
  local port, pid = (line or ""):match("^(%d+) (%d+)$")
  if not port then
    p:close()
    error("fake_openai.py did not start (first line: " .. tostring(line) .. ")", 2)
  end
  local srv = { port = tonumber(port), pid = tonumber(pid), pipe = p }
  srv.base_url = ("http://127.0.0.1:%d/v1"):format(srv.port)
  function srv.stop()
    if srv.pipe then
      os.execute("kill " .. srv.pid .. " 2>/dev/null")
      srv.pipe:close()
      srv.pipe = nil
    end
  end
  return srv
end

return M
