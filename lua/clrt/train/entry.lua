-- clrt.train.entry — the record of one first response of an RL step and what became of it.
-- clrt.train.rollout makes every entry with entry.new and fills in its futures; the recipe
-- sets its reward (and GRPO advantage); clrt.train.reward, report, ppo, ppo_value, dpo and
-- data_parallel read it. Fields:
--   group             index of its prompt in the step's samples (GRPO's group; a rank's
--                     groups are renumbered to the whole step's by data_parallel)
--   response          its index among its prompt's first responses (names its futures'
--                     random streams)
--   sample            the prompt's sample: {id, prompt = messages, ground_truth, ...}
--   prompt_ids        the rendered prompt's token ids
--   tokens            the first response's token ids
--   text              the first response as generated
--   message           the first response as the conversation keeps it ({role = "assistant",
--                     content, reasoning_content}: clrt.train.policy.reply_message)
--   logprobs_sampled  the sampler's log-probability of each token (nil on other ranks' entries)
--   logprobs_rollout  rollout.quant=int8: each token's temperature-1 log-probability under the
--                     int8 weights that sampled it (truncated importance sampling in
--                     clrt.train.ppo; carried to every rank), else nil
--   truncated         true when cut at the length limit, empty or malformed: it gets no
--                     futures and earns cutoff_reward
--   cutoff_reward     rollout.cutoff_reward when truncated, else nil
--   invalid           why a reply that stopped is malformed (verl's think-block rule), else nil
--   convs             the finished future conversations, one per future that ran
--   scores            {metric name = score} of each conversation in convs, in the same order
--   about             what else is known of each conversation in convs, in the same order
--                     (for rollouts.jsonl): {key, ended, user_turns, assistant_turns, tokens,
--                     metric_notes = {metric = {rationale, parts}}, user_notes, api = its bill}
--   dropped           why its futures were lost (the simulator failed, "error: ..."), else nil
--   drop_error        the first error message behind dropped
--   reward            the multiturn-aware reward (set by the recipe; nil: not scored)
--   advantage         the GRPO advantage (set by the recipe; nil under train.algorithm=ppo)
local json = require("clrt.json")
local M = {}

local REQUIRED = { group = "number", sample = "table", prompt_ids = "table", tokens = "table", text = "string",
  message = "table" }

-- A new entry from its first response; futures, scores and the reward come later.
function M.new(f)
  for k, kind in pairs(REQUIRED) do
    if type(f[k]) ~= kind then
      error(("clrt.train.entry.new: %s must be a %s, got %s"):format(k, kind, type(f[k])), 2)
    end
  end
  return { group = f.group, response = f.response, sample = f.sample, prompt_ids = f.prompt_ids, tokens = f.tokens, text = f.text,
    message = f.message, logprobs_sampled = f.logprobs_sampled, logprobs_rollout = f.logprobs_rollout,
    truncated = f.truncated == true,
    cutoff_reward = f.cutoff_reward, invalid = f.invalid, convs = {}, scores = {}, about = {} }
end

-- A future that finished: its conversation and scores.
function M.add_future(e, conv, scores, about)
  e.convs[#e.convs + 1] = conv
  e.scores[#e.scores + 1] = scores
  e.about[#e.convs] = about or {}
end

-- A future that was lost: dropped holds the latest reason, drop_error the first error.
function M.drop(e, reason, err)
  e.dropped = reason
  e.drop_error = e.drop_error or err
end

-- The entry as another data-parallel rank receives it (JSON-safe: no sample, which every
-- rank has; its group shifted by offset to the step's numbering).
function M.portable(e, offset)
  return { group = e.group + offset, response = e.response, prompt_ids = e.prompt_ids, tokens = e.tokens, text = e.text,
    message = e.message, truncated = e.truncated, invalid = e.invalid, scores = e.scores, convs = e.convs, about = e.about,
    dropped = e.dropped, drop_error = e.drop_error, cutoff_reward = e.cutoff_reward,
    logprobs_rollout = e.logprobs_rollout and json.array(e.logprobs_rollout) }
end

-- A portable entry back as an entry, with its sample.
function M.from_portable(p, sample)
  local e = M.new{ group = p.group, response = p.response, sample = sample, prompt_ids = p.prompt_ids, tokens = p.tokens, text = p.text,
    message = p.message, truncated = p.truncated, cutoff_reward = p.cutoff_reward, invalid = p.invalid,
    logprobs_rollout = p.logprobs_rollout }
  e.convs, e.scores, e.about = p.convs or {}, p.scores or {}, p.about or {}
  e.dropped, e.drop_error = p.dropped, p.drop_error
  return e
end

return M
