-- clrt.sandbox — run an untrusted program (code a policy wrote) in bubblewrap, as a child
-- process a clrt.sched task waits on (clrt.proc). docs/sandbox.md has the design.
--
--   local argv = sandbox.command{ argv = {"/usr/bin/python3", "/task/x.py"}, binds = {{src, "/opt/x"}},
--     data = {{4, "/task/x.py"}},    -- the file open as the child's descriptor 4, read-only there
--     limits = {cpu_s = 60, as_mb = 30720, data_mb = 30720, stack_mb = 10, file_mb = 16, procs = 64,
--               files = 256}, tmp_mb = 512, bwrap = "bwrap", uid = 2000000000, loopback = false }
--   local ok, why = sandbox.check{ bwrap =, uid =, loopback = }   -- nil, one line when it cannot work
--
-- What the program gets: the system folders (/usr, /etc and the /bin, /lib... links or
-- folders) read-only and nothing else of the host but `binds` and `data` (read-only); a
-- private writable /tmp and /dev/shm (tmpfs of tmp_mb each, gone with the sandbox); a
-- fresh /proc and a minimal /dev; new user, PID, network, IPC, UTS and cgroup namespaces,
-- no further user namespaces; the environment the caller gives spawn() and nothing else;
-- the limits, set by prlimit inside the sandbox as hard limits. Run as root, the program
-- runs as the unprivileged `uid` (setpriv), because the kernel exempts uid 0 from the
-- process limit. The network namespace is made before bwrap (unshare; without root inside
-- a user namespace of its own), so its loopback stays down; o.loopback = true gives bwrap's
-- own namespace instead, whose loopback is up but reaches only the sandbox. The process limit counts per
-- user namespace, so every sandbox, even on the same uid, has its own. Killing the process
-- group (clrt.proc) kills bwrap, and with it (--die-with-parent) the sandbox's PID 1, whose
-- end the kernel turns into the end of every process inside.
local files = require("clrt.files")

local M = {}

M.DEFAULT_UID = 2000000000   -- above systemd's container ranges, below 2^31: no one's files
M.SYSTEM_DIRS = { "/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32" }

local function read_link(path)
  local ffi = require("ffi")
  local C = require("clrt.core.ffi").C
  local p = C.clrt_read_link(path)
  if p == nil then return nil end
  local s = ffi.string(p)
  C.clrt_free_string(p)
  return s
end

-- The program's path: name itself when it holds a '/', else the first match on PATH; nil
-- when there is no such file.
function M.find_program(name)
  if name:find("/", 1, true) then return files.exists(name) and name or nil end
  for dir in (os.getenv("PATH") or "/usr/bin:/bin"):gmatch("[^:]+") do
    local p = dir .. "/" .. name
    if files.exists(p) and not files.is_dir(p) then return p end
  end
  return nil
end

-- Whether this process runs as root (the program then drops to o.uid).
function M.is_root() return require("clrt.proc").euid() == 0 end

local function limit_args(l)
  local mb = 1024 * 1024
  local out = { "prlimit", "--core=0" }
  local function add(flag, v) if v then out[#out + 1] = ("--%s=%d"):format(flag, math.floor(v)) end end
  add("cpu", l.cpu_s and math.ceil(l.cpu_s))
  add("as", l.as_mb and l.as_mb * mb)
  add("data", l.data_mb and l.data_mb * mb)
  add("stack", l.stack_mb and l.stack_mb * mb)
  add("fsize", l.file_mb and l.file_mb * mb)
  add("nproc", l.procs)
  add("nofile", l.files)
  out[#out + 1] = "--"
  return out
end

-- The argv that runs o.argv in the sandbox.
function M.command(o)
  local argv = {}
  local function add(...) for _, a in ipairs({ ... }) do argv[#argv + 1] = tostring(a) end end
  local root = M.is_root()
  local own_netns = not o.loopback
  if own_netns then
    -- bwrap brings up the loopback of the network namespace it makes; one made here keeps
    -- it down, and the sandbox, in a user namespace below the one owning it, cannot change
    -- that. Without root, a user namespace of our own is needed to make it.
    if root then add("unshare", "--net", "--") else add("unshare", "--user", "--map-root-user", "--net", "--") end
  end
  if root then
    add("setpriv", "--reuid=" .. (o.uid or M.DEFAULT_UID), "--regid=" .. (o.uid or M.DEFAULT_UID), "--clear-groups", "--")
  end
  add(o.bwrap or "bwrap", "--unshare-all")
  if own_netns then add("--share-net") end
  add("--unshare-user", "--disable-userns", "--die-with-parent", "--new-session", "--hostname", "sandbox")
  -- without root the program would be uid 0 of its user namespace, and what it starts (an
  -- exec as uid 0 regains the namespace's capabilities, CAP_SYS_PTRACE among them) could
  -- read a non-dumpable process's memory: it runs as the unprivileged uid there too
  if not root then add("--uid", o.uid or M.DEFAULT_UID, "--gid", o.uid or M.DEFAULT_UID) end
  for _, d in ipairs(M.SYSTEM_DIRS) do
    local target = read_link(d)
    if target then add("--symlink", target, d)
    elseif files.is_dir(d) then add("--ro-bind", d, d) end
  end
  -- the private mounts first: a bind below /tmp goes on top of the tmpfs, not under it
  local tmp = math.floor((o.tmp_mb or 512) * 1024 * 1024)
  add("--proc", "/proc", "--dev", "/dev", "--size", tmp, "--tmpfs", "/tmp", "--size", tmp, "--tmpfs", "/dev/shm")
  for _, b in ipairs(o.binds or {}) do add("--ro-bind", b[1], b[2] or b[1]) end
  -- files handed over as descriptors the caller opens for bwrap: no host path of the run
  -- needs to be readable by the sandbox's uid
  for _, d in ipairs(o.data or {}) do add("--ro-bind-data", d[1], d[2]) end
  -- what bwrap made of / and /dev (tmpfs) becomes read-only: only /tmp and /dev/shm take writes
  add("--remount-ro", "/dev", "--remount-ro", "/", "--chdir", o.chdir or "/tmp", "--")
  for _, a in ipairs(limit_args(o.limits or {})) do add(a) end
  for _, a in ipairs(o.argv) do add(a) end
  return argv
end

local checked, probing = {}, {}
local probe

-- Whether a sandbox can be made here (bwrap present, namespaces allowed, setpriv as root):
-- true, or nil and one line naming what is missing and how to allow it. Cached per bwrap
-- and uid; the probe runs `true` in the real sandbox.
function M.check(o)
  o = o or {}
  local key = tostring(o.bwrap or "bwrap") .. "|" .. tostring(o.uid or M.DEFAULT_UID) .. "|" .. tostring(o.loopback == true)
  -- tasks asking while the probe runs wait for its answer rather than start their own
  while probing[key] do require("clrt.sched").sleep(0.01) end
  if checked[key] then return checked[key][1], checked[key][2] end
  probing[key] = true
  local ok, a, b = pcall(probe, o, key)
  probing[key] = nil
  if not ok then error(a, 0) end
  return a, b
end

probe = function(o, key)
  local bwrap = o.bwrap or "bwrap"
  if not M.find_program(bwrap) then
    checked[key] = { nil, ("bubblewrap (%s) is not installed (apt-get install bubblewrap)"):format(bwrap) }
    return checked[key][1], checked[key][2]
  end
  local proc = require("clrt.proc")
  local err_path = os.tmpname()
  local argv = M.command({ bwrap = o.bwrap, uid = o.uid, loopback = o.loopback, tmp_mb = 1, argv = { "true" } })
  local ok, p = pcall(proc.spawn, { argv = argv, env = { "PATH=/usr/bin:/bin" }, fds = { [2] = { path = err_path, write = true } } })
  local res
  if not ok then
    if argv[1] ~= (o.bwrap or "bwrap") then
      res = { nil, ("%s (util-linux) cannot be started: %s (apt-get install util-linux)")
        :format(argv[1], (tostring(p):gsub("^proc: ", ""))) }
    else
      res = { nil, ("bubblewrap (%s) cannot be started: %s (apt-get install bubblewrap)")
        :format(bwrap, (tostring(p):gsub("^proc: ", ""))) }
    end
  else
    local r = p:wait({ timeout = 30, on_cancel = function() probing[key] = nil os.remove(err_path) end })
    local err = (files.read(err_path) or ""):gsub("%s+$", ""):gsub("\n", "; ")
    if r.code == 0 then
      res = { true }
    else
      res = { nil, ("bubblewrap cannot create its namespaces here (%s): allow unprivileged user namespaces " ..
        "(sysctl user.max_user_namespaces > 0, kernel.unprivileged_userns_clone=1, on Ubuntu " ..
        "kernel.apparmor_restrict_unprivileged_userns=0; in a container run it with " ..
        "--security-opt seccomp=unconfined --security-opt apparmor=unconfined)")
        :format(err ~= "" and err or (r.timed_out and "timed out" or ("exit " .. tostring(r.code or r.signal)))) }
    end
  end
  os.remove(err_path)
  checked[key] = res
  return res[1], res[2]
end

return M
