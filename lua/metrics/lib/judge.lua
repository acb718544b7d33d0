-- metrics/lib/judge.lua — what the LLM-judge metrics share: asking the judge for a JSON
-- verdict with required keys, and extracting the final document or code a conversation
-- produced. Not a metric itself (it lives under lib/).
--
-- ctx: the table clrt.train.context builds (its fields are documented there, once); used
-- here: judge, extract_json, judge_options, counters, and metric_options.<metric>.extract /
-- .extract_max_tokens.
-- Retries: a reply that is not usable is asked again parse_retries times (clrt.llm_reply);
-- transport retries are the HTTP client's. After that the metric raises and the recipe
-- records it as failed (never a silent 0).
local conv = require("clrt.conversation")
local llm_reply = require("clrt.llm_reply")
local M = {}

-- Used where ctx.judge_options lacks a key; top_p has none (nil: not sent).
M.DEFAULTS = { temperature = 0, max_tokens = 1024, extract_max_tokens = 4096, parse_retries = 1 }

function M.options(ctx, name)
  return (ctx and ctx.metric_options and ctx.metric_options[name]) or {}
end

local function judge_option(ctx, key)
  local jo = ctx and ctx.judge_options
  if jo and jo[key] ~= nil then return jo[key] end
  return M.DEFAULTS[key]
end

-- The JSON schema of a verdict: a "thought" first, then the keys. Sent as response_format
-- when ctx.judge_options.response_format is set, so endpoints with constrained decoding
-- (clrt serve, vLLM, OpenAI) answer in the shape the parser expects. Only the thought is
-- bounded by max_chars: an extracted document or program (final_completion) never is.
M.KEY_TYPES = {
  accuracy = { type = "integer", minimum = 0, maximum = 1 },
  final_completion = { type = "string" },
}
function M.schema(keys, max_chars)
  local props, order, req = { thought = { type = "string", maxLength = max_chars } }, { "thought" }, { "thought" }
  for _, k in ipairs(keys) do
    props[k] = M.KEY_TYPES[k] or { type = "number", minimum = 0, maximum = 1 }
    order[#order + 1], req[#req + 1] = k, k
  end
  return { type = "object", properties = props, required = req, additionalProperties = false, propertyOrdering = order }
end

-- The request options of a judge call: temperature, max_tokens, top_p and the schema; role
-- (not sent) names the call in the spend accounting: "judge/<name>" unless given.
function M.request_options(ctx, name, keys, max_tokens, role)
  local opts = { temperature = judge_option(ctx, "temperature"), max_tokens = max_tokens or judge_option(ctx, "max_tokens"),
    top_p = judge_option(ctx, "top_p"), role = role or ("judge/" .. name) }
  if judge_option(ctx, "response_format") then
    opts.response_format = { type = "json_schema",
      json_schema = { name = name, schema = M.schema(keys, judge_option(ctx, "max_chars")) } }
  end
  return opts
end

-- Ask the judge for a reply holding every key in `keys` for which `check(obj)` returns a
-- value (the metric's number). Returns value, obj. Raises with what was wrong when the
-- reply is still unusable after parse_retries more requests, or the client raised.
-- max_tokens: this call's own (extraction), else judge_options.max_tokens; role: see request_options.
function M.ask(ctx, name, messages, keys, check, max_tokens, role)
  if not ctx or not ctx.judge then error(name .. ": no judge client in ctx.judge", 0) end
  if not ctx.extract_json then error(name .. ": no JSON parser in ctx.extract_json", 0) end
  local value, obj = llm_reply.ask_json(ctx.judge, messages, M.request_options(ctx, name, keys, max_tokens, role),
    function(o)
      for _, k in ipairs(keys) do
        if o[k] == nil then return nil, ("reply lacks key '%s'"):format(k) end
      end
      return check(o)
    end,
    { parse_retries = judge_option(ctx, "parse_retries"), extract_json = ctx.extract_json, what = name .. " judge",
      counters = ctx.counters, counter = "judge" })
  return value, obj
end

M.KIND_TEXT = { document = "document", code = "piece of code" }
M.EXTRACT = [[
Below is a conversation in which a user works with an AI assistant on a %s. Over the turns the user may have added details, asked for changes or corrected the assistant, and the assistant may have written several drafts, sometimes only the part it changed.

What the user wanted in the end:
<request>
%s
</request>

<conversation>
%s
</conversation>
%s
Give the final %s the conversation arrived at: start from the assistant's latest full version and apply every revision the user asked for and the assistant agreed to anywhere in the conversation, so that parts written in earlier turns and never changed are kept. Use only what the assistant wrote; do not fix, improve or finish it yourself, and add no commentary. If the assistant never wrote one, give an empty string.

Reply with JSON only, no other text:
{"thought": "<one or two sentences: which turns the final version is built from>", "final_completion": "<the complete final %s>"}]]

-- The document ("document") or code ("code") the conversation produced. The extractor sees
-- the whole conversation (prompt turns too) without the system message. opts.instructions:
-- extra text for the extractor (e.g. the function name the code must keep). With
-- metric_options[name].extract == false (or no judge) it is the last assistant message
-- (for code: its last fenced block), which needs no LLM call.
function M.final_completion(conversation, sample, ctx, name, kind, opts)
  opts = opts or {}
  local mopts = M.options(ctx, name)
  if mopts.extract == false or not (ctx and ctx.judge) then
    local text = conv.last_reply(conversation, sample) or ""
    if kind == "code" then return M.code_block(text) end
    return text
  end
  local extra = ""
  if type(opts.instructions) == "string" and opts.instructions ~= "" then extra = "\n" .. opts.instructions .. "\n" end
  local what = M.KIND_TEXT[kind] or tostring(kind)
  local msgs = { { role = "user", content = M.EXTRACT:format(what, tostring(sample.single_turn_prompt or ""),
    conv.transcript(conv.without_system(conversation)), extra, what, what) } }
  local text = M.ask(ctx, name, msgs, { "final_completion" }, function(o)
    local s = llm_reply.text(o.final_completion)
    if s == nil then return nil, "final_completion is not text" end
    return s
  end, mopts.extract_max_tokens or judge_option(ctx, "extract_max_tokens"), "extractor")
  if kind == "code" then return M.code_block(text) end
  return text
end

-- The last fenced code block (```python ... ```), or the text itself when it has none.
function M.code_block(text)
  local last
  for body in tostring(text):gmatch("```[%w_+-]*[ \t]*\n(.-)```") do last = body end
  return last or text
end

return M
