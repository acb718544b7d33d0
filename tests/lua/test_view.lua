-- clrt view: its routes never read outside the run folders' known files and bound what they
-- read; the command says one line and exits 1 on a missing or wrong folder or a busy port; and
-- its page, loaded in headless Chromium (the system's `chromium` driven by playwright-core from
-- tests/js) over a real tiny RL run, shows the curves, the before/after evaluation, two runs
-- side by side and a conversation tree with scores and reasons (tests/js/view_page.mjs).
-- CLRT_VIEW_SCREENSHOT=PATH keeps the page's screenshot there (docs/img/clrt_view.png is one).
local T = require("clrt.test")
local config = require("clrt.config")
local data = require("clrt.data")
local json = require("clrt.json")
local files = require("clrt.files")
local routes = require("clrt.view.routes")

local root = T.tmpdir()
local bin = os.getenv("CLRT_BIN") or arg[-1]
local lua_dir = os.getenv("CLRT_LUA_DIR")
local env = lua_dir and ("CLRT_LUA_DIR=%q "):format(lua_dir) or ""

-- output and exit status (LuaJIT's popen:close does not give the status: the shell prints it)
local function sh(cmd)
  local p = io.popen("{ " .. cmd .. "; } 2>&1; echo \"#rc=$?\"")
  local out = p:read("*a")
  p:close()
  local body, rc = out:match("^(.-)#rc=(%d+)%s*$")
  return body, tonumber(rc)
end

T.case("routes serve the run's known files only, bounded", function()
  local dir = root .. "/fake"
  files.mkdir_p(dir)
  data.write_jsonl(dir .. "/metrics.jsonl", { { step = 1, reward = 0.5 }, { step = 2, reward = 0.7, ["val/accuracy"] = 0.4 } })
  local f = io.open(dir .. "/metrics.jsonl", "ab"); f:write('{"step":3,"rew'); f:close()   -- a line being written
  files.write_atomic(dir .. "/summary.json", '{"before":{"accuracy":0.1},"after":{"accuracy":0.3}}')
  files.write_atomic(root .. "/secret.json", '{"secret":1}')
  local runs = { assert(routes.open_run(dir)) }
  local st, body, ct = routes.route(runs, "GET", "/api/run/1/metrics")
  T.eq(st, 200); T.eq(ct, "application/json")
  local rows = json.decode(body)
  T.eq(#rows, 2, "the cut-off last line is skipped"); T.eq(rows[2]["val/accuracy"], 0.4)
  T.eq(json.decode(select(2, routes.route(runs, "GET", "/api/run/1/summary"))).after.accuracy, 0.3)
  T.eq(select(2, routes.route(runs, "GET", "/api/run/1/api_usage")), "null", "an absent file is null")
  T.eq(json.decode(select(2, routes.route(runs, "GET", "/api/run/1/steps"))).steps, {})
  local page_st, page, page_ct = routes.route(runs, "GET", "/")
  T.eq(page_st, 200); T.ok(page:find("<svg", 1, true) == nil and page:find("clrt view", 1, true)); T.eq(page_ct, "text/html; charset=utf-8")
  for _, p in ipairs({ "/api/run/1/../secret.json", "/../secret.json", "/api/run/1/summary/../../secret.json",
      "/api/run/1/%2e%2e/secret.json", "/api/run/1/secret", "/api/run/1/files/secret.json", "/api/run/0/metrics",
      "/api/run/2/metrics", "/api/run/1/rollouts/x", "/page.html", "/api/run/1/metrics/1" }) do
    local s, b = routes.route(runs, "GET", p)
    T.eq(s, 404, p)
    T.ok(not b:find("secret\":1", 1, true), p .. " leaks nothing")
  end
  T.eq((routes.route(runs, "POST", "/api/runs")), 405)
  local cap = routes.MAX_FILE
  routes.MAX_FILE = 10
  local s, b = routes.route(runs, "GET", "/api/run/1/summary")
  routes.MAX_FILE = cap
  T.eq(s, 413); T.ok(b:find("summary.json is", 1, true), b)
  -- a folder that is not a run, or not there: one line naming it
  local _, why = routes.open_run(root)
  T.ok(why:find("is not a run folder", 1, true), why)
  _, why = routes.open_run(root .. "/nope")
  T.eq(why, "clrt view: " .. root .. "/nope does not exist")
end)

T.case("the command: one line and exit 1 on a wrong folder or a busy port", function()
  local out, rc = sh(("%s%s view %s/nope"):format(env, bin, root))
  T.eq(rc, 1); T.eq(out, ("clrt view: %s/nope does not exist\n"):format(root))
  out, rc = sh(("%s%s view %s/secret.json"):format(env, bin, root))
  T.eq(rc, 1); T.ok(out:find("is not a folder", 1, true) and not out:find("traceback"), out)
  out, rc = sh(("%s%s view"):format(env, bin))
  T.eq(rc, 1); T.ok(out:find("which run folder", 1, true), out)
  -- a busy port: a first view holds it
  local log = root .. "/v1.log"
  os.execute(("%s%s view %s/fake --port 0 > %s 2>&1 & echo $! > %s/v1.pid"):format(env, bin, root, log, root))
  local port
  for _ = 1, 200 do
    port = (T.read(log) or ""):match("http://127%.0%.0%.1:(%d+)/")
    if port then break end
    os.execute("sleep 0.05")
  end
  local pid = (T.read(root .. "/v1.pid") or ""):match("%d+")
  T.cleanup(function() if pid then os.execute("kill " .. pid .. " 2>/dev/null") end end)
  T.ok(port, "the first view started: " .. (T.read(log) or ""))
  out, rc = sh(("%s%s view %s/fake --port %s"):format(env, bin, root, port))
  T.eq(rc, 1)
  T.ok(out:find("^clrt view: cannot listen on 127%.0%.0%.1:" .. port) and select(2, out:gsub("\n", "")) == 1, out)
  out = sh(("curl -s http://127.0.0.1:%s/api/runs"):format(port))
  if out:find("^%[") then T.eq(json.decode(out)[1].name, "fake") end   -- (curl may be absent)
end)

-- A real tiny run: the world's SFT start, then RL with the before/after evaluation.
local function tiny_run(dir, seed, start)
  local rl = require("recipes.collabllm_rl")
  rl.main(config.parse(rl.defaults, { "config=" .. rl.world_config_path(), "model=" .. start, "run_dir=" .. dir,
    "steps=4", "prompts_per_step=3", "rollout.n=3", "rollout.num_repeat_rollouts=2", "rollout.max_new_tokens=24",
    "seed=" .. seed, "eval.before=true", "eval.after=true", "eval.prompts=8", "save_every=0" }))
end

local function which(name)
  local out = sh("command -v " .. name)
  return out:match("^(/%S+)")
end

T.case("the page in headless Chromium: curves, evaluation, two runs, the rollout tree", function()
  local chromium = os.getenv("CLRT_CHROMIUM") or which("chromium") or which("chromium-browser")
  if not chromium then T.skip("no chromium on PATH (apt-get install chromium; scripts/test.sh does)") end
  if not which("node") then T.skip("no node on PATH (scripts/test.sh installs it)") end
  local js = T.source_dir() .. "/tests/js"
  if not files.exists(js .. "/node_modules/playwright-core/package.json") then
    T.skip("tests/js/node_modules/playwright-core is missing (run `npm ci` in tests/js; scripts/test.sh does)")
  end
  local sft = require("recipes.collabllm_sft")
  local start = sft.main(config.parse(sft.defaults, {
    "run_dir=" .. root .. "/sft", "train.steps=40", "train.batch_size=8", "world.conversations=200",
    "arch.hidden_size=32", "arch.intermediate_size=64", "arch.num_hidden_layers=2", "train.val_every=20",
  }, sft.world_config()))
  local a, b = root .. "/run_a", root .. "/run_b"
  tiny_run(a, 3, start)
  tiny_run(b, 4, start)
  -- the built-in world has no data_val, so no val/* rows: run_b gets one validation row in
  -- metrics.jsonl's shape (as a data_val run logs it) so the page's val/* curves are checked
  files.append(b .. "/metrics.jsonl", json.encode({ step = 4, ["val/exact_match"] = 0.25, ["val/token_amount"] = 6 }) .. "\n")
  files.append(b .. "/metrics.jsonl", json.encode({ step = 0, ["val/exact_match"] = 0.125, ["val/token_amount"] = 7 }) .. "\n")
  local log = root .. "/view.log"
  -- run_b first: its val/* curves are then the first section's
  os.execute(("%s%s view %s %s --port 0 > %s 2>&1 & echo $! > %s/view.pid"):format(env, bin, b, a, log, root))
  local port
  for _ = 1, 200 do
    port = (T.read(log) or ""):match("http://127%.0%.0%.1:(%d+)/")
    if port then break end
    os.execute("sleep 0.05")
  end
  local pid = (T.read(root .. "/view.pid") or ""):match("%d+")
  T.cleanup(function() if pid then os.execute("kill " .. pid .. " 2>/dev/null") end end)
  T.ok(port, "clrt view started: " .. (T.read(log) or ""))
  local shot = os.getenv("CLRT_VIEW_SCREENSHOT") or (root .. "/clrt_view.png")
  local out, rc = sh(("cd %q && CLRT_VIEW_URL=http://127.0.0.1:%s/ CLRT_CHROMIUM=%q CLRT_VIEW_RUNS=2 CLRT_VIEW_SCREENSHOT=%q " ..
    "timeout 120 node view_page.mjs"):format(js, port, chromium, shot))
  io.write(out)
  T.eq(rc, 0, "the page's checks (output above)")
  T.ok(files.exists(shot), "a screenshot")
end)

T.run()
