-- pass_rate against the red-team corpus of issue 42 (tests/fixtures/redteam/attacks.lua):
-- every attack scores 0 and is counted as tampering; the runtime defenses hold without the
-- syntax screen; and each attack passes once the defenses it meets are turned off (the
-- planted fault: the corpus would catch their loss), the new ones also under the harness
-- of before issue 42. Under Debian's /usr/bin/python3 in bubblewrap; skips (saying why)
-- where this machine cannot make the sandbox.
local T = require("clrt.test")
local sched = require("clrt.sched")
local sandbox = require("clrt.sandbox")
local pass_rate = require("metrics.pass_rate")
package.path = T.source_dir() .. "/tests/fixtures/?.lua;" .. package.path
local corpus = require("redteam.attacks")

local PYTHON = "/usr/bin/python3"
local OLD_HARNESS_COMMIT = "0743e62"   -- main before issue 42

local function sandbox_or_skip()
  if io.open(PYTHON) == nil then T.skip(PYTHON .. " is missing") end
  local ok, why = sandbox.check({})
  if not ok then T.skip("no sandbox here: " .. why) end
  local r = os.execute(PYTHON .. " -c 'import numpy, pandas' >/dev/null 2>&1")
  if not (r == 0 or r == true) then T.skip(PYTHON .. " lacks numpy/pandas (python3-numpy, python3-pandas)") end
end

local function opts(extra)
  local o = { python = PYTHON, timeout = 60, parallel = 2 }
  for k, v in pairs(extra or {}) do o[k] = v end
  return o
end

-- run every (code, tests, options) at once; returns {passed, detail, kind} each
local function run_all(jobs)
  local fns = {}
  for i, j in ipairs(jobs) do
    fns[i] = function()
      local ctx = { counters = {} }
      local p, d, k = pass_rate.run_tests(j[1], j[2], opts(j[3]), ctx)
      return { p, d, k, ctx.counters }
    end
  end
  local results, errors = sched.run(fns)
  T.eq(errors, {})
  return results
end

T.case("the corpus has at least 30 distinct attacks", function()
  local names = {}
  for _, a in ipairs(corpus.ATTACKS) do
    T.eq(names[a[1]], nil, "distinct: " .. a[1])
    names[a[1]] = true
  end
  T.ok(#corpus.ATTACKS >= 30, ("%d attacks"):format(#corpus.ATTACKS))
end)

T.case("every attack scores 0 and is counted as tampering, with and without the syntax screen", function()
  sandbox_or_skip()
  local jobs = {}
  for _, a in ipairs(corpus.ATTACKS) do
    jobs[#jobs + 1] = { a[2], corpus.TESTS[a[3]], {} }
    jobs[#jobs + 1] = { a[2], corpus.TESTS[a[3]], { disable_defenses = "screen" } }
  end
  local r = run_all(jobs)
  for i, a in ipairs(corpus.ATTACKS) do
    local full, noscreen = r[2 * i - 1], r[2 * i]
    T.eq({ full[1], full[3], full[4].pass_rate_tampered }, { false, "tamper", 1 }, a[1] .. ": " .. full[2])
    if i == 1 then   -- the step's row in metrics.jsonl carries the count
      local row = require("clrt.train.report").step_row({}, { rewards = {}, dropped = 0, truncated = 0 }, {}, {}, 0,
        { generate_first_s = 0, rollout_s = 0 }, 0, 1, 2, { counters = full[4] })
      T.eq(row["pass_rate/tampered"], 1, "pass_rate/tampered in the step's row")
    end
    if a.harmless then
      T.eq(noscreen[1], false, a[1] .. " (no screen): " .. noscreen[2])
    elseif not a.screen_only then
      T.eq({ noscreen[1], noscreen[3] }, { false, "tamper" }, a[1] .. " (no screen): " .. noscreen[2])
    end
  end
end)

T.case("planted fault: each attack passes without the defenses it meets", function()
  sandbox_or_skip()
  local jobs = {}
  for _, a in ipairs(corpus.ATTACKS) do
    jobs[#jobs + 1] = { a[2], corpus.TESTS[a[3]], { disable_defenses = "screen" .. (a[4] ~= "" and "," .. a[4] or "") } }
  end
  local r = run_all(jobs)
  for i, a in ipairs(corpus.ATTACKS) do
    T.eq(r[i][1], true, a[1] .. " without " .. a[4] .. ": " .. r[i][2])
  end
end)

T.case("planted fault: the new attacks and the defects pass under the harness of before issue 42", function()
  sandbox_or_skip()
  local old = T.tmpdir() .. "/old_harness.py"
  local ok = os.execute(("git -C %q show %s:lua/metrics/lib/pass_rate_harness.py > %q 2>/dev/null")
    :format(T.source_dir(), OLD_HARNESS_COMMIT, old))
  if not (ok == 0 or ok == true) then T.skip("no git history to read the old harness from") end
  os.execute("chmod 644 " .. old .. "; chmod 755 " .. old:match("^(.*)/"))
  local jobs, which = {}, {}
  for _, a in ipairs(corpus.ATTACKS) do
    if a.old then jobs[#jobs + 1] = { a[2], corpus.TESTS[a[3]], {} }; which[#jobs] = a[1] end
  end
  for _, d in ipairs(corpus.DEFECTS) do jobs[#jobs + 1] = { d[3], d[2], {} }; which[#jobs] = d[1] end
  pass_rate.HARNESS_PATH = old
  local r = run_all(jobs)
  pass_rate.HARNESS_PATH = nil
  for i, name in ipairs(which) do T.eq(r[i][1], true, "the old harness passed " .. name .. ": " .. r[i][2]) end
  -- and the harness of now judges the defects' programs by their tests
  jobs = {}
  for _, d in ipairs(corpus.DEFECTS) do
    jobs[#jobs + 1] = { d[3], d[2], {} }
    jobs[#jobs + 1] = { d[4], d[2], {} }
  end
  r = run_all(jobs)
  for i, d in ipairs(corpus.DEFECTS) do
    T.eq({ r[2 * i - 1][1], r[2 * i - 1][3] }, { false, "wrong" }, d[1] .. " (wrong code): " .. r[2 * i - 1][2])
    T.eq(r[2 * i][1], true, d[1] .. " (right code): " .. r[2 * i][2])
  end
end)

-- A trainer without root: the sandbox's program is then a user namespace's own, and uid 0
-- there regains the namespace's capabilities on exec; a program it starts could read the
-- non-dumpable harness unless it runs as another uid. Run as root, the case runs the trainer
-- again as nobody (setpriv); without root, in this process.
T.case("a root-less trainer: a program the code starts cannot read the harness for the nonce", function()
  sandbox_or_skip()
  local attack
  for _, a in ipairs(corpus.ATTACKS) do
    if a[4] == "dumpable" then attack = a end
  end
  T.ok(attack ~= nil, "the corpus has the dumpable attack")
  local settings = { {}, { disable_defenses = "screen" }, { disable_defenses = "screen,dumpable" } }
  local got
  if not sandbox.is_root() then
    local jobs = {}
    for i, o in ipairs(settings) do jobs[i] = { attack[2], corpus.TESTS[attack[3]], o } end
    got = {}
    for i, r in ipairs(run_all(jobs)) do got[i] = { r[1], r[3] } end
  else
    if io.open("/usr/bin/setpriv") == nil then T.skip("no setpriv to run a root-less trainer") end
    local dir = T.tmpdir()
    local script = dir .. "/rootless.lua"
    local f = assert(io.open(script, "w"))
    f:write(([==[
local pass_rate = require("metrics.pass_rate")
package.path = %q .. "/tests/fixtures/?.lua;" .. package.path
local corpus = require("redteam.attacks")
local a = corpus.ATTACKS[%d]
for _, o in ipairs({ {}, { disable_defenses = "screen" }, { disable_defenses = "screen,dumpable" } }) do
  o.python, o.timeout = %q, 60
  local p, _, k = pass_rate.run_tests(a[2], corpus.TESTS[a[3]], o, { counters = {} })
  print("RESULT", tostring(p), k)
end
]==]):format(T.source_dir(), (function() for i, a in ipairs(corpus.ATTACKS) do if a == attack then return i end end end)(),
      PYTHON))
    f:close()
    os.execute(("chmod 755 %q; chmod 644 %q"):format(dir, script))
    local bin = os.getenv("CLRT_BIN") or arg[-1]
    if bin:sub(1, 1) ~= "/" then bin = os.getenv("PWD") .. "/" .. bin end
    local cmd = ("cd %q && setpriv --reuid=65534 --regid=65534 --clear-groups env HOME=%q CLRT_LUA_DIR=%q %q %q 2>&1")
      :format(dir, dir, os.getenv("CLRT_LUA_DIR") or (T.source_dir() .. "/lua"), bin, script)
    local p = assert(io.popen(cmd))
    local out = p:read("*a")
    p:close()
    if out:find("no sandbox", 1, true) then T.skip("no root-less sandbox here: " .. out:sub(1, 200)) end
    T.ok(out:find("RESULT", 1, true), "the root-less trainer ran: " .. out:sub(1, 300))
    got = {}
    for passed, kind in out:gmatch("RESULT%s+(%a+)%s+(%a+)") do got[#got + 1] = { passed == "true", kind } end
  end
  T.eq(got[1], { false, "tamper" }, "all defenses")
  T.eq(got[2][1], false, "without the screen (the program must find no nonce)")
  T.eq(got[3][1], true, "planted fault: without dumpable the program reads the nonce, so the case can fail")
end)

-- What the frame rules (depth, givers, bdb) and the open rule must let through: libraries
-- reading the solution's frame for honest reasons, tracebacks printed with their lines.
local HONEST_FRAMES = {
  { "libraries that read their caller's frame", [[
import logging, warnings, collections, typing, enum, dataclasses, inspect
import pandas as pd
logging.basicConfig(level=logging.INFO)
P = collections.namedtuple("P", "x y")
class Q(typing.NamedTuple):
    a: int
class C(enum.Enum):
    A = 1
def task_func(a, b):
    logging.info("adding %s %s", a, b)
    warnings.warn("careful")
    R = collections.namedtuple("R", "x")
    T = typing.NamedTuple("T", [("v", int)])
    D = dataclasses.make_dataclass("D", ["q"])
    k = a
    df = pd.DataFrame({"v": [a, b]})
    s = df.query("v == @k")["v"].sum()
    e = pd.eval("k + 0")
    inspect.signature(task_func)
    return int(R(a).x + T(b).v + D(0).q + (s - a) + (e - k))
]] },
  { "tracebacks and stacks printed with their lines", [[
import traceback, logging, sys
def task_func(a, b):
    try:
        raise ValueError("x")
    except ValueError:
        traceback.print_exc()
        logging.exception("seen")
        traceback.extract_tb(sys.exc_info()[2])
    traceback.print_stack()
    traceback.extract_stack()
    return a + b
]] },
}

T.case("honest code whose libraries read frames or print tracebacks passes", function()
  sandbox_or_skip()
  local jobs = {}
  for i, h in ipairs(HONEST_FRAMES) do jobs[i] = { h[2], corpus.TESTS.add, {} } end
  for i, r in ipairs(run_all(jobs)) do T.eq({ r[1], r[3] }, { true, "pass" }, HONEST_FRAMES[i][1] .. ": " .. r[2]) end
end)

T.case("what remains possible still passes (docs/sandbox.md lists each)", function()
  sandbox_or_skip()
  local jobs = {}
  for _, a in ipairs(corpus.REMAINING) do jobs[#jobs + 1] = { a[2], corpus.TESTS[a[3]], {} } end
  local r = run_all(jobs)
  for i, a in ipairs(corpus.REMAINING) do T.eq(r[i][1], true, a[1] .. ": " .. r[i][2]) end
end)

T.run()
