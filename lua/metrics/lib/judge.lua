-- metrics/lib/judge.lua — what the LLM-judge metrics share: asking the judge for a JSON
-- verdict with required keys, and extracting the final document or code a conversation
-- produced. Not a metric itself (it lives under lib/).
--
-- ctx: the table clrt.train.context builds (its fields are documented there, once); used
-- here: judge, extract_json, judge_options, counters, and metric_options.<metric>.extract /
-- .extract_max_tokens / .prompt_file.
-- Retries: a reply that is not usable is asked again parse_retries times (clrt.llm_reply);
-- transport retries are the HTTP client's. After that the metric raises and the recipe
-- records it as failed (never a silent 0).
local conv = require("clrt.conversation")
local llm_reply = require("clrt.llm_reply")
local pf = require("clrt.prompt_file")
local M = {}

-- Used where ctx.judge_options lacks a key; top_p has none (nil: not sent).
M.DEFAULTS = { temperature = 0, max_tokens = 2048, extract_max_tokens = 4096, parse_retries = 1 }   -- verl's judge: 2048

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
  -- Lost in Conversation's strategy judge (metrics/answer_attempt.lua)
  response_type = { type = "string", enum = { "answer_attempt", "clarification", "interrogation", "discussion", "hedge",
    "refuse", "missing" } },
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

-- What a verdict says beside its score, for the run's rollouts.jsonl (a metric returns it as
-- its second value): the judge's "thought" as the rationale and the other keys asked for
-- (interactivity's parts; not the score itself, nor an extracted document).
function M.note(obj, keys)
  if type(obj) ~= "table" then return nil end
  local note = { rationale = llm_reply.text(obj.thought) }
  for _, k in ipairs(keys or {}) do
    local v = obj[k]
    if type(v) == "number" or type(v) == "string" or type(v) == "boolean" then
      note.parts = note.parts or {}
      note.parts[k] = v
    end
  end
  return note
end

-- Prompts live in lua/prompts/ (clrt.prompt_file: a '#' header naming what each carries
-- from which reference, then the text with Python str.format placeholders). A metric's
-- options may name another file: reward.metric_options.<metric>.prompt_file=PATH.
function M.prompt_text(ctx, name, default_file)
  local file = M.options(ctx, name).prompt_file or default_file
  return pf.read(file), file
end

-- single_turn_metadata as a table (some exports keep it as a JSON string).
function M.metadata(sample)
  local md = sample and sample.single_turn_metadata
  if type(md) == "string" then
    local ok, t = pcall(require("clrt.json").decode, md)
    if ok and type(t) == "table" then return t end
  end
  return type(md) == "table" and md or {}
end

M.EXTRACT_FILE = "extract_completion"

-- The quote note of the authors' extractor (their prompt's note 2), in clrt's words: a
-- double quote inside the extracted text would end the JSON string early.
M.QUOTE_NOTE = 'Inside "final_completion", write every double quote (") of the extracted text as a single quote (\') so that the JSON reply parses.'

-- What the extractor is shown, as placeholders of its prompt: the conversation; for code the
-- task (sample.single_turn_prompt: verl's code extractor shows it, and a code task holds no
-- solution), the rename-to-entry-point rule, the entry point and the dataset's extraction
-- requirement (what the references show it). Never a document's single_turn_prompt: in the
-- published Medium rows it carries the reference article itself.
-- instructions: the caller's lines about the entry point and requirement (pass_rate gives
-- them); nil: clrt's own. opts: the metric's options (quote_note=false drops the quote note).
function M.extract_vars(conversation, sample, kind, instructions, opts)
  local md = M.metadata(sample)
  local req = type(md.extraction_requirement) == "string" and md.extraction_requirement or ""
  local vars = {
    extract_type = kind,
    chat_history = conv.chat_history(conversation),
    entry_point = type(md.entry_point) == "string" and md.entry_point or "",
    extraction_requirement = req ~= "" and ("Additional requirement:\n" .. req) or "",
    quote_note = (opts and opts.quote_note == false) and "" or M.QUOTE_NOTE,
    instructions = "",
  }
  local lines = {}
  if kind == "code" and sample and sample.single_turn_prompt ~= nil then
    vars.single_turn_prompt = tostring(sample.single_turn_prompt)
    lines[#lines + 1] = "The task the code solves:\n<task>\n" .. vars.single_turn_prompt .. "\n</task>"
  end
  if kind == "code" and vars.entry_point ~= "" then
    lines[#lines + 1] = ("The tests import the function `%s`. If the assistant gave the main function another name, "
      .. "rename it to `%s` in the extracted code and change nothing else."):format(vars.entry_point, vars.entry_point)
  end
  if type(instructions) == "string" and instructions ~= "" then lines[#lines + 1] = instructions
  else
    if vars.entry_point ~= "" then
      lines[#lines + 1] = ("The tests call `%s`: keep its definition under that exact name and signature."):format(vars.entry_point)
    end
    if req ~= "" then lines[#lines + 1] = "Additional requirement:\n" .. req end
  end
  if #lines > 0 then vars.instructions = table.concat(lines, "\n") .. "\n" end
  return vars
end

-- The document ("document") or code ("code") the conversation produced. The extractor sees
-- the whole conversation (prompt turns too) without the system message, and what
-- M.extract_vars gives it; its whole final_completion is the result, as both references run
-- or score it. opts.instructions: extra text for the extractor (e.g. the function name the
-- code must keep). With metric_options[name].extract == false (or no judge) it is the last
-- assistant message, for code its last fenced block, which needs no LLM call.
-- metric_options[name].code_block: true cuts the extractor's code to its last fenced block
-- too, false keeps the whole last message without the extractor (defaults: false with the
-- extractor, true without).
function M.final_completion(conversation, sample, ctx, name, kind, opts)
  opts = opts or {}
  local mopts = M.options(ctx, name)
  local extract = not (mopts.extract == false or not (ctx and ctx.judge))
  local cut = kind == "code" and mopts.code_block
  if cut == nil then cut = kind == "code" and not extract end
  if not extract then
    local text = conv.last_reply(conversation, sample) or ""
    return cut and M.code_block(text) or text
  end
  local tmpl, file = M.prompt_text(ctx, name, M.EXTRACT_FILE)
  local vars = M.extract_vars(conversation, sample, kind, opts.instructions, mopts)
  local msgs = { { role = "user", content = pf.fill(tmpl, vars, file) } }
  local text = M.ask(ctx, name, msgs, { "final_completion" }, function(o)
    local s = llm_reply.text(o.final_completion)
    if s == nil then return nil, "final_completion is not text" end
    return s
  end, mopts.extract_max_tokens or judge_option(ctx, "extract_max_tokens"), "extractor")
  return cut and M.code_block(text) or text
end

-- The last fenced code block (```python ... ```), or the text itself when it has none.
function M.code_block(text)
  local last
  for body in tostring(text):gmatch("```[%w_+-]*[ \t]*\n(.-)```") do last = body end
  return last or text
end

return M
