-- clrt.train.paper_eval — the CollabLLM paper's evaluation (collabllm_eval.lua protocol=paper),
-- as the authors' scripts/engine/inference.py runs it: for every single-turn task of the test
-- set the chat starts empty (only a system prompt, if any), the simulated user opens it, user
-- and assistant alternate until the user ends the chat or max_messages messages (user and
-- assistant, 14 in the authors' script) have been written, the assistant sampled at
-- `temperature` (0.6). Each conversation is then scored: task performance by the row's
-- task_metric (bleu_score on documents, pass_rate on code, accuracy on math), interactivity by
-- itr_metric (the LLM judge `interactivity`, the paper's ITR), and tokens read: the assistant's
-- messages joined by spaces (as the authors' token_amount joins them) in the policy's
-- tokenizer, / 1000. Reported per task and overall as mean and standard error.
--   local samples = paper_eval.samples(path, system_text, task_metric)   -- eval_test.jsonl rows
--   local samples = paper_eval.world_samples(world, n, seed, system_text)
--   local results = paper_eval.run(m, tok, cfg, samples, user, ctx)
--   local report = paper_eval.report(results, cfg)
local reward = require("clrt.train.reward")
local failure = require("clrt.train.failure")
local rollout = require("clrt.train.rollout")
local M = {}

local function opening_prompt(system_text)
  return system_text and { { role = "system", content = system_text } } or {}
end

-- process_dataset's eval_test.jsonl rows -> samples; a bad row is an error naming the line.
-- task_metric (optional) overrides every row's; who names the calling recipe in errors.
function M.samples(path, system_text, task_metric, who)
  who = who or "clrt.train.paper_eval"
  local rows, line_of = require("clrt.data").read_dataset(path)
  local out = {}
  for i, r in ipairs(rows) do
    local where = ("%s: %s:%d: "):format(who, path, line_of[i])
    if type(r) ~= "table" then error(where .. "a row must be a JSON object", 0) end
    if r.prompt ~= nil then
      error(where .. "this is an RL row (it has a \"prompt\" list); protocol=paper reads process_dataset's "
        .. "eval_test.jsonl, and protocol=prefix evaluates RL rows", 0)
    end
    if type(r.single_turn_prompt) ~= "string" or r.single_turn_prompt == "" then
      error(where .. "no \"single_turn_prompt\" text (the task the simulated user has in mind)", 0)
    end
    local metric = task_metric or r.task_metric
    if type(metric) ~= "string" then
      error(where .. "no \"task_metric\" (bleu_score, pass_rate, accuracy, ...); pass task_metric= to set one", 0)
    end
    out[i] = { id = tostring(r.conv_id or i), prompt = opening_prompt(system_text), ground_truth = r.ground_truth,
      single_turn_prompt = r.single_turn_prompt, single_turn_metadata = r.single_turn_metadata,
      task_desc = r.task_desc, task_metric = metric, task = tostring(r.task_desc or metric) }
  end
  if #out == 0 then error(who .. ": " .. path .. " has no rows", 0) end
  return out
end

-- The built-in world's held-out requests as paper-protocol samples: the scripted user opens
-- with the world's phrasing (under-specified or not); task performance is exact_match.
function M.world_samples(world, n, seed, system_text)
  local out = {}
  for i, s in ipairs(world.eval_prompts(n, seed, { system = false })) do
    s.opening = s.prompt[#s.prompt].content
    s.prompt = opening_prompt(system_text)
    s.task_metric = "exact_match"
    s.task = s.underspecified and "world/underspecified" or "world/specified"
    out[i] = s
  end
  return out
end

-- Thousands of tokens the user reads: the assistant's visible messages, joined by spaces.
function M.tokens_read_k(tok, conversation)
  local parts = {}
  for _, msg in ipairs(conversation) do
    if msg.role == "assistant" then parts[#parts + 1] = msg.content or "" end
  end
  return #tok:encode(table.concat(parts, " "), { add_special_tokens = false }) / 1000
end

-- The message limits of rollout.conversation for max_messages user + assistant messages
-- starting with the user: ceil(n/2) user turns, floor(n/2) assistant turns.
function M.turn_limits(max_messages)
  return math.ceil(max_messages / 2), math.floor(max_messages / 2)
end

-- The policy that answers in the paper's conversations: m sampled at cfg.temperature.
function M.policy(m, tok, cfg)
  local ecfg = { rollout = {}, chat = cfg.chat }
  for k, v in pairs(cfg.rollout) do ecfg.rollout[k] = v end
  ecfg.rollout.temperature, ecfg.rollout.future_temperature = cfg.temperature, cfg.temperature
  return require("clrt.train.policy").new(m, tok, ecfg, cfg.seed)
end

-- Every sample's conversation and scores, all conversations in flight together (clrt.sched).
-- cfg: rollout, chat, temperature, seed, max_messages, itr_metric. policy: M.policy's (tests
-- pass their own).
function M.run(m, tok, cfg, samples, user, ctx, policy)
  local sched = require("clrt.sched")
  policy = policy or M.policy(m, tok, cfg)
  local max_user, max_asst = M.turn_limits(cfg.max_messages)
  local names = { [cfg.itr_metric] = 1 }
  for _, s in ipairs(samples) do names[s.task_metric] = 1 end
  local by_name = {}
  for _, mt in ipairs(reward.load_metrics(names)) do by_name[mt.name] = mt end
  local fns = {}
  for i, s in ipairs(samples) do
    fns[i] = function()
      local c, info = rollout.conversation(s.prompt, policy, user, s, ctx,
        { max_user_turns = max_user, max_assistant_turns = max_asst, keep_last_assistant = true,
          seed_key = ("paper/prompt %d"):format(i) })
      if not c then return { sample = s, dropped = info.dropped, error = info.error } end
      -- the user ended the chat before the assistant spoke: nothing of the policy's to score
      -- (an extractor would invent a final answer from the task alone)
      if not M.assistant_spoke(c, #s.prompt) then
        return { sample = s, conversation = c, ended = info.ended, dropped = "no assistant turn",
          error = info.ended == "context_full"
            and "the system prompt and the user's opening fill the model's context: no room for the assistant's first message"
            or "the simulated user ended the chat before the assistant's first message" }
      end
      local scores = reward.score_conversation(c, s, { by_name[s.task_metric], by_name[cfg.itr_metric] }, ctx)
      return { sample = s, conversation = c, ended = info.ended, messages = #c - #s.prompt,
        task_performance = scores[s.task_metric], itr = scores[cfg.itr_metric], tokens_read_k = M.tokens_read_k(tok, c) }
    end
  end
  local results, errs = sched.run(fns, { progress = "evaluation: conversations" })
  failure.check_stop(ctx)
  for i in pairs(errs) do results[i] = { sample = samples[i], dropped = "error", error = errs[i] } end
  return results
end

-- Whether an assistant message follows the prompt's first `from` messages.
function M.assistant_spoke(conversation, from)
  for i = from + 1, #conversation do
    if conversation[i].role == "assistant" then return true end
  end
  return false
end

-- Mean, standard error (sample standard deviation / sqrt(n); 0 for n = 1) and n of a list.
function M.mean_se(xs)
  local n = #xs
  if n == 0 then return { n = 0 } end
  local s = 0
  for _, x in ipairs(xs) do s = s + x end
  local mean, ss = s / n, 0
  for _, x in ipairs(xs) do ss = ss + (x - mean) ^ 2 end
  return { mean = mean, se = n > 1 and math.sqrt(ss / (n - 1) / n) or 0, n = n }
end

M.QUANTITIES = { "task_performance", "itr", "tokens_read_k", "messages" }

-- Per task and overall: each quantity's mean ± standard error over the conversations where
-- it was computed (a failed judge leaves that one out and is counted in failed).
function M.report(results, cfg)
  local groups, order = {}, {}
  local rep = { protocol = "paper", conversations = 0, dropped = 0, failed = {}, tasks = {} }
  local function group(name)
    if not groups[name] then
      groups[name] = { task_performance = {}, itr = {}, tokens_read_k = {}, messages = {} }
      order[#order + 1] = name
    end
    return groups[name]
  end
  local all = group("overall")
  for _, r in ipairs(results) do
    if r.dropped then
      rep.dropped = rep.dropped + 1
      rep.dropped_by = rep.dropped_by or {}
      rep.dropped_by[r.dropped] = (rep.dropped_by[r.dropped] or 0) + 1
      rep.first_drop = rep.first_drop or (tostring(r.dropped) .. ": " .. tostring(r.error))
    else
      rep.conversations = rep.conversations + 1
      local g = group(r.sample.task)
      g.task_metric = g.task_metric or r.sample.task_metric
      for _, q in ipairs(M.QUANTITIES) do
        local v = r[q]
        if v == nil or reward.is_failed(v) then
          if v ~= nil then rep.failed[q] = (rep.failed[q] or 0) + 1 end
        else
          g[q][#g[q] + 1] = v
          all[q][#all[q] + 1] = v
        end
      end
    end
  end
  local metrics_seen = {}
  for _, name in ipairs(order) do
    if name ~= "overall" and groups[name].task_metric then metrics_seen[groups[name].task_metric] = true end
  end
  local only = next(metrics_seen)
  if only and next(metrics_seen, only) == nil then all.task_metric = only end   -- else "mixed"
  for _, name in ipairs(order) do
    local g, out = groups[name], {}
    for _, q in ipairs(M.QUANTITIES) do out[q] = M.mean_se(g[q]) end
    out.task_metric = g.task_metric
    if name == "overall" then rep.overall = out else rep.tasks[name] = out end
  end
  rep.task_order = {}
  for _, name in ipairs(order) do if name ~= "overall" then rep.task_order[#rep.task_order + 1] = name end end
  table.sort(rep.task_order)
  return rep
end

-- The printed table: one line per task and the overall line.
function M.print_table(rep, itr_metric)
  local function cell(s, digits)
    if not s or not s.mean then return ("%19s"):format("-") end
    return ("%9." .. digits .. "f ± %7." .. digits .. "f"):format(s.mean, s.se)
  end
  print(("%-26s %5s  %-12s %19s  %19s  %19s"):format("task", "n", "metric", "performance", "ITR (" .. itr_metric .. ")",
    "tokens read (k)"))
  local function line(name, t)
    print(("%-26s %5d  %-12s %s  %s  %s"):format(name, t.messages.n or 0, t.task_metric or "mixed",
      cell(t.task_performance, 4), cell(t.itr, 4), cell(t.tokens_read_k, 4)))
  end
  for _, name in ipairs(rep.task_order) do line(name, rep.tasks[name]) end
  line("overall", rep.overall)
end

return M
