-- clrt.train.policy — the model as the rollouts see it: a conversation in, the next assistant
-- message out, through clrt.sched (so every policy turn in flight joins one batch).
--   local policy = policy_mod.new(m, tok, cfg, seed)   -- (conv, sample, key) -> message, ntok, finish_reason
--   policy_mod.context_len(m, cfg.rollout)             -- the context a rollout may fill
--   policy_mod.render_opts(cfg)                        -- options every render shares
--   policy_mod.reply_message(cfg, text)                -- a reply as the conversation keeps it
-- cfg: rollout (temperature, top_p, top_k, future_temperature, future_top_k, max_new_tokens, max_len,
-- max_prompt_len, token_budget), chat (enable_thinking, strip_think).
local chat = require("clrt.chat")
local conversation = require("clrt.conversation")
local sched = require("clrt.sched")
local M = {}

-- Context length: max_len, or the prompt limit plus the future budget, capped by the model.
function M.context_len(m, R)
  local want = R.max_len or ((R.max_prompt_len or 0) + (R.token_budget or R.max_new_tokens or 0))
  return math.min(want, m.config.max_position_embeddings or math.huge)
end

-- Render options every call shares (Qwen3's enable_thinking reaches each render).
function M.render_opts(cfg)
  local c = cfg.chat or {}
  return { add_generation_prompt = true, enable_thinking = c.enable_thinking }
end

-- A generated reply as the conversation keeps it: with chat.strip_think the visible text in
-- `content` and the think block in `reasoning_content` (the chat template renders it back
-- where the model's own template would); ok/why: verl's validity of a first response.
function M.reply_message(cfg, text)
  local visible, reasoning, ok, why = conversation.split_think(text)
  if cfg.chat and cfg.chat.strip_think == false then
    return { role = "assistant", content = text }, ok, why
  end
  return { role = "assistant", content = visible, reasoning_content = reasoning }, ok, why
end

-- The policy as clrt.train.rollout.conversation wants it: a conversation -> the next
-- assistant message, its token count and finish reason; nil when the context has no room.
function M.new(m, tok, cfg, seed)
  local stop = chat.stop_ids(tok)
  local R = cfg.rollout
  local temperature = R.future_temperature or R.temperature
  local top_k = R.future_top_k or R.top_k
  if top_k == 0 then top_k = nil end   -- 0: no cut, and the request the engine had before top_k existed
  local ctx_len = M.context_len(m, R)
  local ropts = M.render_opts(cfg)
  return function(conv, _, key)
    local ids = chat.render(tok, conv, ropts)
    local room = ctx_len - #ids
    if room < 1 then return nil, 0 end
    local out = sched.generate(m, ids, { n = 1, temperature = temperature, top_p = R.top_p, top_k = top_k,
      max_new_tokens = math.min(R.max_new_tokens, room), stop = stop, tokenizer = tok, seed = seed, seed_key = key })[1]
    return (M.reply_message(cfg, out.text or "")), #out.tokens, out.finish_reason
  end
end

return M
