-- pass_rate — 1 when the code the conversation produced passes the task's tests, else 0.
-- The code: extracted by the judge (JSON final_completion, like bleu_score) or, with
-- options.extract = false / no judge, the last fenced block of the last assistant message.
-- The tests: sample.tests, else sample.single_turn_metadata.test (BigCodeBench's
-- unittest source); a sample without tests is an error (a failed metric, not a 0).
-- The program (code, then tests, then `unittest.main()` when the tests define TestCases
-- and do not call it) runs as `python3 -I solution.py` in a fresh temporary directory with
--   CPU time  ulimit -t   (options.cpu_s, default 10 s; wall clock: timeout 2x + 5 s)
--   memory    ulimit -v   (options.mem_mb, default 1024 MB of address space)
--   files     ulimit -f   (options.file_mb, default 16 MB per file written)
--   network   none: run inside `unshare -n` (a new, empty network namespace) when this
--             machine allows it (root, or user namespaces via `unshare -rn`); where neither
--             works the code runs WITH network and M.sandbox() says so
-- Exit status 0 = pass; any failure, crash, limit hit or timeout = 0.
-- Options come from ctx.metric_options.pass_rate; options.python picks the interpreter.
local judge = require("metrics.lib.judge")

local M = { name = "pass_rate" }

local function sh_quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

local function run(cmd)
  local ok, how, code = os.execute(cmd)
  -- Lua 5.1 / LuaJIT without 5.2 compat return a status number
  if type(ok) == "number" then return ok == 0, ok end
  return ok == true and code == 0, code
end

local netns
-- How network isolation is done here: "unshare -n", "unshare -rn" or "none" (cached).
function M.sandbox()
  if netns == nil then
    if run("unshare -n true >/dev/null 2>&1") then netns = "unshare -n"
    elseif run("unshare -rn true >/dev/null 2>&1") then netns = "unshare -rn"
    else netns = "none" end
  end
  return netns
end

function M.program(code, tests)
  local prog = code .. "\n\n" .. tests .. "\n"
  if tests:find("unittest", 1, true) and not tests:find("unittest.main", 1, true) then
    prog = prog .. "\nimport unittest\nif __name__ == '__main__':\n    unittest.main(verbosity=0)\n"
  end
  return prog
end

-- Run code + tests; returns passed (bool), detail (string).
function M.run_tests(code, tests, opts)
  opts = opts or {}
  local cpu = opts.cpu_s or 10
  local mem_kb = math.floor((opts.mem_mb or 1024) * 1024)
  local file_kb = math.floor((opts.file_mb or 16) * 1024)
  local wall = opts.wall_s or (2 * cpu + 5)
  local python = opts.python or "python3"
  local p = io.popen("mktemp -d /tmp/clrt-pass-rate.XXXXXX")
  local dir = p:read("*l")
  p:close()
  if not dir or dir == "" then error("pass_rate: cannot create a temporary directory", 0) end
  local f = assert(io.open(dir .. "/solution.py", "wb"))
  f:write(M.program(code, tests))
  f:close()
  local iso = M.sandbox()
  local inner = ("cd %s && ulimit -t %d && ulimit -v %d && ulimit -f %d && exec timeout -s KILL %d %s -I solution.py > out.txt 2>&1")
    :format(sh_quote(dir), cpu, mem_kb, file_kb, wall, python)
  local cmd = (iso == "none" and "" or (iso .. " ")) .. "sh -c " .. sh_quote(inner) .. " </dev/null >/dev/null 2>&1"
  local passed = run(cmd)
  local out = io.open(dir .. "/out.txt", "rb")
  local detail = out and out:read("*a") or ""
  if out then out:close() end
  os.execute("rm -rf " .. sh_quote(dir))
  return passed, detail:sub(-2000)
end

function M.tests_of(sample)
  if type(sample.tests) == "string" then return sample.tests end
  local md = sample.single_turn_metadata
  if type(md) == "table" and type(md.test) == "string" then return md.test end
  return nil
end

function M.compute(conversation, sample, ctx)
  local tests = M.tests_of(sample)
  if not tests then error("pass_rate: sample has no tests (sample.tests or single_turn_metadata.test)", 0) end
  local code = judge.final_completion(conversation, sample, ctx, "pass_rate", "code")
  if code:find("^%s*$") then return 0 end
  local passed = M.run_tests(code, tests, judge.options(ctx, "pass_rate"))
  return passed and 1 or 0
end

return M
