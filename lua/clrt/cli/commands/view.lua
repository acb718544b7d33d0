-- clrt view RUN_DIR [RUN_DIR2] [--host 127.0.0.1] [--port 8765]
-- Shows a run folder, or two side by side, as a local web page.
-- The page: the metric curves, the before/after evaluation, the API bill and each sampled
-- step's rollouts (prompt -> responses -> futures, with scores and reasons). Read-only; see
-- lua/clrt/view/routes.lua for what it serves.
local args = { ... }
local usage = [[
usage: clrt view RUN_DIR [RUN_DIR2] [options]
  --host ADDR   address to bind (default 127.0.0.1: this machine only)
  --port N      port (default 8765; 0 picks a free one)]]

local routes = require("clrt.view.routes")

-- One line on stderr and a non-zero exit: a wrong folder or a busy port is not a traceback.
local function fail(msg)
  io.stderr:write(msg, "\n")
  os.exit(1)
end

local host, port, dirs = "127.0.0.1", 8765, {}
local i = 1
while i <= #args do
  local a = args[i]
  if a == "--help" or a == "-h" then print(usage) return
  elseif a == "--host" or a == "--port" then
    local v = args[i + 1]
    if v == nil then fail(("clrt view: %s needs a value"):format(a)) end
    if a == "--host" then host = v
    else
      port = tonumber(v)
      if not port or port < 0 or port > 65535 or port ~= math.floor(port) then
        fail(("clrt view: --port expects a port number 0-65535, got '%s'"):format(v))
      end
    end
    i = i + 1
  elseif a:sub(1, 2) == "--" then fail(("clrt view: unknown option %s (clrt view --help)"):format(a))
  else dirs[#dirs + 1] = a end
  i = i + 1
end
if #dirs == 0 then fail("clrt view: which run folder? (clrt view RUN_DIR [RUN_DIR2])") end
if #dirs > 2 then fail(("clrt view: at most two run folders, got %d"):format(#dirs)) end

local runs = {}
for k, d in ipairs(dirs) do
  local run, why = routes.open_run(d)
  if not run then fail(why) end
  runs[k] = run
end

local ok, srv = pcall(require("clrt.net.httpd").start, { host = host, port = port, max_body = 4096 })
if not ok then
  -- httpd's own line names the address; a Lua position before it is not the user's business
  fail("clrt view: " .. (tostring(srv):gsub("^[^\n]-%.lua:%d+: ", ""):gsub("^serve: ", "")))
end
local names = {}
for k, r in ipairs(runs) do names[k] = r.dir end
io.stdout:write(("clrt view: %s on http://%s:%d/ (Ctrl-C stops)\n"):format(table.concat(names, " and "), host, srv:port()))
io.stdout:flush()

-- One request at a time: each is a few file reads; Ctrl-C ends the loop between requests.
local interrupted = require("clrt.core.interrupt").pressed
while not interrupted() do
  local r = srv:next(200)
  if r then
    local status, body, ctype = routes.route(runs, r.method, r.path)
    srv:respond(r.id, status, body, ctype)
  end
end
srv:stop()
