-- bench/http.lua — clrt.llm chat completions per second and client CPU per request at
-- concurrency 1, 8, 32, 64 against a local zero-latency server, next to peers measured in the
-- same run: Python's http.client (one keep-alive connection per thread) and node's fetch.
--   clrt bench/http.lua [n=2000] [levels=1,8,32,64]
-- Every client does the same work per request: encode the JSON body, POST it, decode the
-- reply, check that the reply echoes its own request. The server is node's http module
-- (bench/fake_openai_fast.mjs) when node is there, else tests/support/fake_openai.py.
-- "cpu us/req" is the client process's CPU time per request: the overhead that stays when
-- the server is fast, and the figure to compare; req/s on a small shared machine is bounded
-- by the server running beside the client.
local bench_args = dofile((debug.getinfo(1, "S").source:sub(2):match("^(.*)/") or ".") .. "/args.lua")
local opts = bench_args.parse({ n = 2000, levels = "1,8,32,64" }, arg)
local levels = bench_args.numbers(opts.levels)

local http = require("clrt.net.http")
-- The checkout this script runs from (its peers and fixtures sit beside it).
local src = os.getenv("CLRT_SOURCE_DIR") or debug.getinfo(1, "S").source:sub(2):match("^(.*)/bench/[^/]*$") or "."
local function have(cmd) return os.execute("command -v " .. cmd .. " >/dev/null 2>&1") == 0 end

local server_cmd
if have("node") then
  server_cmd = "exec node " .. src .. "/bench/fake_openai_fast.mjs 600"
else
  server_cmd = "exec /usr/bin/python3 " .. src .. "/tests/support/fake_openai.py --lifetime 600 --max-requests 10000000"
end
local pipe = assert(io.popen(server_cmd))
local port, pid = (pipe:read("*l") or ""):match("^(%d+) (%d+)$")
assert(port, "the bench server did not start")
local base_url = "http://127.0.0.1:" .. port .. "/v1"

local function cleanup()
  os.execute("kill " .. pid .. " 2>/dev/null")
  pipe:close()
end

local function run_clrt(conc, n)
  local c = clrt.llm.client { base_url = base_url, model = "bench", max_concurrency = conc, timeout = 30 }
  local fns = {}
  for k = 1, conc do
    fns[k] = function()
      local bad = 0
      for i = k - 1, n - 1, conc do
        local content = "bench " .. i
        local r = c:chat({ { role = "user", content = content } })
        if r.content ~= "echo:" .. content then bad = bad + 1 end
      end
      return bad
    end
  end
  local t0, c0 = http.now(), os.clock()
  local results, errors = clrt.sched.run(fns)
  local wall, cpu = http.now() - t0, os.clock() - c0
  local bad = 0
  for k = 1, conc do bad = bad + (results[k] or 0) + (errors[k] and 1 or 0) end
  return wall, cpu, bad
end

local function run_peer(cmd)
  local f = io.popen(cmd .. " 2>&1")
  local out = f:read("*a")
  f:close()
  local wall, cpu, bad = out:match("^([%d%.]+) ([%d%.]+) (%d+)")
  if not wall then return nil, out end
  return tonumber(wall), tonumber(cpu), tonumber(bad)
end

local peers = {}
if io.open("/usr/bin/python3") then
  peers[#peers + 1] = { name = "python", cmd = function(conc, n)
    return ("/usr/bin/python3 %s/bench/http_peer.py 127.0.0.1 %s %d %d"):format(src, port, conc, n) end }
end
if have("node") then
  peers[#peers + 1] = { name = "node", cmd = function(conc, n)
    return ("node %s/bench/http_peer.mjs %s/chat/completions %d %d"):format(src, base_url, conc, n) end }
end

local ok, err = pcall(function()
  run_clrt(8, 200)   -- warm up the server and the JIT
  print(("server: %s; %d requests per level"):format(server_cmd:match("exec (%S+)"), opts.n))
  local head = ("%-5s %-28s"):format("conc", "clrt.llm req/s (cpu us/req)")
  for _, p in ipairs(peers) do head = head .. ("  %-26s"):format(p.name .. " req/s (cpu us/req)") end
  for _, p in ipairs(peers) do head = head .. ("  %-17s"):format("vs " .. p.name .. " rps|cpu") end
  print(head)
  for _, conc in ipairs(levels) do
    local n = opts.n
    local wall, cpu, bad = run_clrt(conc, n)
    assert(bad == 0, bad .. " wrong or failed replies from clrt")
    local line = ("%-5d %9.0f (%6.1f)           "):format(conc, n / wall, cpu / n * 1e6)
    local ratios = ""
    for _, p in ipairs(peers) do
      local pw, pc, pbad = run_peer(p.cmd(conc, n))
      if pw and pbad == 0 then
        line = line .. ("  %9.0f (%6.1f)          "):format(n / pw, pc / n * 1e6)
        ratios = ratios .. ("  %6.2fx | %6.2fx  "):format(pw / wall, pc / cpu)
      else
        line = line .. ("  %-26s"):format("failed")
        ratios = ratios .. ("  %-17s"):format("-")
        io.stderr:write(p.name .. " peer: " .. tostring(pc) .. "\n")
      end
    end
    print(line .. ratios)
  end
  print("ratios: clrt's throughput over the peer's (higher is better) | the peer's CPU per request over clrt's")
end)
cleanup()
if not ok then error(err, 0) end
