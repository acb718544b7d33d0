-- pass_rate's environment check: before the first step, every module the run's code tasks
-- need must be importable by the sandbox's interpreter. A missing one stops the run with
-- one line naming the modules, how many rows need them and the command that installs them;
-- pass_rate.missing_modules=skip runs without those rows instead (left out and counted,
-- never scored 0). docs/sandbox.md has the module -> Debian package table.
local files = require("clrt.files")
local json = require("clrt.json")
local proc = require("clrt.proc")

local M = {}

local function lua_dir() return require("clrt").lua_dir end

-- import name -> Debian package, or false where Debian has none: BigCodeBench's libraries
-- from metrics/lib/bigcodebench_env.tsv (scripts/install_bigcodebench_env.sh reads it too)
local packages
local function package_table()
  if packages then return packages end
  packages = {}
  local text = files.read(lua_dir() .. "/metrics/lib/bigcodebench_env.tsv") or ""
  for line in text:gmatch("[^\n]+") do
    local _, mod, deb = line:match("^([^#\t][^\t]*)\t([^\t]+)\t([^\t]+)$")
    if mod then packages[mod] = deb ~= "-" and deb end
  end
  return packages
end

-- The Debian package of an import name (python3-<name> for one the table lacks), nil
-- where Debian has none.
function M.package_of(mod)
  local p = package_table()[mod]
  if p == nil then return "python3-" .. mod:lower():gsub("_", "-") end
  return p or nil
end


local function run(argv, input_text)
  local dir = files.temp_dir("clrt-pass-rate-env")
  local ok, res = pcall(function()
    local f = assert(io.open(dir .. "/in", "wb"))
    f:write(input_text or "")
    f:close()
    local p = proc.spawn({ argv = argv, env = { "PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/tmp", "LANG=C.UTF-8" },
      fds = { [0] = { path = dir .. "/in" }, [1] = { path = dir .. "/out", write = true },
        [2] = { path = dir .. "/err", write = true } } })
    local r = p:wait({ timeout = 120 })
    return { code = r.code, timed_out = r.timed_out, out = files.read(dir .. "/out") or "",
      err = files.read(dir .. "/err") or "" }
  end)
  pcall(files.remove_tree, dir)
  if not ok then error(res, 0) end
  return res
end

-- The modules each sample needs (a list per sample, in order): its metadata's libs, else
-- the imports of its tests and reference solution; one python call for all of them.
function M.task_modules(samples, python, pass_rate)
  local rows = {}
  for i, s in ipairs(samples) do
    local md = pass_rate.metadata_of(s)
    rows[i] = { libs = md.libs or s.libs, tests = pass_rate.tests_of(s) or "",
      solution = type(s.single_turn_completion) == "string" and s.single_turn_completion or "" }
  end
  if #rows == 0 then return {} end
  local r = run({ python, "-I", lua_dir() .. "/metrics/lib/pass_rate_modules.py" }, json.encode(rows))
  if r.code ~= 0 then
    error(("pass_rate: reading the tasks' imports failed (%s): %s"):format(python, (r.err:gsub("%s+$", ""):match("[^\n]*$"))), 0)
  end
  return json.decode(r.out)
end

local PROBE = "import importlib.util, sys\nfor m in sys.argv[1:]:\n    try:\n        ok = importlib.util.find_spec(m) is not None\n" ..
  "    except Exception:\n        ok = False\n    if not ok:\n        print(m)\n"

-- The modules of mods the sandbox's interpreter cannot find (one sandboxed process).
function M.missing(mods, l, pass_rate)
  if #mods == 0 then return {} end
  local argv = { l.python, "-I", "-c", PROBE }
  for _, m in ipairs(mods) do argv[#argv + 1] = m end
  if not l.unsafe_no_sandbox then
    argv = require("clrt.sandbox").command({ bwrap = l.bwrap, uid = math.floor(l.uid), loopback = false,
      binds = pass_rate.python_binds(l), tmp_mb = 16, limits = { cpu_s = 60, procs = 16, files = 256 },
      chdir = "/tmp", argv = argv })
  end
  local r = run(argv)
  if r.code ~= 0 then
    error(("pass_rate: the sandbox's python (%s) could not check the tasks' modules: %s")
      :format(l.python, (r.err:gsub("%s+$", ""):gsub("\n", "; "))), 0)
  end
  local out = {}
  for m in r.out:gmatch("[^\n]+") do out[#out + 1] = m end
  return out
end

-- Check samples' modules; returns the samples to run (all of them, or with missing_modules
-- = skip those that need a missing module) and the number left out.
function M.check(samples, l, pass_rate)
  local coded, idx = {}, {}
  for i, s in ipairs(samples) do
    if pass_rate.applies(s) then coded[#coded + 1] = s; idx[#idx + 1] = i end
  end
  if #coded == 0 then return samples, 0 end
  local per = M.task_modules(coded, l.python, pass_rate)
  local all, seen = {}, {}
  for _, mods in ipairs(per) do
    for _, m in ipairs(mods) do if not seen[m] then seen[m] = true; all[#all + 1] = m end end
  end
  table.sort(all)
  local miss = {}
  for _, m in ipairs(M.missing(all, l, pass_rate)) do miss[m] = true end
  local rows_needing, names = 0, {}
  local drop = {}
  for k, mods in ipairs(per) do
    for _, m in ipairs(mods) do
      if miss[m] then drop[idx[k]] = true end
    end
  end
  for _ in pairs(drop) do rows_needing = rows_needing + 1 end
  for m in pairs(miss) do names[#names + 1] = m end
  table.sort(names)
  if #names == 0 then return samples, 0 end
  if l.missing_modules ~= "skip" then
    local pkgs, none = {}, {}
    for _, m in ipairs(names) do
      local p = M.package_of(m)
      if p then pkgs[#pkgs + 1] = p else none[#none + 1] = m end
    end
    error(("pass_rate: the sandbox's python (%s) lacks %s, needed by %d of %d code rows: %s%s; " ..
      "or set reward.metric_options.pass_rate.missing_modules=skip to leave those rows out")
      :format(l.python, table.concat(names, ", "), rows_needing, #coded,
        #pkgs > 0 and ("apt-get install " .. table.concat(pkgs, " ")) or "no Debian package",
        #none > 0 and (" (not in Debian: " .. table.concat(none, ", ") .. ")") or ""), 0)
  end
  local kept = {}
  for i, s in ipairs(samples) do if not drop[i] then kept[#kept + 1] = s end end
  return kept, rows_needing, names
end

return M
