-- The API spend of a run, against a local OpenAI-compatible endpoint that reports `usage`
-- (with cached tokens) and rate-limit headers and records every request's arrival
-- (tests/support/fake_billing_endpoint.py): the client's per-role token and dollar totals
-- equal the endpoint's records exactly; rpm / tpm hold in every window (scaled down from 60 s
-- to 1 s); the provider's x-ratelimit headers slow the client before it is refused; the reply
-- cache answers repeated deterministic requests without a request, keyed by base URL, model
-- and body, a corrupt entry being a miss; the budget rule, the ledger across a resume, and
-- estimate=true. SHA-256 is checked against Python's hashlib.
local T = require("clrt.test")
local json = require("clrt.json")
local llm, sched = clrt.llm, clrt.sched
local prices = require("clrt.api.prices")
local usage = require("clrt.api.usage")
local rate_limit = require("clrt.api.rate_limit")
local reply_cache = require("clrt.api.reply_cache")

if io.open("/usr/bin/python3") == nil then
  print("skip: /usr/bin/python3 is needed for the fake endpoint")
  os.exit(77)
end

local root = T.tmpdir()
local fake = dofile(T.source_dir() .. "/tests/support/fake_billing.lua")
local servers = {}
local function server(args)
  local s = fake.start(root, args)
  servers[#servers + 1] = s
  return s
end
T.cleanup(function() for _, s in ipairs(servers) do s.stop() end end)

local function user(text) return { { role = "user", content = text } } end
local function run_all(fns) return sched.run(fns) end

T.case("sha256 equals Python's hashlib on padding edges and UTF-8", function()
  local sha = require("clrt.util.sha256")
  local inputs = { "", "abc", ("a"):rep(55), ("a"):rep(56), ("a"):rep(64), ("é日本"):rep(40) .. "\n\0x" }
  local path = root .. "/sha_inputs.json"
  require("clrt.files").write_atomic(path, json.encode(inputs))
  local p = io.popen(("/usr/bin/python3 -c 'import json,hashlib,sys; [print(hashlib.sha256(s.encode(\"utf-8\")).hexdigest()) for s in json.load(open(sys.argv[1], encoding=\"utf-8\"))]' %s"):format(path))
  local i = 0
  for line in p:lines() do i = i + 1; T.eq(sha(inputs[i]), line, "input " .. i) end
  p:close()
  T.eq(i, #inputs)
end)

T.case("prices: dollars per million tokens, cached input at its own price, unknown model none", function()
  local p = prices.lookup("gpt-4o-mini")
  T.eq(p, { input = 0.15, cached_input = 0.075, output = 0.60 })
  T.eq(prices.lookup("gpt-4o-mini-2024-07-18"), p, "a dated snapshot is its model")
  T.eq(prices.lookup("my-local-judge"), nil)
  T.near(prices.cost(p, { prompt_tokens = 1000000, cached_tokens = 400000, completion_tokens = 2000000 }),
    0.6 * 0.15 + 0.4 * 0.075 + 2 * 0.60, 1e-12)
  T.eq(prices.lookup("x", { input = 1, output = 2 }), { input = 1, output = 2 })
  T.raises(function() prices.lookup("x", { input = 1 }) end, "needs input and output")
  T.raises(function() prices.lookup("x", { input = 1, output = 2, outptu = 3 }) end, "unknown key 'outptu'")
end)

T.case("per-role usage and dollars equal the endpoint's records exactly", function()
  rate_limit.reset()
  local srv = server({})
  local mini = llm.client { base_url = srv.base_url, model = "gpt-4o-mini", role = "user" }
  local priced = llm.client { base_url = srv.base_url, model = "local-judge", role = "judge", price = { input = 2, cached_input = 1, output = 5 } }
  local unpriced = llm.client { base_url = srv.base_url, model = "mystery" }
  local fns = {}
  for i = 1, 24 do
    local c = ({ mini, priced, unpriced })[i % 3 + 1]
    local role = c == priced and ((i % 2 == 0) and "judge/accuracy" or "extractor") or nil
    -- lengths vary so the sums cannot match by accident
    fns[i] = function() return c:chat(user(("request %d "):format(i) .. ("word "):rep(i * 37)), { role = role }) end
  end
  run_all(fns)
  local recs = llm.drain_records()
  local s = usage.summarize(recs)
  -- the endpoint's own records, summed per role the same way (role from the model and the text)
  local want, dollars = {}, 0
  for _, r in ipairs(srv.records()) do
    T.eq(r.status, 200)
    local n = tonumber(r.body.messages[1].content:match("^request (%d+)"))
    local role = r.model == "gpt-4o-mini" and "user" or r.model == "local-judge" and ((n % 2 == 0) and "judge/accuracy" or "extractor") or "other"
    local w = want[role] or { calls = 0, prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0 }
    want[role] = w
    w.calls = w.calls + 1
    for _, k in ipairs({ "prompt_tokens", "completion_tokens", "cached_tokens" }) do w[k] = w[k] + r.usage[k] end
    local u = r.usage
    if r.model == "gpt-4o-mini" then
      dollars = dollars + ((u.prompt_tokens - u.cached_tokens) * 0.15 + u.cached_tokens * 0.075 + u.completion_tokens * 0.60) / 1e6
    elseif r.model == "local-judge" then
      dollars = dollars + ((u.prompt_tokens - u.cached_tokens) * 2 + u.cached_tokens * 1 + u.completion_tokens * 5) / 1e6
    end
  end
  T.ok(want.user.cached_tokens > 0, "the endpoint reported cached tokens")
  for role, w in pairs(want) do
    for k, v in pairs(w) do T.eq(s.roles[role][k], v, role .. " " .. k) end
  end
  T.near(s.all.usd, dollars, 1e-12, "dollars from the published prices and the endpoint's usage")
  T.eq(s.all.unpriced_calls, want.other.calls, "the unknown model's calls are counted as unpriced")
  -- the ledger: the step's fields, the run's total, the warning once, the file a resume reads
  local warned = {}
  local path = root .. "/api_usage.json"
  local led = usage.ledger { path = path, warn = function(m) warned[#warned + 1] = m end }
  local row = led:row(led:add(recs), {})
  led:add(recs)
  T.eq(#warned, 1, "the unknown model is named once")
  T.ok(warned[1]:find("mystery", 1, true), warned[1])
  T.near(row["api/usd"], dollars, 1e-12)
  T.eq(row["api/user/prompt_tokens"], want.user.prompt_tokens)
  T.eq(row["api/judge/accuracy/completion_tokens"], want["judge/accuracy"].completion_tokens)
  local again = usage.ledger { path = path, resume = true }
  T.near(again.total.all.usd, 2 * dollars, 1e-12, "a resumed run goes on from what was spent")
  T.eq(again.total.all.prompt_tokens, 2 * s.all.prompt_tokens)
  srv.stop()
end)

-- For every request the endpoint saw: requests and tokens arriving within `window` seconds
-- from it on (the endpoint's clock).
local function worst_window(recs, window)
  local most_n, most_t = 0, 0
  for i, a in ipairs(recs) do
    local n, t = 0, 0
    for j = i, #recs do
      local b = recs[j]
      if b.t - a.t < window then
        n = n + 1
        t = t + (b.usage and b.usage.total_tokens or 0)
      end
    end
    most_n, most_t = math.max(most_n, n), math.max(most_t, t)
  end
  return most_n, most_t
end

T.case("rpm: no window holds more requests than the limit, the wait is logged", function()
  rate_limit.reset()
  local srv = server({})
  local c = llm.client { base_url = srv.base_url, model = "gpt-4o-mini", rpm = 4, rate_window = 1, max_concurrency = 16 }
  local fns = {}
  for i = 1, 13 do fns[i] = function() return c:chat(user("hello " .. i)) end end
  run_all(fns)
  local recs = srv.records()
  T.eq(#recs, 13)
  local n = worst_window(recs, 1)
  T.ok(n <= 4, ("%d requests arrived within one window; the limit is 4"):format(n))
  T.eq(n, 4, "the limit is used, not undershot")
  local waited = usage.summarize(llm.drain_records()).all.rate_wait_s
  T.ok(waited > 2, "waiting for the limit is recorded: " .. waited)
  srv.stop()
end)

T.case("tpm: no window holds more tokens than the limit (estimated, then corrected by usage)", function()
  rate_limit.reset()
  local srv = server({})
  local c = llm.client { base_url = srv.base_url, model = "gpt-4o-mini", tpm = 120, rate_window = 1, max_concurrency = 16 }
  local fns = {}
  for i = 1, 12 do fns[i] = function() return c:chat(user("tokens " .. i), { max_tokens = 8 }) end end
  run_all(fns)
  local recs = srv.records()
  T.eq(#recs, 12)
  local _, tokens = worst_window(recs, 1)
  T.ok(tokens <= 120, ("%d tokens within one window; the limit is 120"):format(tokens))
  local one = recs[1].usage.total_tokens
  T.ok(tokens > 120 - 2 * (one + 40), "the limit is used: " .. tokens)
  T.raises(function() c:chat(user("x"), { max_tokens = 500 }) end, "more than tpm=120")
  llm.drain_records()
  srv.stop()
end)

T.case("x-ratelimit-remaining headers hold the client before the provider refuses it", function()
  rate_limit.reset()
  local srv = server({ "--rpm", "3", "--window", "1" })
  -- no rpm of its own: only the provider's headers (remaining 0, reset in N s) slow it down
  local c = llm.client { base_url = srv.base_url, model = "gpt-4o-mini", max_concurrency = 1, backoff = 0.01 }
  local fns = {}
  for i = 1, 8 do fns[i] = function() return c:chat(user("hdr " .. i)) end end
  run_all(fns)
  local refused = 0
  for _, r in ipairs(srv.records()) do if r.status == 429 then refused = refused + 1 end end
  T.eq(refused, 0, "no request was refused by the provider")
  T.ok(usage.summarize(llm.drain_records()).all.rate_wait_s > 0.5, "the client waited on the headers")
  -- a 429's Retry-After holds every request to the endpoint, not just the refused one
  local lim = rate_limit.new({})
  lim:observe({ status = 429, retry_after = 2, headers = "" })
  T.ok(lim:delay(0) > 1.9, "Retry-After holds the limiter")
  T.eq(rate_limit.duration("6m0.5s"), 360.5)
  T.eq(rate_limit.duration("20ms"), 0.02)
  srv.stop()
end)

T.case("the reply cache: repeats cost nothing; the key holds base URL, model and body; corrupt = miss", function()
  rate_limit.reset()
  local srv, other = server({}), server({})
  local dir = root .. "/cache"
  local function client(url, model, extra)
    local o = { base_url = url, model = model, cache = reply_cache.open(dir), defaults = { temperature = 0 } }
    for k, v in pairs(extra or {}) do o[k] = v end
    return llm.client(o)
  end
  local a = client(srv.base_url, "gpt-4o-mini")
  local first = a:chat(user("judge this"))
  T.eq(#srv.records(), 1)
  -- another client (another run) over the same folder: answered from the cache
  local b = client(srv.base_url, "gpt-4o-mini")
  local again = b:chat(user("judge this"))
  T.eq(again.content, first.content)
  T.eq(#srv.records(), 1, "a repeated temperature-0 request is not sent again")
  T.eq(b.records[1].cache, "hit")
  T.eq(b.records[1].cost_usd, 0)
  -- another model at the same endpoint, or another endpoint: not the same request
  client(srv.base_url, "gpt-4o"):chat(user("judge this"))
  T.eq(#srv.records(), 2, "a different model is asked itself")
  client(other.base_url, "gpt-4o-mini"):chat(user("judge this"))
  T.eq(#other.records(), 1, "a different endpoint is asked itself")
  -- any body field (here max_tokens) is part of the key
  a:chat(user("judge this"), { max_tokens = 7 })
  T.eq(#srv.records(), 3)
  -- sampled requests are not cached unless asked
  a:chat(user("sampled"), { temperature = 1 })
  a:chat(user("sampled"), { temperature = 1 })
  T.eq(#srv.records(), 5)
  local all = client(srv.base_url, "gpt-4o-mini", { cache_all = true })
  all:chat(user("sampled"), { temperature = 1 })
  all:chat(user("sampled"), { temperature = 1 })
  T.eq(#srv.records(), 6, "cache_all stores sampled replies too")
  -- a corrupt entry: a miss (asked again, rewritten), never an error
  local cache = reply_cache.open(dir)
  local key = cache:key(srv.base_url, "gpt-4o-mini", { model = "gpt-4o-mini", temperature = 0, messages = user("judge this") })
  T.ok(require("clrt.files").exists(cache:path(key)), "the entry is where its key says")
  require("clrt.files").write_atomic(cache:path(key), '{"key": "cut off')
  T.eq(a:chat(user("judge this")).content, first.content)
  T.eq(#srv.records(), 7, "the corrupt entry was a miss")
  T.eq(b:chat(user("judge this")).content, first.content)
  T.eq(#srv.records(), 7, "and was rewritten")
  -- identical requests in flight at once are sent once
  local fns = {}
  for i = 1, 6 do fns[i] = function() return a:chat(user("all at once")).content end end
  local res = run_all(fns)
  T.eq(#srv.records(), 8, "six identical requests at once, one sent")
  for i = 2, 6 do T.eq(res[i], res[1]) end
  local s = usage.summarize(llm.drain_records())
  T.eq(s.all.cache_hits, 2 + 1 + 5)
  srv.stop(); other.stop()
end)

T.case("a parse retry is asked anew, never answered with the cached unusable reply", function()
  rate_limit.reset()
  local srv = server({})
  local c = llm.client { base_url = srv.base_url, model = "gpt-4o-mini", cache = reply_cache.open(root .. "/cache2"),
    defaults = { temperature = 0 } }
  -- the endpoint echoes: a JSON object without the key the caller needs
  local ok, err = pcall(require("clrt.llm_reply").ask_json, c, user('{"thought": "x"}'), {},
    function(o) return o.score end, { parse_retries = 1, extract_json = llm.extract_json, what = "judge" })
  T.ok(not ok and tostring(err):find("no usable reply after 2 attempts", 1, true), tostring(err))
  T.eq(#srv.records(), 2, "the retry reached the endpoint")
  llm.drain_records()
  srv.stop()
end)

T.case("budget: stop when one more step at the last step's rate would pass max_usd", function()
  local budget = require("clrt.train.budget")
  T.eq(budget.exceeded(nil, 100, 100), nil)
  T.eq(budget.exceeded(1, 0.5, 0.4), nil)
  local why = budget.exceeded(1, 0.7, 0.4)
  T.ok(why and why:find("budget.max_usd=1", 1, true), tostring(why))
  local line = budget.stop_line("collabllm_rl", why, "clrt recipes/collabllm_rl.lua resume=runs/x", 1, 0.4)
  T.ok(line:find("resume=runs/x budget.max_usd=5", 1, true), line)
  T.eq(line:find("\n"), nil, "one line")
end)

T.run()
