-- clrt.log (run folder, config, metrics.jsonl, progress/ETA, samples, resume) and clrt.plot.
local T = require("clrt.test")
local json = require("clrt.json")
local log = require("clrt.log")
local plot = require("clrt.plot")
local reward = require("clrt.train.reward")

-- A stream that keeps what is written.
local function sink()
  local s = { parts = {} }
  function s:write(...) for i = 1, select("#", ...) do self.parts[#self.parts + 1] = tostring((select(i, ...))) end return self end
  function s:flush() end
  function s:text() return table.concat(self.parts) end
  return s
end

T.case("run folder, config, metrics, progress line", function()
  local root = T.tmpdir()
  local out = sink()
  local cfg = { lr = 0.001, reward = { mode = "verl" } }
  local lg = log.run{ root = root, name = "rl", config = cfg, total_steps = 4, plot = { "reward", "kl" }, out = out, tty = false }
  T.ok(lg.dir:find(root .. "/rl-", 1, true))
  local lg2 = log.run{ root = root, name = "rl", out = sink(), quiet = true }
  T.ok(lg2.dir ~= lg.dir, "a second run in the same second gets its own folder")
  T.eq(json.decode(T.read(lg.dir .. "/config.json")).reward.mode, "verl")
  lg:log(1, { reward = 0.5, kl = 0.001, loss = 0 / 0 })
  lg:log(2, { reward = 0.75, kl = 0.002 })
  local rows = log.read_metrics(lg.dir)
  T.eq(#rows, 2); T.eq(rows[1].step, 1); T.eq(rows[2].reward, 0.75)
  T.ok(rows[1].loss == json.null); T.eq(rows[1].nonfinite, "loss")
  T.ok(rows[2].time >= rows[1].time)
  local text = out:text()
  T.ok(text:find("step 2/4  50%", 1, true), text); T.ok(text:find("reward 0.75", 1, true)); T.ok(text:find("ETA", 1, true))
  lg:close()
  T.ok(T.read(lg.dir .. "/plot.svg"):find("<svg", 1, true))
end)

T.case("progress line on a terminal rewrites one line", function()
  local out = sink()
  local lg = log.run{ dir = T.tmpdir() .. "/r", total_steps = 10, out = out, tty = true, progress_keys = { "reward" } }
  lg:log(1, { reward = 1 })
  lg:log(2, { reward = 2 })
  lg:close()
  local text = out:text()
  T.ok(text:find("\r\27[K", 1, true))
  -- the run folder's line, said at the start, then the one rewritten progress line
  T.eq(select(2, text:gsub("\n", "")), 2)
  T.ok(text:find("^run folder: " .. lg.dir:gsub("%p", "%%%0") .. " %(tensorboard %-%-logdir "), text)
  T.eq(log.format_duration(59), "59s"); T.eq(log.format_duration(61), "1m01s"); T.eq(log.format_duration(3700), "1h01m")
end)

T.case("samples every k steps with failed scores as text", function()
  local lg = log.run{ dir = T.tmpdir() .. "/r", sample_every = 5, quiet = true }
  T.ok(not lg:sample_due(3)); T.ok(lg:sample_due(5)); T.ok(lg:sample_due(10))
  lg:samples(5, { { id = "birthday/1", reward = 0.78, advantage = 1.2,
    conversation = { { role = "user", content = "Write a card." }, { role = "assistant", content = "Name?" } },
    scores = { exact_match = 1, accuracy = reward.failed("judge down") } } })
  local row = json.decode(T.read(lg.dir .. "/samples.jsonl"))
  T.eq(row.step, 5); T.eq(row.scores.exact_match, 1); T.ok(row.scores.accuracy:find("judge down", 1, true))
  local txt = T.read(lg.dir .. "/samples.txt")
  T.ok(txt:find("=== step 5 · birthday/1 · reward 0.78", 1, true), txt)
  T.ok(txt:find("[assistant] Name?", 1, true))
end)

T.case("resume drops rows after the checkpoint step", function()
  local dir = T.tmpdir() .. "/r"
  local lg = log.run{ dir = dir, quiet = true }
  for s = 1, 5 do lg:log(s, { reward = s }) end
  local lg2 = log.run{ dir = dir, quiet = true, resume_step = 3 }
  T.eq(#log.read_metrics(dir), 3)
  lg2:log(4, { reward = 40 })
  local rows = log.read_metrics(dir)
  T.eq(#rows, 4); T.eq(rows[4].reward, 40); T.ok(rows[4].time >= rows[3].time)
end)

T.case("format_table pads columns", function()
  local t = log.format_table({ "metric", "before", "after" }, { { "ask_rate", 0.5, 0.95 }, { "tokens", 12.25, 9 } })
  T.eq(t, "metric    before  after\n--------  ------  -----\nask_rate     0.5   0.95\ntokens     12.25      9\n")
end)

T.case("nice ticks and a well-formed SVG", function()
  local t, step = plot.nice_ticks(0.13, 0.87, 5)
  T.near(step, 0.2, 1e-12); T.near(t, { 0, 0.2, 0.4, 0.6, 0.8, 1 }, 1e-12)
  local _, s4 = plot.nice_ticks(0, 0.9, 5); T.near(s4, 0.25, 1e-12)
  local t2 = plot.nice_ticks(1, 60, 6)
  T.near(t2, { 0, 20, 40, 60 }, 1e-12)
  -- values a rounding unit apart (a constant series through float sums): a few ticks, at once
  local t4 = plot.nice_ticks(0.1 + 0.2, 0.3, 5)
  T.ok(#t4 >= 2 and #t4 <= 10 and t4[1] <= 0.3 and t4[#t4] >= 0.3, #t4)
  local t3 = plot.nice_ticks(5, 5, 5)
  T.ok(t3[1] <= 5 and t3[#t3] >= 5 and #t3 >= 2)
  local svg = plot.panels({ { name = "a<b", x = { 1, 2, 3 }, y = { 1, 0 / 0, 3 } }, { name = "empty", x = {}, y = {} },
                            { name = "one", x = { 7 }, y = { 2 } } }, { title = "t & t" })
  T.ok(svg:find("a&lt;b", 1, true)); T.ok(svg:find("t &amp; t", 1, true)); T.ok(svg:find("no data", 1, true))
  T.ok(not svg:find("nan", 1, true) and not svg:find("inf", 1, true))
  local dir = T.tmpdir()
  local f = io.open(dir .. "/p.svg", "w"); f:write(svg); f:close()
  local p = io.popen("python3 -c \"import xml.dom.minidom,sys; xml.dom.minidom.parse(sys.argv[1]); print('xml ok')\" " .. dir .. "/p.svg 2>&1")
  local res = p:read("*a"); p:close()
  if res:find("No such file", 1, true) or res:find("not found", 1, true) then T.skip("no python3 to check XML") end
  T.eq(res, "xml ok\n")
end)

T.case("plot.svg: whole-step ticks on a short run, lr drawn as it is, val/* series included", function()
  -- a 3-step run: ticks 1, 2, 3 (not 1, 1.5, 2, ...)
  local short = plot.panels({ { name = "reward", x = { 1, 2, 3 }, y = { 0.1, 0.2, 0.3 } } })
  T.ok(not short:find(">1.5<", 1, true) and short:find(">2<", 1, true), "whole steps")
  -- 30 points: a noisy series gets its moving average (two polylines), a schedule does not
  local xs, ys = {}, {}
  for i = 1, 30 do xs[i] = i; ys[i] = i * 1e-3 end
  local function polylines(svg) return select(2, svg:gsub("<polyline", "")) end
  T.eq(polylines(plot.panels({ { name = "loss", x = xs, y = ys } })), 2)
  T.eq(polylines(plot.panels({ { name = "lr", x = xs, y = ys, smooth = false } })), 1)
  local lg = log.run{ dir = T.tmpdir() .. "/v", quiet = true, plot = { "reward" } }
  for step = 1, 4 do lg:log(step, { reward = step, lr = 1e-3, ["val/accuracy"] = step % 2 == 0 and 0.5 or nil }) end
  local svg = T.read(lg:plot())
  T.ok(svg:find("val/accuracy", 1, true), "the validation series joins the asked keys")
  lg:close()
end)

-- A script may declare libc's clock_gettime with a timespec struct of its own before or after
-- the library loads (the FFI keeps the first declaration): the library's clock must work either
-- way, and so must a generate call, which times its steps with it.
T.case("the clock works whether a script declared clock_gettime first or not", function()
  local bin = os.getenv("CLRT_BIN") or arg[-1]
  local mine = 'local ffi = require("ffi") ffi.cdef("struct my_ts { long s; long ns; }; int clock_gettime(int, struct my_ts *);") '
  local use = 'local log = require("clrt.log") local a = log.now() local w = log.wall_time() '
    .. 'assert(type(a) == "number" and a > 0 and w > 1.7e9, "clock") '
    .. 'local m = clrt.model.new({ vocab_size = 64, hidden_size = 32, intermediate_size = 64, num_hidden_layers = 1, '
    .. 'num_attention_heads = 2, num_key_value_heads = 2, max_position_embeddings = 64, rms_norm_eps = 1e-5, '
    .. 'rope_theta = 10000 }, { seed = 1 }) '
    .. 'assert(#m:generate({ { 1, 2, 3 } }, { max_new_tokens = 3, temperature = 0 })[1].tokens == 3, "generate") '
  local mine_call = 'local t = ffi.new("struct my_ts") assert(ffi.C.clock_gettime(1, t) == 0) '
  for _, order in ipairs({ { "script first", mine .. use }, { "library first", use .. mine } }) do
    local code = order[2] .. (order[1] == "script first" and mine_call or "") .. 'print("clock-ok")'
    local p = io.popen(("%s -e %s 2>&1"):format(bin, require("clrt.util.shell").quote(code)))
    local out = p:read("*a")
    p:close()
    T.ok(out:find("clock-ok", 1, true), order[1] .. ": " .. out)
  end
end)

T.run()
