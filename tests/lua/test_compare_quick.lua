-- examples/collab_world/compare.lua quick=true end to end (one seed, a toy start, a few
-- steps per variant): every variant runs and is evaluated, and the table it writes has the
-- structure the README's comparison needs: compare.json with every variant and figure as a
-- finite mean and sd (and a wall time for the trained ones), compare.md with one row per
-- variant and one column per figure, compare.svg one bar panel per figure.
local T = require("clrt.test")
local cjson = require("cjson")

local VARIANTS = { "start", "grpo_single", "grpo_multi", "dpo_offline", "dpo_online", "sft_mr",
  "window_0", "window_1", "window_2", "window_3" }
local KEYS = { "accuracy_underspecified", "accuracy_specified", "ask_rate_underspecified",
  "ask_rate_specified", "tokens_per_conversation" }
local function finite(x) return type(x) == "number" and x == x and x ~= math.huge and x ~= -math.huge end

local out = T.tmpdir() .. "/compare"
local bin = os.getenv("CLRT_BIN") or "build/dev/clrt"

T.case("compare.lua quick=true writes the variants' table, JSON and figure", function()
  local rc = os.execute(("%s examples/collab_world/compare.lua quick=true out=%s > %s.log 2>&1"):format(bin, out, out))
  T.eq(rc, 0, "compare.lua failed; its output:\n" .. tostring(T.read(out .. ".log")):sub(-3000))
  local rep = cjson.decode(T.read(out .. "/compare.json"))
  T.eq(rep.quick, true); T.eq(#rep.seeds, 1)
  T.eq(#rep.variants, #VARIANTS)
  for i, key in ipairs(VARIANTS) do
    local v = rep.variants[i]
    T.eq(v.key, key)
    T.eq(#v.runs, 1, key .. ": one run per seed")
    for _, k in ipairs(KEYS) do
      T.ok(finite(v.mean[k]) and finite(v.sd[k]), ("%s.%s is finite: %s ± %s"):format(key, k, tostring(v.mean[k]), tostring(v.sd[k])))
      T.ok(k == "tokens_per_conversation" or (v.mean[k] >= 0 and v.mean[k] <= 1), key .. "." .. k .. " is a rate")
    end
    T.ok(finite(v.wall_s_mean), key .. ": wall time")
    if key ~= "start" then T.ok(v.wall_s_mean > 0, key .. " trained for some time") end
  end
  -- every trained variant left its run folder: metrics and the final checkpoint (or model)
  for _, key in ipairs({ "grpo_single", "grpo_multi", "dpo_offline", "dpo_online", "window_0", "window_1", "window_3" }) do
    T.ok(T.read(out .. "/seed1/" .. key .. "/metrics.jsonl"), key .. " metrics.jsonl")
    T.ok(T.read(out .. "/seed1/" .. key .. "/latest"), key .. " checkpoint")
  end
  T.ok(T.read(out .. "/seed1/sft_mr/model/model.safetensors"), "the MR-selected SFT model")
  local cfg = cjson.decode(T.read(out .. "/seed1/window_0/config.json"))
  T.eq(cfg.rollout.max_user_turns, 0, "window 0 looks no user turn ahead")
  T.eq(cjson.decode(T.read(out .. "/seed1/window_3/config.json")).rollout.max_user_turns, 3)
  T.eq(cjson.decode(T.read(out .. "/seed1/grpo_single/config.json")).single_turn, true)
  T.eq(cjson.decode(T.read(out .. "/seed1/dpo_online/config.json")).online, true)
  local md = T.read(out .. "/compare.md")
  local rows = 0
  for line in md:gmatch("[^\n]+") do
    if line:match("^| ") and not line:match("^| variant") then
      rows = rows + 1
      local cells = 0
      for _ in line:gmatch("|") do cells = cells + 1 end
      T.eq(cells, #KEYS + 3, "a row has the variant, five figures and the wall time: " .. line)
      T.ok(not line:find("nan") and not line:find("inf"), "finite: " .. line)
    end
  end
  T.eq(rows, #VARIANTS, "one markdown row per variant")
  for _, k in ipairs(KEYS) do T.ok(md:find(k, 1, true), "a column " .. k) end
  local svg = T.read(out .. "/compare.svg")
  T.ok(svg:match("^<svg") and svg:match("</svg>\n$"), "an SVG document")
  for _, k in ipairs(KEYS) do T.ok(svg:find(k, 1, true), "a panel " .. k) end
  T.ok(svg:find("online DPO, multiturn reward", 1, true), "bars labelled by variant")
  -- a second invocation reuses every result (nothing trains again) and writes the same table
  local before = T.read(out .. "/compare.json")
  T.eq(os.execute(("%s examples/collab_world/compare.lua quick=true out=%s > %s.log2 2>&1"):format(bin, out, out)), 0)
  T.eq(T.read(out .. "/compare.json"), before, "results reused")
end)

T.run()
