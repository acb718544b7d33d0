-- Start tests/support/fake_billing_endpoint.py for a test; its request log read back.
--   local srv = dofile(T.source_dir() .. "/tests/support/fake_billing.lua").start(T.tmpdir(), {"--rpm", "3"})
--   srv.base_url, srv:records() (every request: t, status, role, usage, body), srv.stop()
-- The server exits by itself after --lifetime (300 s), so a crashed test leaves nothing behind.
local M = {}

function M.start(dir, args)
  local src = os.getenv("CLRT_SOURCE_DIR") or "."
  local log = dir .. "/requests-" .. tostring(os.time()) .. "-" .. tostring(math.random(1e9)) .. ".jsonl"
  local cmd = { "exec /usr/bin/python3", src .. "/tests/support/fake_billing_endpoint.py", log, "--lifetime", "300" }
  for _, a in ipairs(args or {}) do cmd[#cmd + 1] = a end
  local p = assert(io.popen(table.concat(cmd, " ")))
  local port, pid = (p:read("*l") or ""):match("^(%d+) (%d+)$")
  if not port then p:close(); error("fake_billing_endpoint.py did not start", 2) end
  local srv = { base_url = ("http://127.0.0.1:%s/v1"):format(port), log = log }
  function srv.records()
    local out = {}
    local f = io.open(log, "rb")
    if not f then return out end
    for line in f:lines() do out[#out + 1] = require("clrt.json").decode(line) end
    f:close()
    return out
  end
  function srv.stop()
    if p then os.execute("kill " .. pid .. " 2>/dev/null"); p:close(); p = nil end
  end
  return srv
end

return M
