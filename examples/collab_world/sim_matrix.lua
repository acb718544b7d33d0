-- sim_matrix.lua — cross-simulator training and evaluation in the built-in world, with no
-- API key (docs/user_models.md): a user model trained by recipes/collabllm_user_sft.lua on
-- the world's conversations, served by `clrt serve --deterministic`, is the simulated user
-- (sim=user_lm) of collabllm_rl.lua; the scripted user is the other. For every seed a
-- policy is trained with each simulator from the same warm start, and every final policy is
-- evaluated with both (greedy conversations on the held-out prompts, the RL recipe's
-- evaluation), and the warm start before RL too: the matrix trained-with x evaluated-with,
-- mean ± sd over seeds, and the RL step time with each simulator.
--   clrt examples/collab_world/sim_matrix.lua                 # 3 seeds, the world's settings
--   clrt examples/collab_world/sim_matrix.lua quick=true      # 1 seed, toy sizes (the ctest)
--   options: out=DIR (runs/sim_matrix, quick: runs/sim_matrix_quick), seeds=1,2,3,
--            user_model=DIR (a served user model folder instead of training one),
--            warm_start=shared|per_seed (full mode: seed 1's warm start for every seed, the
--            default, or each seed its own)
-- Writes DIR/matrix.md (the tables), DIR/matrix.json (every cell of every seed, step times)
-- and keeps DIR/user_model, DIR/seed<S>/<trained-with> run folders; a cell whose result.json
-- exists is not run again.
local config = require("clrt.config")
local files = require("clrt.files")
local train = require("clrt.train")
local stats = require("collab_world.stats")
local rl = require("recipes.collabllm_rl")
local sft = require("recipes.collabllm_sft")
local user_sft = require("recipes.collabllm_user_sft")
local world = require("collab_world.world")

local args = {}
for _, a in ipairs({ ... }) do
  local k, v = a:match("^([%w_]+)=(.*)$")
  if not k or not ({ quick = 1, out = 1, seeds = 1, user_model = 1, warm_start = 1 })[k] then
    error("sim_matrix: arguments are quick=true|false, out=DIR, seeds=1,2,3, user_model=DIR, warm_start=shared|per_seed; got " .. a, 0)
  end
  args[k] = v
end
local quick = args.quick == "true"
local FULL = { seeds = { 1, 2, 3 }, out = "runs/sim_matrix", user = {}, start = nil, rl = {}, eval = {} }
local QUICK = {
  seeds = { 1 }, out = "runs/sim_matrix_quick",
  user = { "train.steps=30", "train.batch_size=16", "world.conversations=300", "arch.hidden_size=32",
    "arch.intermediate_size=64", "arch.num_hidden_layers=2", "train.val_every=0" },
  start = { "train.steps=12", "train.batch_size=8", "world.conversations=200", "arch.hidden_size=32",
    "arch.intermediate_size=64", "arch.num_hidden_layers=2", "train.val_every=6" },
  rl = { "steps=2", "prompts_per_step=4", "rollout.n=4", "rollout.num_repeat_rollouts=2", "rollout.max_new_tokens=12" },
  eval = { "eval.prompts=8", "rollout.max_new_tokens=12" },
}
local S = quick and QUICK or FULL
local out = args.out or S.out
local seeds = S.seeds
if args.seeds then
  seeds = {}
  for x in args.seeds:gmatch("[^,]+") do
    local n = tonumber(x)
    if not n or n < 0 or n ~= math.floor(n) then error("sim_matrix: seeds= takes whole numbers, got " .. args.seeds, 0) end
    seeds[#seeds + 1] = n
  end
end
local shared_start = (args.warm_start or "shared") == "shared"
if args.warm_start and args.warm_start ~= "shared" and args.warm_start ~= "per_seed" then
  error("sim_matrix: warm_start= is shared or per_seed, got " .. args.warm_start, 0)
end

local function concat(...)
  local o = {}
  for _, list in ipairs({ ... }) do for _, x in ipairs(list) do o[#o + 1] = x end end
  return o
end
local function read_json(path) return require("cjson").decode(files.read(path)) end

files.mkdir_p(out)

-- 1. The user model: trained once (or user_model=), then served with batch-invariant kernels.
local user_dir = args.user_model
if not user_dir then
  local dir = out .. "/user_model"
  if not files.exists(dir .. "/model/model.safetensors") then
    files.remove_tree(dir)
    local t0 = clrt.log.now()
    user_sft.main(config.parse(user_sft.defaults, concat({ "run_dir=" .. dir, "seed=1" }, S.user), user_sft.world_config()))
    files.write_atomic(dir .. "/wall_s.txt", ("%.1f\n"):format(clrt.log.now() - t0))
  end
  user_dir = dir .. "/model"
end
local bin = arg and arg[-1] or "clrt"
local log = out .. "/serve.log"
local pid_file = out .. "/serve.pid"
os.execute(("%s serve %s --port 0 --deterministic --slots 64 --served-model-name world-user > %s 2>&1 & echo $! > %s")
  :format(bin, user_dir, log, pid_file))
local pid = (files.read(pid_file) or ""):match("%d+")
local function stop() if pid then os.execute("kill " .. pid .. " 2>/dev/null") end end
local port
for _ = 1, 600 do
  port = (files.exists(log) and files.read(log) or ""):match("http://127%.0%.0%.1:(%d+)/v1")
  if port then break end
  os.execute("sleep 0.1")
end
if not port then stop(); error("sim_matrix: clrt serve did not start: " .. (files.read(log) or ""), 0) end
local url = ("http://127.0.0.1:%s/v1"):format(port)
io.stderr:write("sim_matrix: the user model is served at " .. url .. "\n")
-- sim=user_lm against it: greedy would repeat one reply per state; the world's user model is
-- sampled at 1.0 as the LLM user is, with short replies
local USER_LM = { "sim=user_lm", "sim_cfg.base_url=" .. url, "sim_cfg.model=world-user", "sim_cfg.max_tokens=24",
  "sim_cfg.max_chars=200", "sim_cfg.max_concurrency=64" }
local SIMS = { { key = "scripted", label = "scripted user", args = { "sim=scripted" } },
  { key = "user_lm", label = "user model (user_lm)", args = USER_LM } }

local function start_of(seed)
  if not quick then
    local cfg = config.parse(rl.defaults, { "seed=" .. (shared_start and 1 or seed) }, config.read_file(rl.world_config_path()))
    return train.warm_start.ensure(cfg, world, sft, "sim_matrix")
  end
  local dir = ("%s/seed%d/sft_start"):format(out, seed)
  if files.exists(dir .. "/model/model.safetensors") then return dir .. "/model" end
  files.remove_tree(dir)
  return (sft.main(config.parse(sft.defaults, concat({ "run_dir=" .. dir, "seed=" .. seed }, S.start), sft.world_config())))
end

-- The world figures of a model evaluated with one simulator.
local function evaluate(model_dir, seed, sim)
  local ecfg = config.parse(rl.defaults, concat({ "seed=" .. seed }, S.eval, sim.args), config.read_file(rl.world_config_path()))
  local tok, m = clrt.tokenizer.load(model_dir), clrt.model.load(model_dir)
  local ctx, user = train.context{ config = ecfg, tokenizer = tok, who = "sim_matrix" }
  local figures = train.validation.evaluate(m, tok, ecfg, world, user, ctx)
  m:free()
  clrt.llm.drain_records()   -- the evaluation's calls are its own, not the next run's first step's
  return figures
end

-- The median RL step time of a run (metrics.jsonl's time_step_s; the first step left out
-- when there are more, it warms caches).
local function step_time(run_dir)
  local xs = {}
  for _, r in ipairs(require("clrt.data").read_jsonl(run_dir .. "/metrics.jsonl")) do
    if r.time_step_s then xs[#xs + 1] = r.time_step_s end
  end
  if #xs > 1 then table.remove(xs, 1) end
  table.sort(xs)
  return xs[math.floor((#xs + 1) / 2)]
end

local ok, err = pcall(function()
  for _, seed in ipairs(seeds) do
    local start = start_of(seed)
    -- the start itself (before RL), evaluated the same way: what RL changed
    local sdir = ("%s/seed%d/start"):format(out, seed)
    if not files.exists(sdir .. "/result.json") then
      local r = { seed = seed, trained_with = "start", model = start, evaluated_with = {} }
      for _, e in ipairs(SIMS) do r.evaluated_with[e.key] = evaluate(start, seed, e) end
      files.mkdir_p(sdir)
      files.write_atomic(sdir .. "/result.json", require("clrt.json").encode(r) .. "\n")
    end
    for _, sim in ipairs(SIMS) do
      local dir = ("%s/seed%d/%s"):format(out, seed, sim.key)
      if not files.exists(dir .. "/result.json") then
        files.remove_tree(dir)
        local t0 = clrt.log.now()
        rl.main(config.parse(rl.defaults, concat({ "model=" .. start, "run_dir=" .. dir, "seed=" .. seed,
          "eval.before=false", "eval.after=false", "save_every=1000000" }, S.rl, sim.args), config.read_file(rl.world_config_path())))
        local wall = clrt.log.now() - t0
        local final = train.checkpoint.find(dir)
        local r = { seed = seed, trained_with = sim.key, wall_s = wall, step_s = step_time(dir), model = final, evaluated_with = {} }
        for _, e in ipairs(SIMS) do
          io.stderr:write(("sim_matrix: seed %d, trained with %s: evaluating with %s\n"):format(seed, sim.key, e.key))
          r.evaluated_with[e.key] = evaluate(final, seed, e)
        end
        files.write_atomic(dir .. "/result.json", require("clrt.json").encode(r) .. "\n")
      end
    end
  end
end)
stop()
if not ok then error(err, 0) end

-- The tables: one per figure of the issue, rows trained-with, columns evaluated-with.
local ROWS = { { key = "start", label = "none (the warm start, before RL)" }, SIMS[1], SIMS[2] }
local KEYS = { "accuracy_underspecified", "accuracy_specified", "ask_rate_underspecified", "ask_rate_specified",
  "tokens_per_conversation" }
local report = { quick = quick, seeds = seeds, shared_warm_start = shared_start and not quick, cells = {}, step_s = {}, runs = {} }
local md = { ("Built-in world, %d seed%s (%s)%s; held-out prompts, greedy policy; mean ± sd over seeds. Rows: the simulated user the policy was trained with; columns: the one it is evaluated with.\n")
  :format(#seeds, #seeds > 1 and "s" or "", table.concat(seeds, ", "),
    (shared_start and not quick) and ", every seed from seed 1's warm start" or "") }
for _, k in ipairs(KEYS) do
  md[#md + 1] = ("**%s**\n"):format(k)
  md[#md + 1] = "| trained with \\ evaluated with | " .. SIMS[1].label .. " | " .. SIMS[2].label .. " |"
  md[#md + 1] = "|---|---|---|"
  for _, t in ipairs(ROWS) do
    local cells = { "| " .. t.label .. " |" }
    for _, e in ipairs(SIMS) do
      local xs = {}
      for _, seed in ipairs(seeds) do
        local r = read_json(("%s/seed%d/%s/result.json"):format(out, seed, t.key))
        xs[#xs + 1] = r.evaluated_with[e.key][k]
      end
      local mean, sd = stats.mean_sd(xs)
      report.cells[t.key .. "/" .. e.key .. "/" .. k] = { mean = mean, sd = sd, values = xs }
      cells[#cells + 1] = " " .. stats.format(k, mean, sd) .. " |"
    end
    md[#md + 1] = table.concat(cells)
  end
  md[#md + 1] = ""
end
md[#md + 1] = "**RL step time (median s per step) and training wall time (s)**\n"
md[#md + 1] = "| trained with | step time (s) | wall time (s) |"
md[#md + 1] = "|---|---|---|"
for _, t in ipairs(SIMS) do
  local st, wt = {}, {}
  for _, seed in ipairs(seeds) do
    local r = read_json(("%s/seed%d/%s/result.json"):format(out, seed, t.key))
    st[#st + 1], wt[#wt + 1] = r.step_s, r.wall_s
    report.runs[#report.runs + 1] = r
  end
  local sm, ss = stats.mean_sd(st)
  local wm, ws = stats.mean_sd(wt)
  report.step_s[t.key] = { mean = sm, sd = ss, wall_mean = wm, wall_sd = ws }
  md[#md + 1] = ("| %s | %.2f ± %.2f | %.0f ± %.0f |"):format(t.label, sm, ss, wm, ws)
end
local text = table.concat(md, "\n") .. "\n"
files.write_atomic(out .. "/matrix.md", text)
files.write_atomic(out .. "/matrix.json", require("clrt.json").encode(report) .. "\n")
io.write(text, "wrote ", out, "/matrix.md, matrix.json\n")
