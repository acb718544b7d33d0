-- collabllm_user_sft.lua — train a simulated user (a user model, as UserLM-8b is) from
-- conversations, for sim=user_lm (lua/interactions/user_lm.lua, docs/user_models.md).
-- Each conversation is turned into the simulator's view of it:
--   system    the task intent (a row's single_turn_prompt, or intent_field=)
--   then the chat with the roles flipped: the user's turns become "assistant" (the loss falls
--   on them only, as collabllm_sft.lua puts it on every assistant message) and the
--   assistant's turns become "user"; the original system prompt is left out
--   the end marker (end_marker=, "<|endconversation|>") closes the conversation: a final
--   user turn holding only the marker after a closing assistant turn (the user's last turn
--   is then "I am done"), or appended to the last user turn when the chat ends with one
-- Sources (data=, JSONL):
--   the published CollabLLM rows (prompt, completion, conv_id, turn_id, score,
--   single_turn_prompt): per conv_id the row with the largest turn_id, then the best score
--   (process_dataset.lua's SFT rule), its prompt + completion, conditioned on single_turn_prompt
--   any JSONL of "messages" (WildChat-style) with the intent in the row's intent_field
--   (rows without one are left out and counted)
--   no data= and no model=: the built-in world's conversations (examples/collab_world)
-- drop_revealed=true (the default) leaves out conversations whose first user turn holds the
-- intent word for word (whitespace and case aside): trained on them the simulator learns to
-- paste the whole request at once, what CollabLLM's user must never do; the log counts them.
-- Everything else — trainer, LoRA (train.lora.r=...), bf16, mpirun data parallelism,
-- checkpoints, resume — is collabllm_sft.lua's, with its settings and their defaults.
--   clrt recipes/collabllm_user_sft.lua model=HF_DIR data=collabllm-multiturn-math-hard.jsonl
--   clrt recipes/collabllm_user_sft.lua                  # the built-in world's user model
-- Writes RUN_DIR/model, a Hugging Face folder for `clrt serve` (its template unchanged: the
-- flipped roles are in the data, so sim=user_lm's flipped request matches it).
local config = require("clrt.config")
local sft = require("recipes.collabllm_sft")
local WHO = "collabllm_user_sft"
local M = {}

M.END_MARKER = "<|endconversation|>"

do
  local d = {}
  for k, v in pairs(sft.defaults) do d[k] = v end
  d.name = WHO
  d.intent_field = "single_turn_prompt"   -- the row's field holding the intent (a messages row: its own field)
  d.end_marker = M.END_MARKER             -- closes each conversation (the marker sim=user_lm ends a chat on)
  d.drop_revealed = true                  -- leave out conversations whose first user turn holds the intent word for word
  M.defaults = d
end
M.rules = sft.rules
M.FIXED_ON_RESUME = { "intent_field", "end_marker", "drop_revealed" }
for _, k in ipairs(sft.FIXED_ON_RESUME) do M.FIXED_ON_RESUME[#M.FIXED_ON_RESUME + 1] = k end

local function squash(s) return (tostring(s):lower():gsub("%s+", " "):gsub("^ ", ""):gsub(" $", "")) end

-- Whether the first user turn holds the intent word for word.
function M.reveals(messages, intent)
  for _, m in ipairs(messages) do
    if m.role == "user" then return squash(m.content):find(squash(intent), 1, true) ~= nil end
  end
  return false
end

-- The simulator's view of one conversation (see the header), or nil when it has no user turn.
function M.flip(messages, intent, marker)
  local out = { { role = "system", content = intent } }
  for _, m in ipairs(messages) do
    if m.role == "user" then out[#out + 1] = { role = "assistant", content = m.content }
    elseif m.role == "assistant" then out[#out + 1] = { role = "user", content = m.content } end
  end
  local has_user = false
  for i = 2, #out do has_user = has_user or out[i].role == "assistant" end
  if not has_user then return nil end
  local last = out[#out]
  if last.role == "assistant" then
    last.content = last.content .. marker
  else
    out[#out + 1] = { role = "assistant", content = marker }
  end
  return out
end

-- {messages, intent} items from a data file: CollabLLM rows or "messages" rows.
function M.read_source(path, field)
  local data = require("clrt.data")
  local rows, line_of = data.read_dataset(path)
  local items, no_intent = {}, 0
  if rows[1] and type(rows[1]) == "table" and rows[1].messages == nil and rows[1].prompt ~= nil then
    local pd = require("recipes.process_dataset")
    local intent_of = {}
    for i, r in ipairs(rows) do
      if type(r.prompt) ~= "table" or type(r.completion) ~= "string" or r.conv_id == nil or type(r.turn_id) ~= "number" then
        error(("%s: %s:%d: a CollabLLM row needs prompt, completion, conv_id and turn_id"):format(WHO, path, line_of[i]), 0)
      end
      intent_of[tostring(r.conv_id)] = intent_of[tostring(r.conv_id)] or r[field]
    end
    for _, r in ipairs((pd.sft_rows(rows))) do
      local intent = intent_of[tostring(r.conv_id)]
      if type(intent) == "string" and intent ~= "" then items[#items + 1] = { messages = r.messages, intent = intent }
      else no_intent = no_intent + 1 end
    end
  else
    for _, r in ipairs(sft.read_conversations(path)) do
      local intent = r[field]
      if type(intent) == "string" and intent ~= "" then items[#items + 1] = { messages = r.messages, intent = intent }
      else no_intent = no_intent + 1 end
    end
  end
  return items, no_intent
end

-- The training conversations (collabllm_sft.lua's conversations hook).
function M.conversations(cfg)
  local items, no_intent
  if cfg.data then
    items, no_intent = M.read_source(cfg.data, cfg.intent_field)
  else
    items, no_intent = {}, 0
    for _, c in ipairs(sft.world().sft_conversations(cfg.world.conversations, cfg.seed,
        { p_ask_under = cfg.world.p_ask_under, p_ask_spec = cfg.world.p_ask_spec })) do
      items[#items + 1] = { messages = c.messages, intent = c.sample[cfg.intent_field] }
    end
  end
  local out, revealed, no_user = {}, 0, 0
  for _, it in ipairs(items) do
    if cfg.drop_revealed and M.reveals(it.messages, it.intent) then
      revealed = revealed + 1
    else
      local f = M.flip(it.messages, it.intent, cfg.end_marker)
      if f then out[#out + 1] = { messages = f } else no_user = no_user + 1 end
    end
  end
  local src = cfg.data or "the built-in world"
  io.stderr:write(("%s: %s: %d conversations; %d left out: the first user turn reveals the intent word for word (drop_revealed=%s); %d without an intent (%s); %d without a user turn\n")
    :format(WHO, src, #items + no_intent, revealed, tostring(cfg.drop_revealed), no_intent, cfg.intent_field, no_user))
  if #out == 0 then error(("%s: %s: no conversation left to train on"):format(WHO, src), 0) end
  return out
end

function M.main(cfg)
  if type(cfg.end_marker) ~= "string" or cfg.end_marker == "" then error(WHO .. ": end_marker must be a non-empty string", 0) end
  if type(cfg.intent_field) ~= "string" or cfg.intent_field == "" then error(WHO .. ": intent_field must be a field name", 0) end
  return sft.main(cfg, { conversations = M.conversations, script = "recipes/collabllm_user_sft.lua", who = WHO })
end

-- The built-in world's settings: examples/collab_world/config_user.lua over the `sft`
-- table of its config.lua.
function M.world_config()
  local world = sft.world()
  local c = {}
  for k, v in pairs(config.read_file(world.config_path()).sft or {}) do c[k] = v end
  for k, v in pairs(config.read_file(world.config_path("config_user"))) do c[k] = v end
  return c
end

function M.parse_args(argv)
  if config.arg_value(argv, "resume") then
    return require("clrt.run").resume_config(M.defaults, argv, M.FIXED_ON_RESUME, WHO)
  end
  local world = not config.arg_value(argv, "model") and not config.arg_value(argv, "config")
  return config.parse(M.defaults, argv, world and M.world_config() or nil)
end

local argv = { ... }
if argv[1] == "recipes.collabllm_user_sft" then return M end   -- required as a module
require("clrt.run").main(WHO, "recipes/collabllm_user_sft.lua", argv, M.parse_args, M.main)
