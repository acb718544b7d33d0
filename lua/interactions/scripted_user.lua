-- scripted_user — the simulated user of the built-in world (examples/collab_world), in
-- plain Lua: no API, deterministic. It knows the sample's hidden fact (`sample.value`)
-- and reacts to the assistant's last message (an empty chat: it opens with its request):
--   a question about the missing fact   -> the fact, e.g. "Alice."
--   a question about a fact already given -> "I already told you." (no new information)
--   any other question                  -> "That is not relevant."
--   anything else (an answer)           -> the termination marker ("[[TERMINATE CHAT]]",
--                                          or ctx.terminate_marker): the user is done, whether
--                                          the answer is right or not (the metrics judge it)
-- A question is about the fact when it contains the sample's clarifying question
-- (`sample.ask`) or one of `sample.slot_keywords` as a whole word.
-- The sample's own fields win; a row read from a data set (process_dataset's RL rows, made by
-- recipes/build_dataset.lua from the world's tasks) carries them in single_turn_metadata.
-- Plug-in shape (same as metrics): respond(conversation, sample, ctx) -> text.
local conv = require("clrt.conversation")

local M = { name = "scripted_user" }

M.HIDDEN = { "value", "ask", "slot_keywords", "underspecified", "opening" }

-- The sample with what the user knows: its own fields, else those of single_turn_metadata.
function M.knows(sample)
  local meta = type(sample.single_turn_metadata) == "table" and sample.single_turn_metadata or nil
  if not meta then return sample end
  local missing = false
  for _, k in ipairs(M.HIDDEN) do if sample[k] == nil and meta[k] ~= nil then missing = true end end
  if not missing then return sample end
  local out = setmetatable({}, { __index = sample })
  for _, k in ipairs(M.HIDDEN) do if sample[k] == nil then out[k] = meta[k] end end
  return out
end

M.TERMINATE = conv.TERMINATE
M.IRRELEVANT = "That is not relevant."
M.ALREADY_SAID = "I already told you."

function M.is_question(text) return type(text) == "string" and text:find("?", 1, true) ~= nil end

function M.relevant(sample, question)
  local q = tostring(question):lower()
  if sample.ask and q:find(sample.ask:lower(), 1, true) then return true end
  for _, k in ipairs(sample.slot_keywords or {}) do
    if q:find("%f[%a]" .. k:lower() .. "%f[%A]") then return true end
  end
  return false
end

-- A question about a fact the request already gave gets no new information: like a real
-- user, this one only points back at what it said, so the question was pure cost.
function M.reply_to_question(sample, question)
  if not M.relevant(sample, question) then return M.IRRELEVANT end
  if sample.underspecified == false then return M.ALREADY_SAID end
  return sample.value .. "."
end

-- An empty chat (nothing but a system message; the paper's evaluation starts there): the
-- user opens with its request, sample.opening (the world's phrasing, under-specified or not),
-- else sample.single_turn_prompt.
function M.opening(sample)
  local text = sample.opening or sample.single_turn_prompt
  if type(text) ~= "string" or text == "" then
    error("scripted_user: an empty chat needs sample.opening or sample.single_turn_prompt to open it", 2)
  end
  return text
end

-- The second value says which rule answered, as an LLM user's "thought" would (the run's
-- rollouts.jsonl shows it beside the user's turn; it is never part of the conversation).
function M.respond(conversation, sample, ctx)
  sample = M.knows(sample)
  if #conv.without_system(conversation) == 0 then return M.opening(sample), { thought = "opens with its request" } end
  local last = conversation[#conversation]
  if not last or last.role ~= "assistant" then
    error("scripted_user: the conversation must end with an assistant message", 2)
  end
  if sample.value == nil then error("scripted_user: sample has no hidden value (sample.value)", 2) end
  if M.is_question(last.content) then
    local reply = M.reply_to_question(sample, last.content)
    local why = reply == M.IRRELEVANT and "the question is not about the missing fact"
      or reply == M.ALREADY_SAID and "the request already gave this fact"
      or "the question asks for the missing fact: gives it"
    return reply, { thought = why }
  end
  return conv.marker(ctx, sample), { thought = "the assistant answered: the user is done" }
end

return M
