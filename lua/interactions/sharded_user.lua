-- sharded_user — Lost in Conversation's simulated user (arXiv 2505.06120; the authors'
-- user_agent.py): it holds a task's shards and reveals them to the assistant one per turn,
-- never the whole task at once. collabllm_eval.lua protocol=sharded runs it
-- (clrt.train.sharded_eval); the sample it gets is one conversation's view of the task:
--   sample.shards     {{id, text}, ...}; the first is the high-level intent
--   sample.revealed   {shard id = true} for the shards out so far (the protocol records each
--                     id this plug-in returns; nothing is shared between conversations)
--   sample.user_voice "scripted" for tasks whose user is a script (data2text, translation,
--                     the built-in world), else ctx.sharded_voice
--   sample.scripted_turn(k, shard)  (optional) the k-th scripted message for a shard
-- respond(conversation, sample, ctx, turn) -> message, {shard_id = the id revealed or -1,
-- thought}. Its first message is always the first shard as it is (the authors' user opens so).
-- Later turns, by voice (ctx.sharded_voice, from sim=):
--   llm       (sim=llm, any OpenAI-compatible endpoint: ctx.user) the prompt
--             lua/prompts/sharded_user.txt shows the chat, the shards out and the shards not
--             yet out (never the reference, the tests or the original instruction); the model
--             picks the shard that fits the conversation, or none, rephrases it and answers
--             JSON {"thought", "response", "shard_id"}. A reply whose shard_id is not -1 or a
--             shard still hidden, or whose response is empty, is asked again parse_retries
--             times, then this raises (the protocol drops the conversation and counts it).
--   user_lm   (sim=user_lm: a trained user model, lua/interactions/user_lm.lua) the next hidden
--             shard in the task's order is the only thing the model is given as its intent
--             (lua/prompts/sharded_user_lm_intent.txt, with the shards already out), so it
--             cannot give away more than that shard; it writes the message in its own words.
--   scripted  (sim=scripted, and the tasks above) the next hidden shard as it is, or as the
--             task frames it (sample.scripted_turn): the authors' user for data2text and
--             translation, and the built-in world's.
local conv = require("clrt.conversation")
local json = require("clrt.json")
local llm_reply = require("clrt.llm_reply")
local pf = require("clrt.prompt_file")

local M = { name = "sharded_user", uses_llm = true }   -- uses_llm: clrt.train.context builds ctx.user
M.PROMPT_FILE = "sharded_user"
M.INTENT_FILE = "sharded_user_lm_intent"
M.VOICES = { llm = true, user_lm = true, scripted = true }

-- The shards out so far and those still hidden, in the task's order; the first shard (the
-- opening) is neither: it is always out and is in the chat.
function M.split(sample)
  local out, hidden = {}, {}
  for i, s in ipairs(sample.shards) do
    if i > 1 then
      if sample.revealed[s.id] then out[#out + 1] = s else hidden[#hidden + 1] = s end
    end
  end
  return out, hidden
end

local function as_json(list)
  local items = {}
  for i, s in ipairs(list) do items[i] = { shard_id = s.id, shard = s.text } end
  return json.encode(json.array(items))
end

-- The messages sent for the next turn in the llm voice.
function M.messages(conversation, sample, ctx)
  local file = (ctx and ctx.user_options and ctx.user_options.prompt_file) or M.PROMPT_FILE
  local out, hidden = M.split(sample)
  local text = pf.fill(pf.read(file), { chat_history = conv.chat_history(conversation),
    shards_revealed = as_json(out), shards_hidden = as_json(hidden) }, file)
  return { { role = "user", content = text } }
end

M.SCHEMA = {
  type = "object", additionalProperties = false,
  properties = { thought = { type = "string" }, response = { type = "string", minLength = 1 }, shard_id = { type = "integer" } },
  required = { "thought", "response", "shard_id" }, propertyOrdering = { "thought", "response", "shard_id" },
}

-- A parsed reply's message and shard id, or nil and why it cannot be used.
function M.check_reply(obj, sample)
  local text = llm_reply.text(obj.response)
  if text == nil or conv.trim(text) == "" then return nil, "reply has no \"response\" text" end
  local id = tonumber(obj.shard_id)
  if id == nil or id % 1 ~= 0 then return nil, "shard_id is not a whole number: " .. tostring(obj.shard_id) end
  if id ~= -1 then
    local _, hidden = M.split(sample)
    local ok = false
    for _, s in ipairs(hidden) do ok = ok or s.id == id end
    if not ok then return nil, ("shard_id %d is not a shard still hidden"):format(id) end
  end
  return { text = conv.trim(text), shard_id = id }
end

local function llm_voice(conversation, sample, ctx)
  local client = ctx and ctx.user
  if not client then error("sharded_user: no client in ctx.user (sim=llm needs sim_cfg's endpoint)", 0) end
  local o = ctx.user_options or {}
  local req = { temperature = o.temperature or 1.0, max_tokens = o.max_tokens or 512, top_p = o.top_p }
  if o.response_format then
    req.response_format = { type = "json_schema", json_schema = { name = "sharded_user", schema = M.SCHEMA } }
  end
  local got, obj = llm_reply.ask_json(client, M.messages(conversation, sample, ctx), req,
    function(r) return M.check_reply(r, sample) end,
    { parse_retries = o.parse_retries == nil and 1 or o.parse_retries, extract_json = ctx.extract_json,
      what = "sharded_user", counters = ctx.counters, counter = "user" })
  return got.text, { shard_id = got.shard_id, thought = llm_reply.text(obj.thought) }
end

local function user_lm_voice(conversation, sample, ctx, turn)
  local out, hidden = M.split(sample)
  local next_shard = hidden[1]
  local told = {}
  for i, s in ipairs({ sample.shards[1], unpack(out) }) do told[i] = "- " .. s.text end
  local intent = pf.fill(pf.read(M.INTENT_FILE), { shards_revealed = table.concat(told, "\n"), next_shard = next_shard.text },
    M.INTENT_FILE)
  -- user_lm reads its intent from the field sim_cfg.intent_field names: here, this one
  local o = {}
  for k, v in pairs(ctx.user_options or {}) do o[k] = v end
  o.intent_field = "sharded_intent"
  local uctx = setmetatable({ user_options = o }, { __index = ctx })
  local text = require("interactions.user_lm").respond(conversation, { sharded_intent = intent }, uctx, turn)
  return text, { shard_id = next_shard.id, thought = "user_lm, given shard " .. next_shard.id }
end

local function scripted_voice(sample)
  local _, hidden = M.split(sample)
  local s = hidden[1]
  local k = #sample.shards - #hidden + 1
  local text = sample.scripted_turn and sample.scripted_turn(k, s) or s.text
  return text, { shard_id = s.id, thought = "the next shard as it is" }
end

function M.respond(conversation, sample, ctx, turn)
  if type(sample.shards) ~= "table" or type(sample.revealed) ~= "table" then
    error("sharded_user: the sample has no shards or revealed set (collabllm_eval protocol=sharded runs this user)", 0)
  end
  local first = sample.shards[1]
  if #conv.without_system(conversation) == 0 then
    local text = sample.scripted_turn and sample.user_voice == "scripted" and sample.scripted_turn(1, first) or first.text
    return text, { shard_id = first.id, thought = "opens with the first shard" }
  end
  local _, hidden = M.split(sample)
  if #hidden == 0 then error("sharded_user: every shard is out; nothing is left to say", 0) end
  local voice = sample.user_voice or (ctx and ctx.sharded_voice) or "llm"
  if voice == "scripted" then return scripted_voice(sample) end
  if voice == "user_lm" then return user_lm_voice(conversation, sample, ctx, turn) end
  if voice ~= "llm" then error("sharded_user: unknown voice " .. tostring(voice) .. " (llm, user_lm or scripted)", 0) end
  return llm_voice(conversation, sample, ctx)
end

return M
