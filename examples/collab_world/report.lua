-- report.lua — the README's numbers for the built-in world: mean ± sd over seeds of the
-- before/after evaluation of the multiturn-aware runs and of the single-turn ablation, and
-- one SVG with the seed-averaged learning curves of both.
--   clrt examples/collab_world/report.lua mt=DIR1,DIR2,DIR3 st=DIR1,DIR2,DIR3 out=FILE.svg
local cjson = require("cjson")
local data = require("clrt.data")
local plot = require("clrt.plot")

local args = {}
for _, a in ipairs({ ... }) do
  local k, v = a:match("^([%w_]+)=(.*)$")
  if not k then error("report: arguments are key=value, got " .. a, 0) end
  args[k] = v
end
local function dirs(s)
  local out = {}
  for d in (s or ""):gmatch("[^,]+") do out[#out + 1] = d end
  return out
end

local stats = require("collab_world.stats")
local KEYS, mean_sd = stats.KEYS, stats.mean_sd

local function table_for(label, ds)
  local rows = { ("**%s** (%d seeds, held-out prompts)\n"):format(label, #ds),
    "| | before RL | after RL |", "|---|---|---|" }
  for _, k in ipairs(KEYS) do
    local b, a = {}, {}
    for _, d in ipairs(ds) do
      local s = cjson.decode(assert(io.open(d .. "/summary.json")):read("*a"))
      b[#b + 1], a[#a + 1] = s.before[k], s.after[k]
    end
    local bm, bs = mean_sd(b)
    local am, as = mean_sd(a)
    rows[#rows + 1] = ("| %s | %s | %s |"):format(k, stats.format(k, bm, bs), stats.format(k, am, as))
  end
  return table.concat(rows, "\n") .. "\n"
end

-- Seed-averaged curve of one metric.
local function curve(ds, key, name)
  local sum, cnt = {}, {}
  for _, d in ipairs(ds) do
    for _, r in ipairs(data.read_jsonl(d .. "/metrics.jsonl")) do
      if type(r[key]) == "number" then
        sum[r.step] = (sum[r.step] or 0) + r[key]
        cnt[r.step] = (cnt[r.step] or 0) + 1
      end
    end
  end
  local xs, ys = {}, {}
  for step = 1, #sum do
    if sum[step] then xs[#xs + 1], ys[#ys + 1] = step, sum[step] / cnt[step] end
  end
  return { name = name, x = xs, y = ys }
end

local mt, st = dirs(args.mt), dirs(args.st)
io.write(table_for("Multiturn-aware reward (CollabLLM)", mt), "\n")
if #st > 0 then io.write(table_for("Single-turn reward (ablation: no future conversations)", st), "\n") end
if args.out then
  local series = {
    curve(mt, "first_reply_ask_rate", "multiturn reward: share of sampled first replies that ask"),
    curve(mt, "reward", "multiturn reward: mean reward"),
  }
  if #st > 0 then
    series[#series + 1] = curve(st, "first_reply_ask_rate", "single-turn reward: share of first replies that ask")
    series[#series + 1] = curve(st, "reward", "single-turn reward: mean reward")
  end
  data.write_atomic(args.out, plot.panels(series, { title = ("collab world, RL steps (mean of %d seeds)"):format(#mt) }))
  io.write("wrote ", args.out, "\n")
end
