-- clrt.train.sharded_recipe — collabllm_eval.lua protocol=sharded from its config: the tasks
-- (data= in Lost in Conversation's schema, or the built-in world's two-shard requests), the
-- simulated user's voice from sim=, the strategy judge, every variant evaluated on the same
-- tasks (the model as given, then compare_system_prompt= and compare_model=), eval.json with
-- each variant's report and eval_details*.jsonl with every conversation, and the printed tables.
--   local rep = sharded_recipe.main(cfg, {who =, world =, open_folder =, system_text =})
-- env: the recipe's own pieces (this library never requires a recipe or an example):
-- world (examples/collab_world/world.lua, with no data=), open_folder(cfg),
-- system_text(cfg, world) (collabllm_eval's, so system_prompt= means what it does there) and
-- details_file (nil: eval_details.jsonl; variant i > 1 adds _variant<i>).
local sharded_eval = require("clrt.train.sharded_eval")
local sharded_tasks = require("clrt.train.sharded_tasks")
local train = {
  context = require("clrt.train.context"), endpoints = require("clrt.train.endpoints"),
  users = require("clrt.train.users"), reward = require("clrt.train.reward"), paper_eval = require("clrt.train.paper_eval"),
}
local M = {}

-- The user's voice for each sim= value (lua/interactions/sharded_user.lua's header).
M.VOICE = { llm = "llm", user_lm = "user_lm", scripted = "scripted" }

-- Tasks run by default on the built-in world (distinct held-out under-specified requests).
M.WORLD_TASKS = 40

local function whole(v, name, who, min)
  if type(v) ~= "number" or v % 1 ~= 0 or v < min then
    error(("%s: %s must be a whole number >= %d, got %s"):format(who, name, min, tostring(v)), 0)
  end
  return v
end

-- The settings protocol=sharded reads, checked (a bad one fails before any folder or model).
function M.check(cfg, who)
  cfg.simulations = whole(cfg.simulations or sharded_eval.SIMULATIONS, "simulations", who, 1)
  whole(cfg.max_turns_per_shard, "max_turns_per_shard", who, 1)
  cfg.temperature = cfg.temperature or 1.0   -- the authors' run_simulations.py: assistant and user at 1.0
  if type(cfg.temperature) ~= "number" or cfg.temperature < 0 then
    error(("%s: temperature must be a number >= 0, got %s"):format(who, tostring(cfg.temperature)), 0)
  end
  if not M.VOICE[cfg.sim] then
    error(("%s: protocol=sharded plays its user as sim=llm (an endpoint), user_lm (a trained user model) or scripted, got %s")
      :format(who, tostring(cfg.sim)), 0)
  end
end

-- The tasks of a run: data= (only the task names in tasks=, a comma list) or the world's.
function M.tasks(cfg, world, who)
  local tasks, skipped
  if cfg.data then
    local only
    if cfg.tasks then
      only = {}
      -- a comma list; a name may hold spaces (shard_dataset names tasks by task_desc)
      for name in tostring(cfg.tasks):gmatch("[^,]+") do only[(name:gsub("^%s+", ""):gsub("%s+$", ""))] = true end
    end
    tasks, skipped = sharded_tasks.read(cfg.data, who, only)
  else
    tasks, skipped = {}, {}
    for i, row in ipairs(world.sharded_tasks(cfg.prompts or M.WORLD_TASKS, cfg.seed)) do
      tasks[i] = assert(sharded_tasks.task(row, "collab_world"))
    end
  end
  while cfg.prompts and #tasks > cfg.prompts do table.remove(tasks) end
  for name, s in pairs(skipped) do
    io.stderr:write(("%s: %d %s rows left out: %s\n"):format(who, s.rows, tostring(name), s.why))
  end
  return tasks, skipped
end

-- The variants compared on the same tasks: {name, model, adapter, system_prompt}.
function M.variants(cfg, who)
  local out = { { model = cfg.model, adapter = cfg.adapter, system_prompt = cfg.system_prompt } }
  if cfg.compare_system_prompt then
    out[#out + 1] = { model = cfg.model, adapter = cfg.adapter, system_prompt = cfg.compare_system_prompt }
  end
  if cfg.compare_model then
    local r = require("clrt.model_path").resolve(cfg.compare_model, { who = who })
    out[#out + 1] = { model = r.model, adapter = r.adapter, system_prompt = cfg.system_prompt }
  end
  local seen = {}
  for i, v in ipairs(out) do
    v.name = ("%s [system_prompt=%s]"):format(v.model, tostring(v.system_prompt))
    if seen[v.name] then v.name = v.name .. " #" .. i end
    seen[v.name] = true
  end
  return out
end

-- The authors' answer extraction where clrt's metrics would otherwise ask an LLM: the code of
-- the last fenced block of the reply (their code task), the whole reply (data2text,
-- translation). A metric_options entry given on the command line wins.
function M.metric_options(given)
  local out = {}
  for k, v in pairs(given or {}) do out[k] = v end
  for _, name in ipairs({ "pass_rate", "bleu_score" }) do
    local o = {}
    for k, v in pairs(out[name] or {}) do o[k] = v end
    if o.extract == nil then o.extract = false end
    out[name] = o
  end
  return out
end

-- Whether any task calls the judge: the strategy judge on tasks whose replies are not all
-- answers, or a metric other than those scored here without an LLM (exact_match; bleu_score
-- and pass_rate with the extraction off, M.metric_options). The world has its own rule.
M.NO_JUDGE = { exact_match = true, bleu_score = true, pass_rate = true }
function M.needs_judge(tasks, world, metric_options)
  if world then return false end
  local opts = metric_options or M.metric_options({})
  for _, t in ipairs(tasks) do
    local m = t.task_metric
    local off = M.NO_JUDGE[m] and (m == "exact_match" or (opts[m] or {}).extract == false)
    if not t.every_turn_answer or not off then return true end
  end
  return false
end

-- Whether any task's user talks to sim_cfg's endpoint (a scripted task's never does).
function M.needs_user(tasks, voice)
  if voice == "scripted" then return false end
  for _, t in ipairs(tasks) do if t.user_voice ~= "scripted" then return true end end
  return false
end

local function details_of(results)
  local out = {}
  for i, r in ipairs(results) do
    out[i] = { id = r.sample.id, task = r.sample.task, setting = r.setting, simulation = r.simulation, score = r.score,
      dropped = r.dropped, failed = r.failed, error = r.error and tostring(r.error), ended = r.ended,
      attempts = r.attempts, strategies = r.strategies, reveals = r.reveals, conversation = r.conversation }
  end
  return out
end

function M.main(cfg, env)
  local who = env.who
  M.check(cfg, who)
  local world = not cfg.data and env.world or nil
  local variants = M.variants(cfg, who)
  for _, v in ipairs(variants) do env.system_text({ system_prompt = v.system_prompt, data = cfg.data }, world) end   -- checked now
  local tasks, skipped = M.tasks(cfg, world, who)
  env.open_folder(cfg)
  local data, json = require("clrt.data"), require("clrt.json")
  local ctx, user = nil, train.users.load("sharded_user", who)
  local reports = {}
  for i, v in ipairs(variants) do
    local m = require("clrt.model").load(v.model, { adapter = v.adapter })
    local tok = require("clrt.tokenizer").load(v.model)
    if not ctx then
      ctx = train.context{ config = cfg, tokenizer = tok, who = who }
      ctx.sharded_voice = M.VOICE[cfg.sim]
      ctx.metric_options = M.metric_options(ctx.metric_options)
      -- only the endpoints some task calls (data2text and translation need neither)
      local check_ctx = M.needs_user(tasks, ctx.sharded_voice) and ctx or setmetatable({ user = false }, { __index = ctx })
      train.endpoints.check(check_ctx, M.needs_judge(tasks, world, ctx.metric_options) and { { metric = { uses_judge = true } } } or {}, cfg, who)
    end
    local classify = world and world.strategy or sharded_eval.judge_classifier(ctx.metric_options)
    if #variants > 1 then print(("== variant %d of %d: %s"):format(i, #variants, v.name)) end
    local system = env.system_text({ system_prompt = v.system_prompt, data = cfg.data }, world)
    local policy = train.paper_eval.policy(m, tok, cfg)
    local results = sharded_eval.run(policy, { simulations = cfg.simulations, seed = cfg.seed,
      max_turns_per_shard = cfg.max_turns_per_shard, system = system }, tasks, user, classify, ctx)
    local rep = sharded_eval.report(results, cfg)
    rep.model, rep.adapter, rep.system_prompt, rep.data, rep.sim = v.model, v.adapter, v.system_prompt, cfg.data, cfg.sim
    rep.temperature, rep.assistant_max_new_tokens, rep.tasks_left_out = cfg.temperature, cfg.rollout.max_new_tokens, skipped
    rep.variant = v.name
    if rep.first_drop then io.stderr:write(who, ": first dropped conversation: ", rep.first_drop, "\n") end
    if rep.first_failure then io.stderr:write(who, ": first failed conversation: ", rep.first_failure, "\n") end
    if rep.conversations == 0 then
      error(("%s: no conversation of %s was scored (%d dropped, %d failed; first: %s)"):format(who, v.name, rep.dropped,
        rep.failed, tostring(rep.first_drop or rep.first_failure)), 0)
    end
    sharded_eval.print_table(rep)
    print(("conversations %d, dropped %d, failed %d"):format(rep.conversations, rep.dropped, rep.failed))
    local first = env.details_file or "eval_details.jsonl"   -- eval_sim=: the second simulator's own
    data.write_jsonl(cfg.out .. "/" .. (i == 1 and first or first:gsub("%.jsonl$", "") .. ("_variant%d.jsonl"):format(i)),
      details_of(results))
    reports[i] = { name = v.name, report = rep }
  end
  local top = {}
  for k, val in pairs(reports[1].report) do top[k] = val end
  if #reports > 1 then
    top.variants, top.by_variant = {}, {}
    for i, r in ipairs(reports) do top.variants[i] = r.name; top.by_variant[r.name] = r.report end
    print("== side by side (performance per setting; SHARDED's change from FULL; SHARDED's aptitude and unreliability)")
    sharded_eval.print_comparison(reports)
  end
  -- the simulator's and judges' tokens and dollars, all variants together (docs/api_cost.md)
  local spend = ctx.spend:add(require("clrt.llm").drain_records())
  if spend.all.calls > 0 then
    top.api = spend
    print(require("clrt.api.usage").line(spend))
  end
  data.write_atomic(cfg.out .. "/eval.json", json.encode(top) .. "\n")
  print("wrote " .. cfg.out .. "/eval.json")
  return top
end

return M
