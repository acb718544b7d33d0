-- clrt.train.validation — how a policy does on held-out prompts, with the simulated user
-- as in training: greedy conversations on a world's evaluation prompts (evaluate: the
-- world's own numbers) and on dataset prompts (validate: every metric, the data_val= of a
-- training run and collabllm_eval.lua's protocol=prefix).
--   local numbers, results = validation.evaluate(m, tok, cfg, world, user, ctx)
--   local rep, results = validation.validate(m, tok, cfg, samples, user, ctx, metrics)
--   validation.val_row(rep, row)   -- rep as metrics.jsonl fields (val/<metric>, ...)
local conversation = require("clrt.conversation")
local sched = require("clrt.sched")
local policy_mod = require("clrt.train.policy")
local reward = require("clrt.train.reward")
local rollout = require("clrt.train.rollout")
local M = {}

-- Greedy conversations with the world's user on held-out prompts -> world.summarize numbers.
function M.evaluate(m, tok, cfg, world, user, ctx)
  local samples = world.eval_prompts(cfg.eval.prompts, cfg.eval.seed)
  local ecfg = { rollout = {}, seed = cfg.seed }
  for k, v in pairs(cfg.rollout) do ecfg.rollout[k] = v end
  ecfg.rollout.temperature = cfg.eval.temperature
  ecfg.rollout.future_temperature = cfg.eval.temperature
  local policy = policy_mod.new(m, tok, ecfg, cfg.eval.seed)
  local fns = {}
  for i, s in ipairs(samples) do
    fns[i] = function()
      local key = ("eval/prompt %d"):format(i)
      local first = policy(s.prompt, s, key .. "/first")
      local conv = rollout.copy_conv(s.prompt, first or "")
      local c = rollout.conversation(conv, policy, user, s, ctx, { max_user_turns = cfg.rollout.max_user_turns,
        max_assistant_turns = cfg.rollout.max_assistant_turns, keep_last_assistant = true, seed_key = key })
      return { sample = s, conversation = c or conv }
    end
  end
  local results, errs = sched.run(fns, { progress = "evaluation: conversations" })
  for i in pairs(errs) do
    error(("%s: evaluation conversation %d failed: %s"):format(ctx and ctx.who or "clrt.train.validation", i, errs[i]), 0)
  end
  return world.summarize(results), results
end

-- Validation on dataset samples (data_val= during RL, and collabllm_eval.lua): a greedy
-- first response, futures with the simulated user as in training, every metric in
-- `metrics`. cfg: rollout, chat, eval.temperature. Returns a report {conversations,
-- dropped, invalid, failed = {metric = n}, metrics = {metric = mean}, first_reply_ask_rate,
-- tokens_per_conversation (words after the prompt)} and the per-sample results.
function M.validate(m, tok, cfg, samples, user, ctx, metrics)
  local ecfg = { rollout = {}, chat = cfg.chat }
  for k, v in pairs(cfg.rollout) do ecfg.rollout[k] = v end
  ecfg.rollout.temperature, ecfg.rollout.future_temperature = cfg.eval.temperature, cfg.eval.temperature
  local policy = policy_mod.new(m, tok, ecfg, cfg.eval.seed or 0)
  local fns = {}
  for i, s in ipairs(samples) do
    fns[i] = function()
      local key = ("val/prompt %d"):format(i)
      local first, ntok, finish = policy(s.prompt, s, key .. "/first")
      if first == nil then return { sample = s, invalid = "prompt leaves no room for a reply" } end
      local _, ok, why = policy_mod.reply_message(ecfg, first.content or "")
      local conv = rollout.copy_conv(s.prompt, first)
      if finish ~= "stop" or not ok then
        return { sample = s, conversation = conv, invalid = (finish ~= "stop") and "first reply cut at the length limit" or why }
      end
      local c, info = rollout.conversation(conv, policy, user, s, ctx, rollout.rollout_opts(ecfg, tok, ntok, key))
      if not c then return { sample = s, dropped = info.dropped, error = info.error } end
      return { sample = s, conversation = c, scores = reward.score_conversation(c, s, metrics, ctx) }
    end
  end
  local results, errs = sched.run(fns, { progress = "validation: conversations" })
  local rep = { conversations = 0, dropped = 0, invalid = 0, failed = {}, metrics = {} }
  local sums, counts, asks, words = {}, {}, 0, 0
  for i = 1, #samples do
    local r = results[i]
    if errs[i] or not r or r.dropped then
      rep.dropped = rep.dropped + 1
      rep.first_drop = rep.first_drop or tostring(errs[i] or (r.dropped .. ": " .. tostring(r.error)))
    else
      rep.conversations = rep.conversations + 1
      if r.invalid then rep.invalid = rep.invalid + 1 end
      for _, mt in ipairs(metrics) do
        -- an invalid first reply scores 0 on every metric, as it earns reward 0 in training
        local v = r.scores and r.scores[mt.name] or 0
        if reward.is_failed(v) then rep.failed[mt.name] = (rep.failed[mt.name] or 0) + 1
        else sums[mt.name] = (sums[mt.name] or 0) + v; counts[mt.name] = (counts[mt.name] or 0) + 1 end
      end
      local first = conversation.first_reply(r.conversation, r.sample)
      if first and conversation.asks_question(first) then asks = asks + 1 end
      for _, msg in ipairs(conversation.after_prompt(r.conversation, r.sample)) do
        words = words + conversation.word_count(msg.content)
      end
    end
  end
  for name, n in pairs(counts) do rep.metrics[name] = sums[name] / n end
  local n = math.max(rep.conversations, 1)
  rep.first_reply_ask_rate, rep.tokens_per_conversation = asks / n, words / n
  return rep, results
end

-- A validation report as metrics.jsonl fields: val/<metric>, val/failed/<metric>, ...
function M.val_row(rep, row)
  for name, v in pairs(rep.metrics) do row["val/" .. name] = v end
  for name, v in pairs(rep.failed) do row["val/failed/" .. name] = v end
  row["val/first_reply_ask_rate"] = rep.first_reply_ask_rate
  row["val/tokens_per_conversation"] = rep.tokens_per_conversation
  row["val/dropped"], row["val/invalid"] = rep.dropped, rep.invalid
  return row
end

return M
