-- collabllm_user — an LLM plays the human, as in CollabLLM (spec: "The simulated user").
-- respond(conversation, sample, ctx) -> the user's next message (never empty).
--   sample.task_desc           e.g. "question answering", "document editing", "code generation"
--   sample.single_turn_prompt  the complete request the user has in mind
-- Both come from the sample of THIS conversation (no shared state between conversations);
-- the simulator never sees the ground truth.
-- ctx: the table clrt.train.context builds (fields documented there, once); used here:
-- user (ctx.client is accepted too), extract_json, user_options (prompt_file among them),
-- terminate_marker, counters. With an empty chat (no message besides a system one) the
-- user opens the conversation, as the prompt's rules say.
-- The model answers JSON {"current_answer", "thought", "response"}; only "response" is
-- sent. A "response" the lenient parser read as a number or boolean ("5" -> 5) is turned
-- back into its text ("5"). A reply that is not JSON, lacks "response" or has an empty one
-- is asked again parse_retries times (clrt.llm_reply: no back-off, transport retries are the
-- HTTP client's); then this raises, and the recipe drops the sample and counts it — the
-- conversation never continues with an empty user turn.
local conv = require("clrt.conversation")
local llm_reply = require("clrt.llm_reply")
local pf = require("clrt.prompt_file")

local M = { name = "collabllm_user", uses_llm = true }   -- uses_llm: clrt.train.context builds ctx.user
M.TERMINATE = conv.TERMINATE

-- The prompt: lua/prompts/collabllm_user.txt (both references' rules in clrt's words; its
-- header lists them and the placeholders). sim_cfg.prompt_file=PATH runs another text, e.g.
-- verl's USER_PROMPT_TEMPLATE or the authors' user_simulator.txt as they are.
M.PROMPT_FILE = "collabllm_user"
M.PROMPT = pf.read(M.PROMPT_FILE)

function M.messages(conversation, sample, ctx)
  local file = (ctx and ctx.user_options and ctx.user_options.prompt_file) or M.PROMPT_FILE
  local marker = conv.marker(ctx, sample)
  -- an empty history is left empty, as the references send it: the prompt's own rule says
  -- the user then opens the conversation (the paper's evaluation starts every chat there)
  local chat = conv.chat_history(conversation)
  local text = pf.fill(pf.read(file), {
    task_desc = tostring(sample.task_desc or "general assistance task"),
    single_turn_prompt = tostring(sample.single_turn_prompt or ""),
    chat_history = chat,
    termination_signal = marker, terminal_signal = marker,
  }, file)
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
