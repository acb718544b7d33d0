-- user_lm — a trained user model plays the human (spec: "User models (since the paper)"):
-- UserLM-8b, or a simulator trained with recipes/collabllm_user_sft.lua, served by any
-- OpenAI-compatible endpoint (clrt serve, vLLM). sim=user_lm; the endpoint is sim_cfg's.
-- respond(conversation, sample, ctx, turn) -> the user's next message (never empty).
--
-- What the endpoint is sent (UserLM-8b's model card): the task intent as the system message
-- (sample[sim_cfg.intent_field], single_turn_prompt by default; "a.b" names a nested
-- field), then the chat with the roles as the simulator sees them: the policy's turns as "user" (the other party), the
-- simulated user's own earlier turns as "assistant" (an OpenAI-compatible reply is always the
-- "assistant" message; the served template may render them under other headers). The
-- policy's system prompt is never sent: the user does not see it. sim_cfg.flip_roles=false
-- sends the roles as they are, for an endpoint that flips them itself.
-- The reply is plain text, used as it is. The model's end-of-conversation marker
-- (sim_cfg.end_marker, "<|endconversation|>") ends the chat as CollabLLM's
-- [[TERMINATE CHAT]] does: the message becomes the text before it followed by the run's
-- terminate marker (clrt.conversation.marker), so the rollout, the metrics and the logs
-- read one marker whichever simulator spoke.
--
-- No prompt asks this model for CollabLLM's rules (never reveal the whole request at once,
-- no ground truth): they are what it was trained to do (docs/user_models.md).
--
-- Outcomes that are not a usable message, each counted in ctx.counters (a step's metrics row
-- shows them as user_lm/<what>) and none a crash:
--   empty      an empty reply (or whitespace): asked again parse_retries times, then the
--              sample is dropped (this raises; the rollout counts the drop)
--   too_long   a reply longer than sim_cfg.max_chars characters, or cut off at max_tokens
--              (finish_reason "length"): asked again, then dropped as above
--   ended_at_open  the model ends the chat before it began (only the marker where it should
--              open an empty chat): dropped, there is no conversation to score
--   ended      the chat ended by the marker (a normal outcome, counted for the record)
-- A request the endpoint refuses (a model it does not serve: 404 model_not_found) raises at
-- once with the server's message and drops the sample (user_failures counts it).
-- Reproducible: each request carries a seed hashed from the run's seed (ctx.seed) and the
-- turn's key (turn.seed_key, from clrt.train.rollout: step, prompt, response, future, turn),
-- so `clrt serve --deterministic` answers a rerun with the same tokens.
local conv = require("clrt.conversation")
local bit = require("bit")

local M = { name = "user_lm", uses_llm = true }   -- uses_llm: clrt.train.context builds ctx.user
M.END_MARKER = "<|endconversation|>"
M.INTENT_FIELD = "single_turn_prompt"

local function count(ctx, what)
  local c = ctx and ctx.counters
  if type(c) == "table" then c[what] = (c[what] or 0) + 1 end
end

-- A 31-bit seed from a run seed and a text key (clrt.rng.seed_of).
M.seed_of = require("clrt.rng").seed_of

-- The messages sent for the next user turn.
function M.messages(conversation, sample, o)
  o = o or {}
  local field = o.intent_field or M.INTENT_FIELD
  local intent = sample
  for k in field:gmatch("[^.]+") do intent = type(intent) == "table" and intent[k] or nil end   -- "a.b": a nested field
  if type(intent) ~= "string" or intent == "" then
    error(("user_lm: the sample has no intent text in \"%s\" (sim_cfg.intent_field)"):format(field), 0)
  end
  local flip = o.flip_roles ~= false
  local out = { { role = "system", content = intent } }
  for _, m in ipairs(conversation) do
    if m.role == "user" or m.role == "assistant" then
      local role = m.role
      if flip then role = role == "user" and "assistant" or "user" end
      out[#out + 1] = { role = role, content = tostring(m.content or "") }
    end
  end
  return out
end

-- The user's message from the model's text, or nil and what went wrong ("empty",
-- "ended_at_open"); ended is true when the marker ended the chat.
function M.message_of(text, marker, end_marker, opening)
  local s = tostring(text or "")
  local at = s:find(end_marker, 1, true)
  local ended = at ~= nil
  if ended then s = s:sub(1, at - 1) end
  s = conv.trim(s)
  if ended then
    if s == "" and opening then return nil, "ended_at_open" end
    return (s == "" and marker or s .. " " .. marker), nil, true
  end
  if s == "" then return nil, "empty" end
  return s
end

function M.respond(conversation, sample, ctx, turn)
  local client = ctx and (ctx.user or ctx.client)
  if not client then error("user_lm: no client in ctx.user", 0) end
  local o = ctx.user_options or {}
  local end_marker = o.end_marker or M.END_MARKER
  local opening = #conv.without_system(conversation) == 0
  local messages = M.messages(conversation, sample, o)
  local key = type(turn) == "table" and turn.seed_key or nil
  local retries = o.parse_retries == nil and 1 or o.parse_retries
  count(ctx, "user_calls")
  local last
  for attempt = 1, retries + 1 do
    count(ctx, "user_attempts")
    local req = { temperature = o.temperature or 1.0, max_tokens = o.max_tokens or 512, top_p = o.top_p }
    -- the retry of an unusable reply draws another sample: its own seed
    if key then req.seed = M.seed_of(ctx.seed, key .. (attempt > 1 and ("/retry " .. attempt) or "")) end
    if attempt > 1 then req.cache = "refresh" end
    local ok, reply = pcall(client.chat, client, messages, req)
    if not ok then
      count(ctx, "user_failures")
      error("user_lm: the request failed: " .. tostring(reply), 0)
    end
    local text = type(reply) == "table" and reply.content or nil
    if type(text) == "string" and (#text > (o.max_chars or math.huge) or reply.finish_reason == "length") then
      count(ctx, "user_lm/too_long")
      last = ("a reply longer than the cap (%d characters, finish_reason %s; sim_cfg.max_chars=%s, max_tokens=%d)")
        :format(#text, tostring(reply.finish_reason), tostring(o.max_chars), o.max_tokens or 512)
    else
      local msg, why, ended = M.message_of(text, conv.marker(ctx, sample), end_marker, opening)
      if msg then
        if ended then count(ctx, "user_lm/ended") end
        return msg, { thought = ended and ("the model ended the chat (" .. end_marker .. ")") or nil }
      end
      count(ctx, "user_lm/" .. why)
      if why == "ended_at_open" then
        count(ctx, "user_failures")
        error("user_lm: the model ended the chat before it began (only " .. end_marker .. " where it should open)", 0)
      end
      last = "an empty reply"
    end
  end
  count(ctx, "user_failures")
  error(("user_lm: no usable reply after %d attempts (%s)"):format(retries + 1, last), 0)
end

return M
