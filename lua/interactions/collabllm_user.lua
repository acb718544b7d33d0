-- collabllm_user — an LLM plays the human, as in CollabLLM (spec: "The simulated user").
-- respond(conversation, sample, ctx) -> the user's next message (never empty).
--   sample.task_desc           e.g. "question answering", "document editing", "code generation"
--   sample.single_turn_prompt  the complete request the user has in mind
-- Both come from the sample of THIS conversation (no shared state between conversations);
-- the simulator never sees the ground truth.
-- ctx: the table clrt.train.context builds (fields documented there, once); used here:
-- user (ctx.client is accepted too), extract_json, user_options, terminate_marker, counters.
-- The model answers JSON {"current_answer", "thought", "response"}; only "response" is
-- sent. A "response" the lenient parser read as a number or boolean ("5" -> 5) is turned
-- back into its text ("5"). A reply that is not JSON, lacks "response" or has an empty one
-- is asked again parse_retries times (clrt.llm_reply: no back-off, transport retries are the
-- HTTP client's); then this raises, and the recipe drops the sample and counts it — the
-- conversation never continues with an empty user turn.
local conv = require("clrt.conversation")
local llm_reply = require("clrt.llm_reply")

local M = { name = "collabllm_user" }
M.TERMINATE = conv.TERMINATE

M.PROMPT = [[
You are role-playing a person who is working with an AI assistant to get something done. Everything you write goes straight to the assistant, as the person's next chat message.

What kind of task this is: %s

The complete request you have in mind (the assistant has NOT seen this; it only sees the chat):
<request>
%s
</request>

The chat so far:
<chat>
%s
</chat>

How to play the person:
- Stay in character as the person. Never mention that you are simulated, role-playing, or following instructions, and never act as the assistant.
- Put in little effort. Do not hand over the whole request at once: start vague and let the assistant find out what it needs by asking. Answer the questions it actually asks, briefly.
- Show the level of knowledge a real person asking this would have; you may be unsure, imprecise, or make an occasional small mistake.
- Say what you like and dislike about the assistant's answers, and keep steering it towards the request you have in mind; do not drift to other topics.
- Keep messages short and casual, as people type in a chat.
- When the assistant's answer gives you what you wanted, or it is clear the assistant cannot help, end the chat: make your message contain exactly %s (you may add a short goodbye before it).

Reply with JSON only, no other text:
{"current_answer": "<one sentence: the assistant's solution so far, or 'none yet'>", "thought": "<your reasoning as the person about what to say next>", "response": "<your next message to the assistant>"}]]

-- What the chat section says when nothing has been said yet (the paper's evaluation opens
-- every conversation there): the user writes the first message, as the authors' prompt asks.
M.EMPTY_CHAT = "(empty: nothing has been said yet, so you open the conversation with your first message)"

function M.messages(conversation, sample, ctx)
  local chat = conv.transcript(conv.without_system(conversation), { user = "You", assistant = "Assistant" })
  if chat == "" then chat = M.EMPTY_CHAT end
  local text = M.PROMPT:format(tostring(sample.task_desc or "general assistance"),
    tostring(sample.single_turn_prompt or ""), chat, conv.marker(ctx, sample))
  return { { role = "user", content = text } }
end

-- The user's reply shape, asked of the endpoint when o.response_format is set (constrained
-- decoding on clrt serve / vLLM / OpenAI): the three fields, in the order they are reasoned.
M.SCHEMA = {
  type = "object", additionalProperties = false,
  properties = { current_answer = { type = "string" }, thought = { type = "string" },
    response = { type = "string", minLength = 1 } },
  required = { "current_answer", "thought", "response" },
  propertyOrdering = { "current_answer", "thought", "response" },
}

function M.request_options(o)
  local opts = { temperature = o.temperature or 1.0, max_tokens = o.max_tokens or 512, top_p = o.top_p }
  if o.response_format then
    local schema = M.SCHEMA
    if o.max_chars then   -- bound every field so a reply always fits max_tokens
      schema = { type = "object", additionalProperties = false, required = M.SCHEMA.required,
        propertyOrdering = M.SCHEMA.propertyOrdering, properties = {} }
      for k, v in pairs(M.SCHEMA.properties) do
        schema.properties[k] = { type = "string", minLength = v.minLength, maxLength = o.max_chars }
      end
    end
    opts.response_format = { type = "json_schema", json_schema = { name = "simulated_user", schema = schema } }
  end
  return opts
end

-- The user's message from a parsed reply, or nil and why.
function M.response_text(obj)
  local text = llm_reply.text(obj.response)
  if text == nil then return nil, "reply has no \"response\" text" end
  text = conv.trim(text)
  if text == "" then return nil, "reply has an empty \"response\"" end
  return text
end

function M.respond(conversation, sample, ctx)
  local client = ctx and (ctx.user or ctx.client)
  if not client then error("collabllm_user: no client in ctx.user", 0) end
  if not ctx.extract_json then error("collabllm_user: no JSON parser in ctx.extract_json", 0) end
  if sample.single_turn_prompt == nil then error("collabllm_user: sample has no single_turn_prompt", 0) end
  local o = ctx.user_options or {}
  local text, obj = llm_reply.ask_json(client, M.messages(conversation, sample, ctx), M.request_options(o),
    M.response_text, { parse_retries = o.parse_retries == nil and 1 or o.parse_retries,
      extract_json = ctx.extract_json, what = "collabllm_user", counters = ctx.counters, counter = "user" })
  return text, obj
end

return M
