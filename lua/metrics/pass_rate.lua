-- pass_rate — 1 when the code the conversation produced passes the task's tests, else 0.
-- The code: extracted by the judge (JSON final_completion, like bleu_score), told the
-- task's entry point and extraction requirement (single_turn_metadata.entry_point /
-- .extraction_requirement, as the published bigcodebench rows have them); or, with
-- options.extract = false / no judge, the last fenced block of the last assistant message.
-- The tests: sample.tests, else sample.single_turn_metadata.test (BigCodeBench's
-- unittest source); a sample without tests is an error (a failed metric, not a 0).
-- The program (code, then tests, then `unittest.main()` when the tests define TestCases
-- and do not call it) runs as `python -I solution.py` in a fresh temporary directory.
-- Options (ctx.metric_options.pass_rate, so `reward.metric_options.pass_rate.timeout=60`
-- on the command line):
--   timeout   wall-clock seconds (default 20); the program is killed after it
--   cpu_s     CPU seconds, ulimit -t (default: timeout)
--   mem_mb    writable memory, ulimit -d (default 4096 MB): heap, anonymous maps and thread
--             stacks — what a program allocates, not the address space it reserves
--   as_mb     address space, ulimit -v (default 32768 MB, BigCodeBench's evaluation uses
--             30 GB); reservations are not memory: numpy on 16 BLAS threads reserves 2.6 GB
--             for 79 MB resident (measured), and under a 1 GB cap it spins until killed
--   file_mb   size of any file written, ulimit -f (default 16 MB)
--   threads   OMP/OpenBLAS/MKL threads (default 1, as BigCodeBench's evaluation sets
--             OMP_NUM_THREADS); each extra BLAS thread takes ~150 MB of mem_mb (measured:
--             `import numpy, pandas` + a 600x600 matmul needs 313 MB at 1 thread, 2.5 GB
--             at 16, under Debian's /usr/bin/python3 with python3-numpy/-pandas)
--   python    the interpreter (default "python3" on PATH)
--   extract   false: no judge call, the last fenced block is the code
--   network   none: the program runs inside `unshare -n` (a new, empty network namespace)
--             when this machine allows it (root, or user namespaces via `unshare -rn`);
--             where neither works it runs WITH network and M.sandbox() says so
-- The environment also gets TZ=UTC (BigCodeBench's tests assume it) and MPLBACKEND=Agg.
-- Exit status 0 = pass; any failure, crash, limit hit or timeout = 0.
local judge = require("metrics.lib.judge")

local M = { name = "pass_rate" }

local sh_quote = require("clrt.util.shell").quote

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

M.DEFAULTS = { timeout = 20, mem_mb = 4096, as_mb = 32768, file_mb = 16, threads = 1, python = "python3" }

-- The limits for one run: options over the defaults, each checked.
function M.limits(opts)
  opts = opts or {}
  local l = {}
  for k, v in pairs(M.DEFAULTS) do l[k] = opts[k] == nil and v or opts[k] end
  l.cpu_s = opts.cpu_s == nil and l.timeout or opts.cpu_s
  for _, k in ipairs({ "timeout", "cpu_s", "mem_mb", "as_mb", "file_mb", "threads" }) do
    if type(l[k]) ~= "number" or l[k] <= 0 then
      error(("pass_rate: option %s must be a positive number, got %s"):format(k, tostring(l[k])), 0)
    end
  end
  if type(l.python) ~= "string" or l.python == "" then error("pass_rate: option python must be a command", 0) end
  return l
end

-- Run code + tests; returns passed (bool), detail (string).
function M.run_tests(code, tests, opts)
  local l = M.limits(opts)
  local p = io.popen("mktemp -d /tmp/clrt-pass-rate.XXXXXX")
  local dir = p:read("*l")
  p:close()
  if not dir or dir == "" then error("pass_rate: cannot create a temporary directory", 0) end
  local f = assert(io.open(dir .. "/solution.py", "wb"))
  f:write(M.program(code, tests))
  f:close()
  local iso = M.sandbox()
  local threads = math.floor(l.threads)
  local env = ("TZ=UTC MPLBACKEND=Agg OMP_NUM_THREADS=%d OPENBLAS_NUM_THREADS=%d MKL_NUM_THREADS=%d")
    :format(threads, threads, threads)
  local inner = ("cd %s && ulimit -t %d && ulimit -d %d && ulimit -v %d && ulimit -f %d && exec env %s timeout -s KILL %s %s -I solution.py > out.txt 2>&1")
    :format(sh_quote(dir), math.ceil(l.cpu_s), math.floor(l.mem_mb * 1024), math.floor(l.as_mb * 1024),
      math.floor(l.file_mb * 1024), env, tostring(l.timeout), sh_quote(l.python))
  local cmd = (iso == "none" and "" or (iso .. " ")) .. "sh -c " .. sh_quote(inner) .. " </dev/null >/dev/null 2>&1"
  local passed = run(cmd)
  local out = io.open(dir .. "/out.txt", "rb")
  local detail = out and out:read("*a") or ""
  if out then out:close() end
  pcall(require("clrt.files").remove_tree, dir)
  return passed, detail:sub(-2000)
end

-- single_turn_metadata as a table (some exports keep it as a JSON string).
function M.metadata_of(sample)
  local md = sample.single_turn_metadata
  if type(md) == "string" then
    local ok, t = pcall(require("clrt.json").decode, md)
    if ok and type(t) == "table" then return t end
  end
  return type(md) == "table" and md or {}
end

-- What the extractor is told besides its prompt: the entry point the tests call and the
-- dataset's extraction requirement; nil when the metadata has neither.
function M.extraction_instructions(sample)
  local md = M.metadata_of(sample)
  local parts = {}
  if type(md.entry_point) == "string" and md.entry_point ~= "" then
    parts[#parts + 1] = ("The tests call `%s`: keep its definition with that exact name and signature, "
      .. "together with every import and helper it uses, as one self-contained program."):format(md.entry_point)
  end
  if type(md.extraction_requirement) == "string" and md.extraction_requirement ~= "" then
    parts[#parts + 1] = md.extraction_requirement
  end
  if #parts == 0 then return nil end
  return table.concat(parts, "\n")
end

function M.tests_of(sample)
  if type(sample.tests) == "string" then return sample.tests end
  local md = M.metadata_of(sample)
  if type(md.test) == "string" then return md.test end
  return nil
end

-- A row without tests (math, documents in a mixed data file) has no pass rate: the metric
-- is left out for it rather than failed (clrt.rl.score_conversation).
function M.applies(sample) return M.tests_of(sample) ~= nil end

function M.compute(conversation, sample, ctx)
  local tests = M.tests_of(sample)
  if not tests then error("pass_rate: sample has no tests (sample.tests or single_turn_metadata.test)", 0) end
  local opts = judge.options(ctx, "pass_rate")
  M.limits(opts) -- a bad option is an error before any judge call
  local code = judge.final_completion(conversation, sample, ctx, "pass_rate", "code",
    { instructions = M.extraction_instructions(sample) })
  if code:find("^%s*$") then return 0 end
  local passed = M.run_tests(code, tests, opts)
  return passed and 1 or 0
end

return M
