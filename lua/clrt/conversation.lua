-- clrt.conversation — small helpers over chat message lists ({role=, content=} tables)
-- shared by metrics, simulated users and recipes, so every plug-in agrees on where the
-- prompt ends and what "the final answer" is.
--
-- Convention: a metric or user gets the whole conversation (system + prompt + the first
-- response A1 + the future turns) and the sample, whose `prompt` is the prompt's message
-- list as the policy saw it (with its system message when there is one). The messages
-- after the prompt are conversation[#sample.prompt + 1 ...]. Without sample.prompt the
-- prompt is taken to end at the first assistant message.
local M = {}

-- The default termination marker. A run picks its own with sim_cfg.terminate_marker, which
-- reaches users and the rollout as ctx.terminate_marker (a sample may carry its own).
M.TERMINATE = "[[TERMINATE CHAT]]"

-- The marker that ends this conversation: sample.terminate_marker, else
-- ctx.terminate_marker, else M.TERMINATE.
function M.marker(ctx, sample)
  local m = (type(sample) == "table" and sample.terminate_marker) or (type(ctx) == "table" and ctx.terminate_marker)
  if type(m) == "string" and m ~= "" then return m end
  return M.TERMINATE
end

function M.prompt_length(conversation, sample)
  if sample and type(sample.prompt) == "table" then return #sample.prompt end
  for i, m in ipairs(conversation) do
    if m.role == "assistant" then return i - 1 end
  end
  return #conversation
end

function M.after_prompt(conversation, sample)
  local out = {}
  for i = M.prompt_length(conversation, sample) + 1, #conversation do out[#out + 1] = conversation[i] end
  return out
end

-- The first assistant message after the prompt (A1), or nil.
function M.first_reply(conversation, sample)
  for i = M.prompt_length(conversation, sample) + 1, #conversation do
    if conversation[i].role == "assistant" then return conversation[i].content end
  end
  return nil
end

-- The last assistant message after the prompt, or nil.
function M.last_reply(conversation, sample)
  local start = M.prompt_length(conversation, sample) + 1
  for i = #conversation, start, -1 do
    if conversation[i].role == "assistant" then return conversation[i].content end
  end
  return nil
end

function M.without_system(conversation)
  local out = {}
  for _, m in ipairs(conversation) do
    if m.role ~= "system" then out[#out + 1] = m end
  end
  return out
end

-- The {chat_history} of a prompt as both references format it (verl's parse_messages, the
-- authors' collabllm.utils.template.parse_messages): the system message left out, each
-- message "**Role**: content" with the role capitalised, one newline between messages.
function M.chat_history(messages)
  local out = {}
  for _, m in ipairs(messages) do
    if m.role ~= "system" then
      local role = tostring(m.role or "")
      out[#out + 1] = ("**%s**: %s"):format(role:sub(1, 1):upper() .. role:sub(2):lower(), tostring(m.content or ""))
    end
  end
  return table.concat(out, "\n")
end

-- A plain-text transcript for judge and simulator prompts.
function M.transcript(messages, names)
  names = names or { user = "User", assistant = "Assistant", system = "System" }
  local out = {}
  for _, m in ipairs(messages) do
    out[#out + 1] = ("%s: %s"):format(names[m.role] or m.role, tostring(m.content or ""))
  end
  return table.concat(out, "\n\n")
end

-- Does a user message contain the marker (marker: from M.marker; default M.TERMINATE)?
function M.has_marker(text, marker)
  return type(text) == "string" and text:find(marker or M.TERMINATE, 1, true) ~= nil
end

local function count_plain(s, pat)
  local n, i = 0, 1
  while true do
    local a, b = s:find(pat, i, true)
    if not a then return n end
    n, i = n + 1, b + 1
  end
end

-- A policy reply split into what the user sees and its hidden reasoning, with verl's
-- validity rule for a first response (is_valid_messages): non-empty after trimming; at most
-- one <think>...</think> block, balanced (one open before one close) and non-empty; and
-- non-empty visible text once the block is removed.
-- Returns visible (the text itself without a block; else trimmed, without the block),
-- reasoning (nil without a block),
-- ok, why (the rule broken, when not ok). An invalid reply still gets its best visible text.
function M.split_think(text)
  text = tostring(text or "")
  local opens, closes = count_plain(text, "<think>"), count_plain(text, "</think>")
  if opens == 0 and closes == 0 then   -- no block: the text as it is
    if M.trim(text) == "" then return text, nil, false, "empty reply" end
    return text, nil, true
  end
  local a, b = text:find("<think>", 1, true)
  local c, d = text:find("</think>", 1, true)
  if opens ~= 1 or closes ~= 1 or not a or not c or c < b then
    local tail = c and text:sub(d + 1) or (a and text:sub(1, a - 1)) or text
    return M.trim((tail:gsub("</?think>", ""))), nil, false,
      ("unbalanced or repeated think block (%d <think>, %d </think>)"):format(opens, closes)
  end
  local reasoning = M.trim(text:sub(b + 1, c - 1))
  local visible = M.trim(text:sub(1, a - 1) .. text:sub(d + 1))
  if reasoning == "" then return visible, reasoning, false, "empty think block" end
  if visible == "" then return visible, reasoning, false, "no visible text after the think block" end
  return visible, reasoning, true
end

-- Whitespace-split words (verl's token_amount unit).
function M.word_count(text)
  local n = 0
  for _ in tostring(text or ""):gmatch("%S+") do n = n + 1 end
  return n
end

-- Heuristic: does an assistant message ask the user something? A question mark outside a
-- fenced code block. Used for the "first replies that ask" rate of the evaluation; the
-- built-in world's replies are short, so this is exact there.
function M.asks_question(text)
  if type(text) ~= "string" then return false end
  local prose = text:gsub("```.-```", " ")
  return prose:find("?", 1, true) ~= nil
end

function M.trim(s) return (tostring(s or ""):gsub("^%s+", ""):gsub("%s+$", "")) end

function M.copy(conversation)
  local out = {}
  for i, m in ipairs(conversation) do
    local c = {}
    for k, v in pairs(m) do c[k] = v end
    out[i] = c
  end
  return out
end

return M
