-- clrt.train.report — what an RL step and run print and log: the metrics.jsonl row of a
-- step (reward, losses, timings, request counts, API tokens and dollars) and the before/after table at the end.
local M = {}

-- The step's row. timing: generate_first_s, rollout_s, prefill_s, decode_s, wait_http_s; t0/t1/t2: step start, rollouts
-- done, update done (clrt.log.now). ctx.counters and clrt.llm's records are read and reset.
function M.step_row(entries, R, astats, st, lr, timing, t0, t1, t2, ctx)
  local reward = require("clrt.train.reward")
  local gen_tokens, asks, firsts, invalid = 0, 0, 0, 0
  for _, e in ipairs(entries) do
    gen_tokens = gen_tokens + #e.tokens
    firsts = firsts + 1
    if e.message.content:find("?", 1, true) then asks = asks + 1 end
    if e.invalid then invalid = invalid + 1 end
  end
  local row = {
    reward = reward.stats(R.rewards, #entries).mean, advantage_std = astats.std, advantage_max = astats.max,
    -- truncated: cut at the length limit; invalid: ended but malformed (both rollout.cutoff_reward)
    dropped = R.dropped, truncated = R.truncated - invalid, invalid = invalid, lr = lr, kl = st.kl, loss = st.loss, pg_loss = st.pg_loss,
    clipfrac = st.clipfrac, grad_norm = st.grad_norm, trained_tokens = st.tokens,
    -- rollout.quant=int8: the rollout/train mismatch and truncated importance sampling's weight
    ["tis/weight_mean"] = st.tis_weight, ["tis/capped"] = st.tis_capped, ["tis/logp_mismatch"] = st.logp_mismatch,
    -- and (train.async too) KL(pi_rollout || pi_old) on the trained tokens, sequences masked
    ["tis/mismatch_kl"] = st.mismatch_kl, ["tis/seq_masked"] = st.seq_masked,
    first_reply_ask_rate = firsts > 0 and asks / firsts or 0,
    time_generate_first_s = timing.generate_first_s, time_rollout_s = timing.rollout_s,
    time_update_s = t2 - t1, time_step_s = t2 - t0, prefix_cache_hit_rate = timing.prefix_cache_hit_rate,
    -- the rollouts' time in the policy's prefills and decode steps, and waiting on HTTP with
    -- no engine work (the rest of time_generate_first_s + time_rollout_s: Lua, rendering, metrics)
    time_prefill_s = timing.prefill_s, time_decode_s = timing.decode_s, time_wait_http_s = timing.wait_http_s,
    -- the update's matrix products (forward and backward, old and reference log-probs
    -- included) and the rest of it: attention, norms, the optimizer step, Lua
    time_update_products_s = timing.update_products_s,
    time_update_outside_products_s = timing.update_products_s and (t2 - t1) - timing.update_products_s or nil,
    tokens_per_s = gen_tokens / math.max(1e-9, t1 - t0),
  }
  for name, v in pairs(R.metrics or {}) do row["metric/" .. name] = v end
  for name, n in pairs(R.failed or {}) do row["failed/" .. name] = n end
  -- requests per LLM-judged score and per simulated user turn (parse retries included;
  -- transport retries are in http_attempts)
  local cnt = ctx.counters or {}
  if (cnt.judge_calls or 0) > 0 then row.judge_attempts_per_score = cnt.judge_attempts / cnt.judge_calls end
  if (cnt.user_calls or 0) > 0 then row.user_attempts_per_turn = cnt.user_attempts / cnt.user_calls end
  row.judge_failures, row.user_failures = cnt.judge_failures, cnt.user_failures
  for k, n in pairs(cnt) do   -- a user model's outcomes (user_lm: too_long, empty, ended_at_open, ended)
    if k:find("^user_lm/") then row[k] = n end
  end
  -- programs the metrics ran (pass_rate's tests) and the seconds they took, summed: they
  -- run beside decoding, so this can exceed the step's time
  row.tests_run, row.time_tests_s = cnt.pass_rate_programs, cnt.pass_rate_seconds
  if cnt.pass_rate_programs then row.engine_steps_during_tests = timing.engine_steps_during_tests end
  -- programs the harness caught forging a pass, and those that met a missing module (an
  -- environment error, not a wrong answer); rows left out because their modules are missing
  row["pass_rate/tampered"], row["pass_rate/env_errors"] = cnt.pass_rate_tampered, cnt.pass_rate_env_errors
  for k in pairs(cnt) do cnt[k] = nil end
  local calls = require("clrt.llm").drain_records()
  if #calls > 0 then
    local lat, attempts, failed = 0, 0, 0
    for _, c in ipairs(calls) do
      lat, attempts = lat + (c.latency or 0), attempts + (c.attempts or 1)
      if not c.ok then failed = failed + 1 end
    end
    row.http_calls, row.http_attempts, row.http_failed = #calls, attempts, failed
    row.http_latency_mean_s = lat / #calls
  end
  -- tokens and dollars per role, the step's and the run's (clrt.api.usage)
  if ctx.spend and (#calls > 0 or ctx.spend.total.all.calls > 0) then ctx.spend:row(ctx.spend:add(calls), row) end
  return row
end

-- Up to four of a step's entries for the samples log: the first response of each of the
-- first four prompts (groups), each once; a step with fewer prompts gives fewer items.
-- The whole step (every response and future) is rollouts.jsonl's (clrt.train.rollouts_log).
function M.sample_items(entries, n)
  local items, seen = {}, {}
  for _, e in ipairs(entries) do
    if #items >= 4 then break end
    if not seen[e.group] then
      seen[e.group] = true
      items[#items + 1] = { id = e.sample.id, conversation = e.convs[1] or require("clrt.train.rollout").copy_conv(e.sample.prompt, e.message),
        scores = e.scores[1], reward = e.reward, advantage = e.advantage }
    end
  end
  return items
end

-- The before/after tables of summary.json on stdout.
function M.print_summary(summary, cfg, weights)
  local function table_of(title, before, after, keys)
    print(("%-26s %10s %10s"):format(title, "before", "after"))
    for _, k in ipairs(keys) do
      local b, a = before and before[k], after and after[k]
      print(("%-26s %10s %10s"):format(k, b and ("%.3f"):format(b) or "-", a and ("%.3f"):format(a) or "-"))
    end
  end
  if summary.before or summary.after then
    table_of("held-out evaluation", summary.before, summary.after, { "accuracy_underspecified",
      "accuracy_specified", "ask_rate_underspecified", "ask_rate_specified", "tokens_per_conversation" })
  end
  if summary.val_before or summary.val_after then
    local b, a = summary.val_before or {}, summary.val_after or {}
    local keys, flat_b, flat_a = {}, {}, {}
    for name in pairs(weights) do keys[#keys + 1] = name end
    table.sort(keys)
    for _, k in ipairs(keys) do flat_b[k], flat_a[k] = (b.metrics or {})[k], (a.metrics or {})[k] end
    for _, k in ipairs({ "first_reply_ask_rate", "tokens_per_conversation" }) do
      keys[#keys + 1] = k
      flat_b[k], flat_a[k] = b[k], a[k]
    end
    table_of("validation (" .. tostring(cfg.data_val) .. ")", flat_b, flat_a, keys)
  end
end

return M
