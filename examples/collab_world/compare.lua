-- compare.lua — the paper's training variants side by side in the built-in world: for every
-- seed, each variant trains from that seed's SFT start, then every final model is evaluated
-- the same way (greedy conversations with the scripted user on the held-out prompts, the
-- RL recipe's evaluation with the world's settings), and one table of mean ± sd over seeds
-- is written with each variant's wall time.
--   clrt examples/collab_world/compare.lua                  # 3 seeds, the world's settings (tens of minutes)
--   clrt examples/collab_world/compare.lua quick=true       # 1 seed, a toy start, a few steps (the ctest)
--   options: out=DIR (runs/compare, quick: runs/compare_quick), seeds=1,2,3,
--            only=start,dpo_offline,... (run and tabulate only these variants)
-- Writes DIR/compare.md (the table), DIR/compare.json (every run's figures and wall time,
-- the means and sds) and DIR/compare.svg (one bar panel per figure), and keeps every run
-- folder under DIR/seed<S>/<variant>. A variant whose result.json exists is not run again,
-- so an interrupted comparison continues where it stopped.
--
-- Variants (the paper's; docs/method.md, "Algorithms"):
--   start         the SFT start itself (collabllm_sft.lua; the RL recipe's cached warm start)
--   grpo_single   GRPO, single-turn reward (collabllm_rl.lua single_turn=true)
--   grpo_multi    GRPO, multiturn-aware reward (collabllm_rl.lua, forward window 2)
--   dpo_offline   offline DPO on pairs the start samples and the multiturn reward ranks
--                 (collabllm_dpo.lua; its pairs.jsonl and scored.jsonl)
--   dpo_online    online DPO, pairs from the policy's samples ranked by the multiturn reward
--   sft_mr        SFT on the best-scoring conversation of each prompt of dpo_offline's
--                 scored.jsonl (collabllm_sft.lua scored=; its wall time excludes that file's
--                 sampling, which dpo_offline's includes)
--   window_0..3   GRPO with the reward looking 0, 1, 2, 3 simulated user turns ahead
--                 (rollout.max_user_turns = max_assistant_turns = k; window_2 is grpo_multi)
local cjson = require("cjson")
local config = require("clrt.config")
local data = require("clrt.data")
local files = require("clrt.files")
local plot = require("clrt.plot")
local train = require("clrt.train")
local stats = require("collab_world.stats")
local rl = require("recipes.collabllm_rl")
local dpo = require("recipes.collabllm_dpo")
local sft = require("recipes.collabllm_sft")

local args = {}
for _, a in ipairs({ ... }) do
  local k, v = a:match("^([%w_]+)=(.*)$")
  if not k or (k ~= "quick" and k ~= "out" and k ~= "seeds" and k ~= "only") then
    error("compare: arguments are quick=true|false, out=DIR, seeds=1,2,3, only=VARIANT,...; got " .. a, 0)
  end
  args[k] = v
end
local quick = args.quick == "true"

-- What each mode runs. The full mode is the world's own settings (config.lua for GRPO,
-- config_dpo.lua for DPO); MR-selected SFT continues from the start with a shorter, gentler
-- schedule than the from-scratch SFT (not tuned).
local FULL = {
  seeds = { 1, 2, 3 }, out = "runs/compare",
  rl = {}, dpo = {},
  sft = { "train.steps=50", "train.batch_size=32", "train.micro_batch_size=32", "train.lr=5e-4",
    "train.warmup_steps=5", "train.val_every=25" },
  eval = {},
}
local QUICK = {
  seeds = { 1 }, out = "runs/compare_quick",
  start = { "train.steps=12", "train.batch_size=8", "world.conversations=200", "arch.hidden_size=32",
    "arch.intermediate_size=64", "arch.num_hidden_layers=2", "train.val_every=6" },
  rl = { "steps=3", "prompts_per_step=4", "rollout.n=4", "rollout.num_repeat_rollouts=2", "rollout.max_new_tokens=12" },
  dpo = { "steps=3", "prompts_per_step=4", "rollout.n=4", "rollout.num_repeat_rollouts=2", "rollout.max_new_tokens=12",
    "pairs_prompts=8", "min_gap=0", "train.batch_size=4" },
  sft = { "train.steps=2", "train.batch_size=4", "train.lr=1e-3", "train.warmup_steps=0", "train.val_every=0" },
  eval = { "eval.prompts=8", "rollout.max_new_tokens=12" },
}
local S = quick and QUICK or FULL
local out = args.out or S.out
local seeds = S.seeds
if args.seeds then
  seeds = {}
  for x in args.seeds:gmatch("[^,]+") do
    local n = tonumber(x)
    if not n or n < 0 or n ~= math.floor(n) then error("compare: seeds= takes whole numbers, got " .. args.seeds, 0) end
    seeds[#seeds + 1] = n
  end
end

local VARIANTS = {
  { key = "start", label = "start (SFT)" },
  { key = "grpo_single", label = "GRPO, single-turn reward", kind = "rl", args = { "single_turn=true" } },
  { key = "grpo_multi", label = "GRPO, multiturn reward", kind = "rl", args = {} },
  { key = "dpo_offline", label = "offline DPO, multiturn reward", kind = "dpo", args = {} },
  { key = "dpo_online", label = "online DPO, multiturn reward", kind = "dpo", args = { "online=true" } },
  { key = "sft_mr", label = "MR-selected SFT", kind = "sft" },
  { key = "window_0", label = "GRPO, window 0", kind = "rl", args = { "rollout.max_user_turns=0", "rollout.max_assistant_turns=0" } },
  { key = "window_1", label = "GRPO, window 1", kind = "rl", args = { "rollout.max_user_turns=1", "rollout.max_assistant_turns=1" } },
  { key = "window_2", label = "GRPO, window 2 (= multiturn)", same_as = "grpo_multi" },
  { key = "window_3", label = "GRPO, window 3", kind = "rl", args = { "rollout.max_user_turns=3", "rollout.max_assistant_turns=3" } },
}

if args.only then
  local want, kept = {}, {}
  for x in args.only:gmatch("[^,]+") do want[x] = true end
  for _, v in ipairs(VARIANTS) do
    if want[v.key] then kept[#kept + 1] = v; want[v.key] = nil end
  end
  local unknown = next(want)
  if unknown then error("compare: only=: unknown variant " .. unknown, 0) end
  for _, v in ipairs(kept) do
    if v.same_as and not args.only:find(v.same_as, 1, true) then
      error(("compare: only=: %s is %s's run; name %s too"):format(v.key, v.same_as, v.same_as), 0)
    end
  end
  VARIANTS = kept
end

local function concat(...)
  local o = {}
  for _, list in ipairs({ ... }) do for _, x in ipairs(list) do o[#o + 1] = x end end
  return o
end

-- The seed's SFT start: the RL recipe's cached warm start (full), a toy one (quick).
local function start_of(seed)
  if not quick then
    local cfg = config.parse(rl.defaults, { "seed=" .. seed }, config.read_file(rl.world_config_path()))
    return train.warm_start.ensure(cfg, require("collab_world.world"), sft, "compare")
  end
  local dir = ("%s/seed%d/sft_start"):format(out, seed)
  if files.exists(dir .. "/model/model.safetensors") then return dir .. "/model" end
  files.remove_tree(dir)
  return (sft.main(config.parse(sft.defaults, concat({ "run_dir=" .. dir, "seed=" .. seed }, S.start), sft.world_config())))
end

-- The final model of a run folder (its latest checkpoint), or an SFT run's model folder.
local function final_model(run_dir, kind)
  if kind == "sft" then return run_dir .. "/model" end
  local dir = train.checkpoint.find(run_dir)
  if not dir then error("compare: " .. run_dir .. " has no checkpoint", 0) end
  return dir
end

-- The same evaluation for every model: the RL recipe's held-out conversations.
local function evaluate(model_dir, seed)
  local ecfg = config.parse(rl.defaults, concat({ "seed=" .. seed }, S.eval), config.read_file(rl.world_config_path()))
  local tok, m = clrt.tokenizer.load(model_dir), clrt.model.load(model_dir)
  local ctx, user = train.context{ config = ecfg, tokenizer = tok, who = "compare" }
  return (train.validation.evaluate(m, tok, ecfg, require("collab_world.world"), user, ctx))
end

local function train_variant(v, seed, start, run_dir)
  local base = { "model=" .. start, "run_dir=" .. run_dir, "seed=" .. seed, "eval.before=false", "eval.after=false" }
  if v.kind == "rl" then
    rl.main(config.parse(rl.defaults, concat(base, { "save_every=1000000" }, S.rl, v.args), config.read_file(rl.world_config_path())))
  elseif v.kind == "dpo" then
    dpo.main(config.parse(dpo.defaults_for("verl", false), concat(base, { "save_every=1000000" }, S.dpo, v.args), dpo.world_config()))   -- config_dpo.lua's preset (verl)
  elseif v.kind == "sft" then
    local scored = ("%s/seed%d/dpo_offline/scored.jsonl"):format(out, seed)
    if not files.exists(scored) then error("compare: sft_mr needs " .. scored .. " (dpo_offline runs first)", 0) end
    sft.main(config.parse(sft.defaults, concat({ "model=" .. start, "run_dir=" .. run_dir, "seed=" .. seed, "scored=" .. scored },
      S.sft), sft.world_config()))
  end
end

-- One variant of one seed: trained (timed) and evaluated, or its earlier result.
local function run_variant(v, seed, start)
  local dir = ("%s/seed%d/%s"):format(out, seed, v.key)
  local result_path = dir .. "/result.json"
  if files.exists(result_path) then return cjson.decode(files.read(result_path)) end
  files.remove_tree(dir)   -- an interrupted run: start it again
  local wall = 0
  local model_dir = start
  if v.kind then
    local t0 = clrt.log.now()
    train_variant(v, seed, start, dir)
    wall = clrt.log.now() - t0
    model_dir = final_model(dir, v.kind)
  end
  io.stderr:write(("compare: seed %d, %s: evaluating %s\n"):format(seed, v.key, model_dir))
  local r = { variant = v.key, seed = seed, wall_s = wall, figures = evaluate(model_dir, seed), model = model_dir }
  files.mkdir_p(dir)
  files.write_atomic(result_path, require("clrt.json").encode(r) .. "\n")
  return r
end

files.mkdir_p(out)
local results = {}   -- results[key][i] = result of seeds[i]
for _, seed in ipairs(seeds) do
  local start = start_of(seed)
  for _, v in ipairs(VARIANTS) do
    results[v.key] = results[v.key] or {}
    if not v.same_as then results[v.key][#results[v.key] + 1] = run_variant(v, seed, start) end
  end
end
for _, v in ipairs(VARIANTS) do if v.same_as then results[v.key] = results[v.same_as] end end

-- The table: mean ± sd over seeds of every figure and the wall time.
local report = { quick = quick, seeds = seeds, keys = stats.KEYS, variants = {} }
local md = { ("Built-in world, %d seed%s (%s), held-out prompts; mean ± sd over seeds. Wall time: training only, one process on this machine.\n")
  :format(#seeds, #seeds > 1 and "s" or "", table.concat(seeds, ", ")) }
local head = { "| variant |" }
local rule = { "|---|" }
for _, k in ipairs(stats.KEYS) do head[#head + 1] = " " .. k .. " |"; rule[#rule + 1] = "---|" end
head[#head + 1] = " wall time (s) |"; rule[#rule + 1] = "---|"
md[#md + 1] = table.concat(head)
md[#md + 1] = table.concat(rule)
for _, v in ipairs(VARIANTS) do
  local rs = results[v.key]
  local entry = { key = v.key, label = v.label, same_as = v.same_as, runs = rs, mean = {}, sd = {} }
  local cells = { "| " .. v.label .. " |" }
  for _, k in ipairs(stats.KEYS) do
    local xs = {}
    for _, r in ipairs(rs) do xs[#xs + 1] = r.figures[k] end
    entry.mean[k], entry.sd[k] = stats.mean_sd(xs)
    cells[#cells + 1] = " " .. stats.format(k, entry.mean[k], entry.sd[k]) .. " |"
  end
  local ws = {}
  for _, r in ipairs(rs) do ws[#ws + 1] = r.wall_s end
  entry.wall_s_mean, entry.wall_s_sd = stats.mean_sd(ws)
  cells[#cells + 1] = (v.kind or v.same_as) and (" %.0f ± %.0f |"):format(entry.wall_s_mean, entry.wall_s_sd) or " – |"
  md[#md + 1] = table.concat(cells)
  report.variants[#report.variants + 1] = entry
end
local md_text = table.concat(md, "\n") .. "\n"
files.write_atomic(out .. "/compare.md", md_text)
files.write_atomic(out .. "/compare.json", require("clrt.json").encode(report) .. "\n")

local panels = {}
for _, k in ipairs(stats.KEYS) do
  local p = { name = k, labels = {}, values = {}, errors = {}, range = k ~= "tokens_per_conversation" and { 0, 1 } or nil }
  for i, e in ipairs(report.variants) do p.labels[i], p.values[i], p.errors[i] = e.label, e.mean[k], e.sd[k] end
  panels[#panels + 1] = p
end
local wp = { name = "wall time of training (s)", labels = {}, values = {}, errors = {} }
for i, e in ipairs(report.variants) do wp.labels[i], wp.values[i], wp.errors[i] = e.label, e.wall_s_mean, e.wall_s_sd end
panels[#panels + 1] = wp
files.write_atomic(out .. "/compare.svg", plot.bars(panels, { title = ("CollabLLM training variants, built-in world (mean ± sd over %d seed%s)")
  :format(#seeds, #seeds > 1 and "s" or "") }))
io.write(md_text, "wrote ", out, "/compare.md, compare.json, compare.svg\n")
