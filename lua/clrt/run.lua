-- clrt.run — a recipe's run folder from start to end, shared by the recipes:
--   run.new_dir(cfg, who)               -- a new run's folder (never an existing one)
--   run.resume_config(defaults, argv, fixed, who) -- resume=DIR: the run's config + overrides
--   run.guard(who, script, run_dir, fn) -- fn's error or Ctrl-C prints how to continue
--   run.main(who, script, argv, parse_args, main) -- a recipe from the command line (resume= guarded from the start)
--   run.resume_command(script, dir)     -- "clrt recipes/x.lua resume=DIR"
--   run.print_end(script, dir, last, n) -- the run folder, and how to continue after stop_after
local files = require("clrt.files")
local config = require("clrt.config")
local M = {}

local quote = require("clrt.util.shell").quote

function M.resume_command(script, run_dir)
  return ("clrt %s resume=%s"):format(script, quote(run_dir))
end

-- run_dir= as given, which must not exist yet (or be an empty folder): a new run never
-- writes into an old run's folder. A folder that holds only what an interrupted atomic write
-- leaves (NAME.tmp.PID: a run killed while it wrote its first config.json) counts as empty,
-- so the same command starts that run again. Without run_dir=: out/name-YYYYmmdd-HHMMSS,
-- with -2, -3, ... appended when that name is taken.
function M.new_dir(cfg, who)
  -- every rank writes into rank 0's choice (its clock names the folder)
  local dist = require("clrt.dist")
  if not dist.is_main() then return dist.broadcast_string("") end
  return dist.broadcast_string(M._new_dir(cfg, who))
end

-- Whether a folder holds nothing but leftovers of interrupted atomic writes; if so they go.
function M._only_leftovers(dir)
  local names = files.list(dir)
  for _, n in ipairs(names) do
    if not n:match("%.tmp%.%d+$") or files.is_dir(dir .. "/" .. n) then return false end
  end
  for _, n in ipairs(names) do os.remove(dir .. "/" .. n) end
  return true
end

function M._new_dir(cfg, who)
  local dir = cfg.run_dir
  if dir then
    if files.exists(dir) and (not files.is_dir(dir) or not M._only_leftovers(dir)) then
      error(("%s: run folder %s already exists; continue it with resume=%s, or choose another run_dir="):format(who, dir, dir), 0)
    end
    return dir
  end
  local base = ("%s/%s-%s"):format(cfg.out, cfg.name, os.date("%Y%m%d-%H%M%S"))
  dir = base
  local i = 2
  while files.exists(dir) do dir = base .. "-" .. i; i = i + 1 end
  return dir
end

-- The config of resume=DIR: DIR/config.json with the command line's other keys over it
-- (config.resume: `fixed` keys may not change). stop_after applies to one invocation only.
function M.resume_config(defaults, argv, fixed, who)
  local dir = config.arg_value(argv, "resume")
  local path = dir .. "/config.json"
  if not files.exists(path) then
    error(("%s: resume=%s: not a run folder (no config.json there)"):format(who, dir), 0)
  end
  local ok, saved = pcall(config.load, path)
  if not ok or type(saved) ~= "table" then
    error(("%s: resume=%s: cannot read %s: %s"):format(who, dir, path, tostring(saved)), 0)
  end
  saved.stop_after, saved.resume, saved.run_dir = nil, nil, nil
  local cfg, changes = config.resume(defaults, saved, argv, fixed, who)
  cfg.run_dir = dir
  for _, c in ipairs(changes) do
    if not c:match("^resume:") and not c:match("^run_dir:") then io.stderr:write(who, ": resume: ", c, "\n") end
  end
  return cfg
end

-- The last lines of a run on stdout: its folder and, when stop_after ended it before its
-- last step, the command that continues it.
function M.print_end(script, run_dir, last_step, total_steps)
  print("run folder: " .. run_dir)
  if last_step < total_steps then
    print(("stopped after step %d of %d (stop_after); continue with:\n  %s"):format(last_step, total_steps,
      M.resume_command(script, run_dir)))
  end
end

-- Run fn(); when it fails after the run folder exists (Ctrl-C included), say so and print
-- the command that continues the run, then raise the error again. CLRT_TRACEBACK=1 keeps
-- the traceback of the original error.
local guarding = 0   -- nested guards (a resumed run's): the outermost one reports

local announced = false   -- a guard has said how to continue (interrupted_early stays quiet)

-- A run that fails before its first step is logged (a bad model folder, an endpoint check, a
-- missing data file) leaves no folder behind: the same command can run again as it was.
local function started(run_dir)
  if files.exists(run_dir .. "/latest") then return true end
  local rows = files.read(run_dir .. "/metrics.jsonl")
  return rows ~= nil and rows:find("%S") ~= nil
end

function M.guard(who, script, run_dir, fn)
  if guarding > 0 then return fn() end
  local fresh = not files.exists(run_dir)
  guarding = guarding + 1
  local res = { xpcall(fn, function(e)
    if os.getenv("CLRT_TRACEBACK") == "1" and type(e) == "string" then return debug.traceback(e, 2) end
    return e
  end) }
  guarding = guarding - 1
  if res[1] then return unpack(res, 2, table.maxn(res)) end
  local err = res[2]
  local interrupted = require("clrt.core.interrupt").pressed() or tostring(err) == "interrupted"
  if fresh and files.is_dir(run_dir) and not started(run_dir) and require("clrt.dist").is_main() then
    files.remove_tree(run_dir)
    announced = true
  elseif files.exists(run_dir .. "/config.json") and require("clrt.dist").is_main() then
    io.stderr:write(("\n%s: %s; continue this run with:\n  %s\n"):format(who,
      interrupted and "interrupted" or "stopped", M.resume_command(script, run_dir)))
    announced = true
  end
  error(interrupted and "interrupted" or err, 0)
end

-- A Ctrl-C that ended a script before any guard ran (while a recipe's modules were still
-- loading): with resume=DIR its folder is as it was, so say how to continue it, as the guard
-- would have. clrt's script runner calls this when a script ends interrupted.
function M.interrupted_early()
  local script = arg and arg[0]
  if announced or type(script) ~= "string" then return end
  local dir
  for i = 1, #arg do dir = tostring(arg[i]):match("^resume=(.+)$") or dir end
  if not dir or not files.exists(dir .. "/config.json") or not require("clrt.dist").is_main() then return end
  local name = script:match("([^/]+)%.lua$") or script
  local shown = script:match("recipes/[^/]+%.lua$") or script
  io.stderr:write(("\n%s: interrupted; continue this run with:\n  %s\n"):format(name, M.resume_command(shown, dir)))
  announced = true
end

-- A recipe run from the command line: with resume=DIR the guard covers reading the saved
-- config too, so a Ctrl-C at any moment of a resumed run prints the command that continues it.
function M.main(who, script, argv, parse_args, main)
  if require("clrt.recipe_help").handle(who, "recipes." .. who, argv, parse_args) then return end
  local dir = config.arg_value(argv, "resume")
  if not dir or not files.exists(dir .. "/config.json") then return main(parse_args(argv)) end
  return M.guard(who, script, dir, function() return main(parse_args(argv)) end)
end

return M
