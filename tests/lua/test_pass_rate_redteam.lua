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

T.case("what remains possible still passes (docs/sandbox.md lists each)", function()
  sandbox_or_skip()
  local jobs = {}
  for _, a in ipairs(corpus.REMAINING) do jobs[#jobs + 1] = { a[2], corpus.TESTS[a[3]], {} } end
  local r = run_all(jobs)
  for i, a in ipairs(corpus.REMAINING) do T.eq(r[i][1], true, a[1] .. ": " .. r[i][2]) end
end)

T.run()
