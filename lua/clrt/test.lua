-- clrt.test — the helper every Lua test file uses.
--   local T = require("clrt.test")
--   T.case("adds", function() T.eq(1 + 1, 2) end)
--   T.run()   -- prints each case, then "N passed, M failed"; exits non-zero on failure
-- A failed assertion reports expected and actual values and the line that made it.
local M = {}
local cases = {}

-- Every folder made by tmpdir() is removed when the test file ends: by run() (passed or
-- failed), or, when the file dies before run(), when the Lua state closes.
local made = {}
local function remove_made()
  local files = require("clrt.files")
  for i = #made, 1, -1 do pcall(files.remove_tree, made[i]) end
  made = {}
end
local sentinel = newproxy(true)
getmetatable(sentinel).__gc = remove_made
M._sentinel = sentinel


local function show(v)
  local ok, repl = pcall(require, "clrt.cli.repl")
  if ok then return repl.show(v) end
  return tostring(v)
end

local function fail(msg, level)
  error({ clrt_test_failure = msg, where = debug.traceback("", (level or 2) + 1) }, 0)
end

function M.case(name, fn) cases[#cases + 1] = { name = name, fn = fn } end

-- fn runs after the last case, before the process exits (stop servers, remove files).
local cleanups = {}
function M.cleanup(fn) cleanups[#cleanups + 1] = fn end

function M.ok(cond, msg)
  if not cond then fail(msg or "expected a true value", 2) end
end

local function deep_eq(a, b)
  if type(a) ~= type(b) then return false end
  if type(a) ~= "table" then return a == b end
  for k, v in pairs(a) do if not deep_eq(v, b[k]) then return false end end
  for k in pairs(b) do if a[k] == nil then return false end end
  return true
end
M.deep_eq = deep_eq

function M.eq(actual, expected, msg)
  if not deep_eq(actual, expected) then
    fail(("%sexpected %s, got %s"):format(msg and (msg .. ": ") or "", show(expected), show(actual)), 2)
  end
end

-- |actual - expected| <= atol + rtol*|expected|, elementwise over numbers or nested tables.
function M.near(actual, expected, tol, msg)
  tol = tol or {}
  if type(tol) == "number" then tol = { atol = tol, rtol = 0 } end
  local atol, rtol = tol.atol or 1e-6, tol.rtol or 0
  local function walk(a, e, path)
    if type(e) == "table" then
      if type(a) ~= "table" or #a ~= #e then
        fail(("%s%s: expected a table of %d, got %s"):format(msg and (msg .. ": ") or "", path, #e, show(a)), 4)
      end
      for i = 1, #e do walk(a[i], e[i], path .. "[" .. i .. "]") end
      return
    end
    if type(a) ~= "number" then fail(("%s%s: expected a number near %s, got %s"):format(msg and (msg .. ": ") or "", path, show(e), show(a)), 4) end
    local bad = a ~= a or e ~= e or math.abs(a - e) > atol + rtol * math.abs(e)
    if e == math.huge or e == -math.huge then bad = a ~= e end
    if bad then
      fail(("%s%s: expected %.9g, got %.9g (diff %.3g, atol %g, rtol %g)"):format(msg and (msg .. ": ") or "", path, e, a, math.abs(a - e), atol, rtol), 4)
    end
  end
  walk(actual, expected, "value")
end

-- fn must raise an error whose message contains `pattern` (plain text).
function M.raises(fn, pattern, msg)
  local okk, err = pcall(fn)
  if okk then fail((msg and (msg .. ": ") or "") .. "expected an error containing '" .. tostring(pattern) .. "', but none was raised", 2) end
  err = type(err) == "table" and (err.clrt_test_failure or show(err)) or tostring(err)
  if pattern and not err:find(pattern, 1, true) then
    fail(("%sexpected an error containing '%s', got: %s"):format(msg and (msg .. ": ") or "", pattern, err), 2)
  end
  return err
end

-- Run the cases whose name matches the optional filter (first script argument).
function M.run(filter)
  filter = filter or (arg and arg[1])
  local passed, failed, skipped = 0, 0, 0
  for _, c in ipairs(cases) do
    if not filter or c.name:find(filter, 1, true) then
      local t0 = os.clock()
      local okk, err = xpcall(c.fn, function(e)
        if type(e) == "table" and e.clrt_test_failure then return e end
        if type(e) == "table" and e.clrt_test_skip then return e end
        return { error = tostring(e), where = debug.traceback("", 2) }
      end)
      if okk then
        passed = passed + 1
        io.write(("ok    %s (%.2fs)\n"):format(c.name, os.clock() - t0))
      elseif err.clrt_test_skip then
        skipped = skipped + 1
        io.write(("skip  %s: %s\n"):format(c.name, err.clrt_test_skip))
      else
        failed = failed + 1
        io.write(("FAIL  %s\n      %s%s\n"):format(c.name, err.clrt_test_failure or err.error, err.where or ""))
      end
    end
  end
  io.write(("%d passed, %d failed%s\n"):format(passed, failed, skipped > 0 and (", " .. skipped .. " skipped") or ""))
  io.stdout:flush()
  for i = #cleanups, 1, -1 do pcall(cleanups[i]) end
  remove_made()
  os.exit(failed == 0 and 0 or 1)
end

-- Skip the current case with a reason (reported as skipped, never as passed).
function M.skip(reason) error({ clrt_test_skip = reason }, 0) end

-- Paths tests need: the source tree's tests/ directory and a fresh temporary directory.
function M.source_dir()
  local d = os.getenv("CLRT_SOURCE_DIR")
  if d then return d end
  return (require("clrt").lua_dir:gsub("/lua$", ""))
end

function M.tmpdir()
  local p = io.popen("mktemp -d /tmp/clrt-test.XXXXXX")
  local d = p:read("*l")
  p:close()
  if not d or d == "" then error("test: mktemp -d failed", 2) end
  made[#made + 1] = d
  return d
end

-- Read a whole file (nil, err when missing).
function M.read(path)
  local f, err = io.open(path, "rb")
  if not f then return nil, err end
  local s = f:read("*a")
  f:close()
  return s
end

-- An f32 tensor's values as a Lua list (from the GPU too), for comparisons value by value.
function M.floats(t)
  if t:device() == "cuda" then t = t:to("cpu") end
  local n, p = t:numel(), require("ffi").cast("float *", t:contiguous():data_ptr())
  local out = {}
  for i = 0, n - 1 do out[i + 1] = p[i] end
  return out
end

return M
