-- clrt.proc — child processes without a shell, that a clrt.sched task waits on while the
-- engine decodes and HTTP moves (runtime/core/proc.c).
--
--   local p = clrt.proc.spawn{ argv = {"sleep", "1"}, env = {"PATH=/usr/bin"}, cwd = "/tmp",
--     fds = { [1] = {path = "out.txt", write = true}, [2] = 1, [3] = {path = "report"} } }
--   local r = p:wait{ timeout = 60 }  -- {code =, signal =, timed_out =, seconds =}
--
-- argv[1] is searched on this process's PATH; env is the child's whole environment (a list
-- of "NAME=value"; nothing is inherited); fds maps a child descriptor to a file opened for
-- it ({path =, write = true} creates or truncates, mode 0600) or to a number, the child
-- descriptor it copies (given earlier in 0, 1, 2, ... order). Descriptors 0-2 not given are
-- /dev/null and nothing else of this process reaches the child. The child leads its own
-- process group; p:kill() sends SIGKILL to that whole group and reaps the child.
-- p:wait yields inside a clrt.sched task (the scheduler watches the process's pidfd
-- beside the HTTP sockets); elsewhere it blocks. At the timeout the group is killed and
-- r.timed_out is true. A process dropped by the garbage collector while running is killed.
local ffi = require("ffi")
local core = require("clrt.core.ffi")
local C = core.C

local M = {}
local Proc = {}
Proc.__index = Proc

local SIGKILL = 9

local function reap_on_gc(cp)
  if cp.done == 0 and cp.pid > 0 then
    C.clrt_proc_kill(cp, SIGKILL)
    C.clrt_proc_poll(cp, 1)
  end
end

function M.spawn(o)
  if type(o) ~= "table" or type(o.argv) ~= "table" or type(o.argv[1]) ~= "string" then
    error("clrt.proc.spawn: argv must be a list of strings starting with the program", 2)
  end
  local keep = {}   -- the strings C reads stay alive until spawn returns
  local function cstrings(list, what)
    local arr = ffi.new("const char *[?]", #list + 1)
    for i, s in ipairs(list) do
      if type(s) ~= "string" or s:find("\0", 1, true) then
        error(("clrt.proc.spawn: %s[%d] must be a string without NUL bytes"):format(what, i), 3)
      end
      keep[#keep + 1] = s
      arr[i - 1] = s
    end
    arr[#list] = nil
    return arr
  end
  local argv = cstrings(o.argv, "argv")
  local envp = cstrings(o.env or {}, "env")
  local order = {}
  for fd in pairs(o.fds or {}) do
    if type(fd) ~= "number" or fd < 0 or fd ~= math.floor(fd) then
      error("clrt.proc.spawn: fds keys must be descriptor numbers, got " .. tostring(fd), 2)
    end
    order[#order + 1] = fd
  end
  table.sort(order)
  local red = ffi.new("clrt_proc_redirect[?]", math.max(1, #order))
  for i, fd in ipairs(order) do
    local v, r = o.fds[fd], red[i - 1]
    r.fd = fd
    if type(v) == "number" then
      r.path, r.same_as = nil, v
    elseif type(v) == "table" and type(v.path) == "string" then
      keep[#keep + 1] = v.path
      r.path, r.write, r.same_as = v.path, v.write and 1 or 0, -1
    else
      error(("clrt.proc.spawn: fds[%d] must be {path =, write =} or a descriptor number"):format(fd), 2)
    end
  end
  local cp = ffi.new("clrt_proc")
  if C.clrt_proc_spawn(argv, envp, o.cwd, red, #order, cp) ~= 0 then core.fail(2) end
  local p = setmetatable({ c = ffi.gc(cp, reap_on_gc), pid = cp.pid, started = require("clrt.net.http").now() }, Proc)
  keep = nil
  return p
end

-- The process's pidfd (a number), or nil where the kernel has none.
function Proc:fd()
  local fd = self.c.pidfd
  return fd >= 0 and fd or nil
end

-- True once the process has ended (and been reaped).
function Proc:poll()
  local r = C.clrt_proc_poll(self.c, 0)
  if r < 0 then core.fail(2) end
  return r == 1
end

-- Sends signal sig (a number: 15 for SIGTERM) and returns at once; a process that already
-- ended is left alone.
function Proc:signal(sig)
  if not self:poll() and C.clrt_proc_kill(self.c, sig) ~= 0 then core.fail(2) end
end

function Proc:kill()
  if C.clrt_proc_kill(self.c, SIGKILL) ~= 0 then core.fail(2) end
  if C.clrt_proc_poll(self.c, 1) < 0 then core.fail(2) end
end

function Proc:result(timed_out)
  local c = self.c
  return { code = c.term_signal == 0 and c.exit_code or nil, signal = c.term_signal ~= 0 and c.term_signal or nil,
           timed_out = timed_out or false, seconds = require("clrt.net.http").now() - self.started }
end

-- Wait for the end, at most opts.timeout seconds from now (nil: no limit). opts.on_cancel
-- runs if the scheduler abandons the waiting task (its run timed out or failed); the
-- process is killed first.
function Proc:wait(opts)
  opts = opts or {}
  local http = require("clrt.net.http")
  local sched = require("clrt.sched")
  local deadline = opts.timeout and (http.now() + opts.timeout)
  if sched.current() then
    local how = sched.wait_proc(self, deadline, function()
      pcall(self.kill, self)
      if opts.on_cancel then opts.on_cancel() end
    end)
    if how == "deadline" then
      self:kill()
      return self:result(true)
    end
    if how ~= "exited" then error(how, 2) end
    return self:result(false)
  end
  local fds = ffi.new("int[1]")
  while not self:poll() do
    if C.clrt_interrupted() ~= 0 then
      self:kill()
      error("interrupted", 0)
    end
    local left = deadline and (deadline - http.now()) or 0.1
    if left <= 0 then
      self:kill()
      return self:result(true)
    end
    local fd = self:fd()
    -- without a pidfd the end is noticed on a short period
    local ms = math.max(1, math.ceil(math.min(left, fd and 0.1 or 0.01) * 1000))
    if fd then
      fds[0] = fd
      if C.clrt_proc_wait_fds(fds, 1, ms) < 0 then core.fail(2) end
    else
      C.clrt_proc_wait_fds(nil, 0, ms)
    end
  end
  return self:result(false)
end

function M.cpu_count() return C.clrt_cpu_count() end
function M.euid() return C.clrt_effective_uid() end

return M
