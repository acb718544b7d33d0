-- support.chat_oracle — clrt's former hand-written chat templates (five families: Qwen3,
-- Llama 3, Llama 3.1, Qwen2.5, ChatML), kept only as a test oracle: test_chat_masks.lua checks
-- that the masks clrt.chat now derives from any template's rendering equal the masks these
-- segments gave. Not used by the library.
--   local ids, mask = oracle.render(tok, messages, opts)   -- segments: {text, trained}
local M = {}
M.templates = {}

function M.register(name, spec)
  assert(type(spec.detect) == "function" and type(spec.segments) == "function",
    "chat.register: a template needs detect(jinja) and segments(messages, opts, tok)")
  spec.name = name
  for i, t in ipairs(M.templates) do
    if t.name == name then M.templates[i] = spec; return spec end
  end
  M.templates[#M.templates + 1] = spec
  return spec
end

local function check_messages(messages)
  assert(type(messages) == "table", "chat: messages must be a list of {role=, content=}")
  local tools = false
  for i, m in ipairs(messages) do
    if type(m) ~= "table" or type(m.role) ~= "string" or type(m.content) ~= "string" then
      error(("chat: message %d needs a string role and a string content"):format(i), 3)
    end
    if m.tool_calls ~= nil then
      tools = true
      if type(m.tool_calls) ~= "table" then error(("chat: message %d: tool_calls must be a list"):format(i), 3) end
      for j, c in ipairs(m.tool_calls) do
        local f = type(c) == "table" and (c["function"] or c) or nil
        if type(f) ~= "table" or type(f.name) ~= "string" or (type(f.arguments) ~= "string" and type(f.arguments) ~= "table") then
          error(("chat: message %d tool_calls[%d] needs a name and arguments (a string or an object)"):format(i, j), 3)
        end
      end
    end
    if m.role == "tool" then tools = true end
  end
  return tools
end

-- Jinja's `tojson` as transformers and @huggingface/jinja write it: ", " and ": " between
-- items, keys in the order they came in (clrt.json.decode with key_order), non-ASCII raw.
function M.tojson(v) return require("clrt.json").encode(v, { separators = { ", ", ": " } }) end

local function strip_chars(s, chars, left, right)
  local set = "[" .. chars .. "]"
  if left then s = s:gsub("^" .. set .. "+", "") end
  if right then s = s:gsub(set .. "+$", "") end
  return s
end

-- Jinja's |trim and Python's str.strip() (ASCII whitespace is what chat text carries).
local function trim(s) return (s:gsub("^%s+", ""):gsub("%s+$", "")) end

local function plain_split_last(s, sep)    -- Python s.split(sep)[-1]
  local last, i = s, 1
  while true do
    local a, b = s:find(sep, i, true)
    if not a then break end
    last = s:sub(b + 1)
    i = b + 1
  end
  return last
end

local function plain_split_first(s, sep)   -- Python s.split(sep)[0]
  local a = s:find(sep, 1, true)
  return a and s:sub(1, a - 1) or s
end

---------------------------------------------------------------------------------------------
-- Qwen3 (ChatML with <think> handling) and its tool format: opts.tools (OpenAI's tool
-- objects) are listed as JSON in the system turn; an assistant's tool_calls follow its
-- content as <tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>; a run of `tool`
-- messages becomes one user turn of <tool_response> blocks.
local QWEN3_TOOLS_HEAD = "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n" ..
  "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
local QWEN3_TOOLS_TAIL = "\n</tools>\n\nFor each function call, return a json object with function name and " ..
  "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, " ..
  "\"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n"

-- One tool call as Qwen's templates write it (arguments: a JSON string as is, else tojson).
local function qwen_tool_call(call)
  local f = call["function"] or call
  local args = type(f.arguments) == "string" and f.arguments or M.tojson(f.arguments)
  return '<tool_call>\n{"name": "' .. f.name .. '", "arguments": ' .. args .. "}\n</tool_call>"
end

-- How a template writes tool calls, for the server: `prefix` is the text a reply starts with
-- when a call is required (the call's JSON follows it), `args_key` the JSON key of the
-- arguments, `args_object` whether the template runs the arguments through tojson (so they
-- must be handed over decoded, not as OpenAI's JSON string), `style` how replies are parsed
-- ("xml": <tool_call> blocks, "json": the whole reply is one call object).
M.TOOL_FORMATS = {
  qwen3 = { prefix = "<tool_call>\n", args_key = "arguments", args_object = false, style = "xml" },
  qwen25 = { prefix = "<tool_call>\n", args_key = "arguments", args_object = true, style = "xml" },
  llama31 = { prefix = "", args_key = "parameters", args_object = true, style = "json" },
}

M.register("qwen3", {
  tools = M.TOOL_FORMATS.qwen3,
  detect = function(j)
    return j:find("<|im_start|>", 1, true) and j:find("<think>", 1, true) and j:find("reasoning_content", 1, true)
  end,
  segments = function(messages, opts)
    local seg = {}
    local function add(text, train) seg[#seg + 1] = { text, train } end
    local first = 1
    local has_system = messages[1] and messages[1].role == "system"
    if opts.tools and #opts.tools > 0 then
      local t = { "<|im_start|>system\n", has_system and messages[1].content .. "\n\n" or "", QWEN3_TOOLS_HEAD }
      for _, tool in ipairs(opts.tools) do t[#t + 1] = "\n" .. M.tojson(tool) end
      t[#t + 1] = QWEN3_TOOLS_TAIL
      add(table.concat(t), false)
    elseif has_system then
      add("<|im_start|>system\n" .. messages[1].content .. "<|im_end|>\n", false)
    end
    if has_system then first = 2 end
    -- the last user message that is not a tool response
    local last_query = #messages
    for i = #messages, 1, -1 do
      local m = messages[i]
      if m.role == "user" and not (m.content:sub(1, 15) == "<tool_response>" and m.content:sub(-16) == "</tool_response>") then
        last_query = i
        break
      end
    end
    for i = first, #messages do
      local m = messages[i]
      if m.role == "user" or m.role == "system" then
        add("<|im_start|>" .. m.role .. "\n" .. m.content .. "<|im_end|>\n", false)
      elseif m.role == "assistant" then
        local content, reasoning = m.content, ""
        if m.reasoning_content ~= nil then
          reasoning = m.reasoning_content
        elseif content:find("</think>", 1, true) then
          reasoning = plain_split_first(content, "</think>")
          reasoning = strip_chars(reasoning, "\n", false, true)
          reasoning = strip_chars(plain_split_last(reasoning, "<think>"), "\n", true, false)
          content = strip_chars(plain_split_last(content, "</think>"), "\n", true, false)
        end
        add("<|im_start|>assistant\n", false)
        if i > last_query and (i == #messages or reasoning ~= "") then
          add("<think>\n" .. strip_chars(reasoning, "\n", true, true) .. "\n</think>\n\n" ..
            strip_chars(content, "\n", true, false), true)
        else
          add(content, true)
        end
        for j, call in ipairs(m.tool_calls or {}) do
          add(((j == 1 and content ~= "") or j > 1) and "\n" .. qwen_tool_call(call) or qwen_tool_call(call), true)
        end
        add("<|im_end|>", true)
        add("\n", false)
      elseif m.role == "tool" then
        local prev, nxt = messages[i - 1], messages[i + 1]
        add(((i == 1 or prev.role ~= "tool") and "<|im_start|>user" or "") .. "\n<tool_response>\n" .. m.content ..
          "\n</tool_response>" .. ((not nxt or nxt.role ~= "tool") and "<|im_end|>\n" or ""), false)
      else
        error(("chat: qwen3 template has no role %q (message %d)"):format(m.role, i), 3)
      end
    end
    if opts.add_generation_prompt then
      add("<|im_start|>assistant\n", false)
      if opts.enable_thinking == false then add("<think>\n\n</think>\n\n", false) end
    end
    return seg
  end,
})

---------------------------------------------------------------------------------------------
-- Llama 3 Instruct: BOS, then a header per message, content trimmed, <|eot_id|>. Its
-- template always ends with the assistant header (whatever add_generation_prompt says) unless
-- the Jinja guards it with `if add_generation_prompt`, which detect() records.
local function llama3_segments(always_prompt)
  return function(messages, opts, tok)
    local seg = {}
    local function add(text, train) seg[#seg + 1] = { text, train } end
    for i, m in ipairs(messages) do
      local head = "<|start_header_id|>" .. m.role .. "<|end_header_id|>\n\n"
      if i == 1 then head = (tok and tok.bos_token or "<|begin_of_text|>") .. head end
      add(head, false)
      local is_asst = m.role == "assistant"
      add(trim(m.content), is_asst)
      add("<|eot_id|>", is_asst)
    end
    if always_prompt or opts.add_generation_prompt then
      add("<|start_header_id|>assistant<|end_header_id|>\n\n", false)
    end
    return seg
  end
end

M.register("llama3", {
  detect = function(j)
    if not (j:find("<|start_header_id|>", 1, true) and j:find("<|eot_id|>", 1, true)) then return false end
    if j:find("Cutting Knowledge Date", 1, true) or j:find("tools", 1, true) then return false end  -- 3.1+: not yet
    return true
  end,
  segments = function(messages, opts, tok)
    return llama3_segments(not M._current_jinja or not M._current_jinja:find("add_generation_prompt", 1, true))(messages, opts, tok)
  end,
})

---------------------------------------------------------------------------------------------
-- Llama 3.1 / 3.2 / 3.3 Instruct: BOS, a system turn that always carries the knowledge
-- cut-off and today's date before the (trimmed) system message, then Llama 3 turns. The date
-- is opts.date_string, else today when the template calls strftime_now (3.2), else the
-- template's default.
-- Tools (when the template has its JSON tool-call format): "Environment: ipython" opens the
-- system turn; the tools, as tojson(indent=4), go into the first user message (or, with
-- opts.tools_in_user_message == false, the system turn); an assistant's single tool call is
-- {"name": ..., "parameters": <tojson>}; `tool`/`ipython` messages become ipython turns whose
-- content goes through tojson (a string is iterable to Jinja, so it is written quoted).
local LLAMA_TOOLS_ASK = 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' ..
  "Do not use variables.\n\n"

-- Jinja's tojson(indent=4) (Python's json.dumps with indent: "," ends a line, ": " after keys).
local function tojson_indent(v, pad)
  local json = require("clrt.json")
  pad = pad or ""
  if type(v) ~= "table" or v == json.null then return json.encode(v) end
  local inner = pad .. "    "
  local parts = {}
  if json.is_array(v) or (next(v) == nil and getmetatable(v) ~= getmetatable(json.object())) then
    if #v == 0 then return "[]" end
    for i = 1, #v do parts[i] = inner .. tojson_indent(v[i], inner) end
    return "[\n" .. table.concat(parts, ",\n") .. "\n" .. pad .. "]"
  end
  for _, k in ipairs(json.keys_of(v, "$")) do
    parts[#parts + 1] = inner .. json.quote(tostring(k)) .. ": " .. tojson_indent(v[k], inner)
  end
  if #parts == 0 then return "{}" end
  return "{\n" .. table.concat(parts, ",\n") .. "\n" .. pad .. "}"
end
M.tojson_indent = tojson_indent

local function llama31_has_tools(j)
  return j:find('"parameters": ', 1, true) ~= nil and j:find("tool_calls", 1, true) ~= nil
    and j:find("ipython", 1, true) ~= nil
end

M.register("llama3.1", {
  tools = function(j) return llama31_has_tools(j) and M.TOOL_FORMATS.llama31 or nil end,
  detect = function(j)
    return j:find("<|start_header_id|>", 1, true) and j:find("<|eot_id|>", 1, true)
      and j:find("Cutting Knowledge Date", 1, true)
  end,
  segments = function(messages, opts, tok)
    local j = M._current_jinja or ""
    local cutoff = j:match("Cutting Knowledge Date: ([^\\\"']-)\\n") or "December 2023"
    local date = opts.date_string
    if not date and j:find("strftime_now", 1, true) then date = os.date("%d %b %Y") end
    date = date or j:match("set date_string = [\"']([^\"']+)[\"']") or "26 Jul 2024"
    local tools = opts.tools   -- Jinja's `tools is not none`: an empty list still counts
    local in_user = opts.tools_in_user_message ~= false
    local seg = {}
    local function add(text, train) seg[#seg + 1] = { text, train } end
    local function tool_list()
      local t = {}
      for _, tool in ipairs(tools) do t[#t + 1] = tojson_indent(tool) .. "\n\n" end
      return table.concat(t)
    end
    local first, system = 1, ""
    if messages[1] and messages[1].role == "system" then system = trim(messages[1].content); first = 2 end
    add((tok and tok.bos_token or "<|begin_of_text|>") .. "<|start_header_id|>system<|end_header_id|>\n\n" ..
      (tools and "Environment: ipython\n" or "") ..
      "Cutting Knowledge Date: " .. cutoff .. "\nToday Date: " .. date .. "\n\n" ..
      ((tools and not in_user) and ("You have access to the following functions. To call a function, please respond " ..
        "with JSON for a function call." .. LLAMA_TOOLS_ASK .. tool_list()) or "") ..
      system .. "<|eot_id|>", false)
    if tools and in_user then
      local m = messages[first]
      if not m then error("chat: llama3.1 puts the tools in the first user message, and there is none", 0) end
      add("<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, please respond with a JSON " ..
        "for a function call with its proper arguments that best answers the given prompt.\n\n" .. LLAMA_TOOLS_ASK ..
        tool_list() .. trim(m.content) .. "<|eot_id|>", false)
      first = first + 1
    end
    for i = first, #messages do
      local m = messages[i]
      if m.tool_calls ~= nil then
        if #m.tool_calls ~= 1 then
          error(("chat: llama3.1 takes one tool call per assistant message (message %d has %d)"):format(i, #m.tool_calls), 0)
        end
        local f = m.tool_calls[1]["function"]
        if type(f) ~= "table" then error(("chat: message %d tool_calls[1] needs a function"):format(i), 0) end
        add("<|start_header_id|>assistant<|end_header_id|>\n\n", false)
        add('{"name": "' .. f.name .. '", "parameters": ' .. M.tojson(f.arguments) .. "}<|eot_id|>", true)
      elseif m.role == "tool" or m.role == "ipython" then
        add("<|start_header_id|>ipython<|end_header_id|>\n\n" .. M.tojson(m.content) .. "<|eot_id|>", false)
      else
        local is_asst = m.role == "assistant"
        add("<|start_header_id|>" .. m.role .. "<|end_header_id|>\n\n", false)
        add(trim(m.content), is_asst)
        add("<|eot_id|>", is_asst)
      end
    end
    if opts.add_generation_prompt then add("<|start_header_id|>assistant<|end_header_id|>\n\n", false) end
    return seg
  end,
})

---------------------------------------------------------------------------------------------
-- Qwen2.5 Instruct: ChatML with a default system message ("You are Qwen, created by Alibaba
-- Cloud. ..."), and Qwen's <tool_call> format: with tools the system turn is the system
-- message (or that default) followed by the tool list; an assistant's tool calls follow its
-- content as <tool_call> blocks whose arguments go through tojson; a run of `tool` messages
-- is one user turn of <tool_response> blocks. Detected by its tool branch; a ChatML template
-- without one falls through to "chatml" below.
M.register("qwen2.5", {
  tools = M.TOOL_FORMATS.qwen25,
  detect = function(j)
    return j:find("<|im_start|>", 1, true) and j:find("<|im_end|>", 1, true) and not j:find("<think>", 1, true)
      and j:find("<tool_call>", 1, true) and j:find("tool_calls", 1, true) and j:find("<tool_response>", 1, true)
  end,
  segments = function(messages, opts)
    local seg = {}
    local function add(text, train) seg[#seg + 1] = { text, train } end
    local j = M._current_jinja or ""
    local default = j:match("<|im_start|>system\\n([^'\"{}]-)<|im_end|>") or ""
    local has_system = messages[1] and messages[1].role == "system"
    if opts.tools and #opts.tools > 0 then
      local t = { "<|im_start|>system\n", has_system and messages[1].content or default, "\n\n", QWEN3_TOOLS_HEAD }
      for _, tool in ipairs(opts.tools) do t[#t + 1] = "\n" .. M.tojson(tool) end
      t[#t + 1] = QWEN3_TOOLS_TAIL
      add(table.concat(t), false)
    else
      add("<|im_start|>system\n" .. (has_system and messages[1].content or default) .. "<|im_end|>\n", false)
    end
    for i, m in ipairs(messages) do
      if m.role == "user" or (m.role == "system" and i > 1) or (m.role == "assistant" and not (m.tool_calls and #m.tool_calls > 0)) then
        local asst = m.role == "assistant"
        add("<|im_start|>" .. m.role .. "\n", false)
        add(m.content, asst)
        add("<|im_end|>", asst)
        add("\n", false)
      elseif m.role == "assistant" then
        add("<|im_start|>assistant", false)
        local body = m.content ~= "" and "\n" .. m.content or ""
        for _, call in ipairs(m.tool_calls) do
          local f = call["function"] or call
          body = body .. '\n<tool_call>\n{"name": "' .. f.name .. '", "arguments": ' .. M.tojson(f.arguments) .. "}\n</tool_call>"
        end
        add(body .. "<|im_end|>", true)
        add("\n", false)
      elseif m.role == "tool" then
        local prev, nxt = messages[i - 1], messages[i + 1]
        add(((i == 1 or prev.role ~= "tool") and "<|im_start|>user" or "") .. "\n<tool_response>\n" .. m.content ..
          "\n</tool_response>" .. ((not nxt or nxt.role ~= "tool") and "<|im_end|>\n" or ""), false)
      elseif m.role ~= "system" then
        error(("chat: qwen2.5 template has no role %q (message %d)"):format(m.role, i), 0)
      end
    end
    if opts.add_generation_prompt then add("<|im_start|>assistant\n", false) end
    return seg
  end,
})

---------------------------------------------------------------------------------------------
-- Plain ChatML (<|im_start|>role\ncontent<|im_end|>\n), optionally with the default system
-- message the template inserts when the conversation has none (Qwen2/2.5, SmolLM2, clrt's
-- trained tokenizers). Tool calls are not rendered (messages using them are an error).
local function chatml_default_system(j)
  -- the system turn written out literally in the Jinja source ("\n" escaped inside a string)
  return j:match("<|im_start|>system\\n([^'\"{}]-)<|im_end|>")
end

M.register("chatml", {
  detect = function(j)
    return j:find("<|im_start|>", 1, true) and j:find("<|im_end|>", 1, true) and not j:find("<think>", 1, true)
  end,
  segments = function(messages, opts)
    local seg = {}
    local function add(text, train) seg[#seg + 1] = { text, train } end
    local default = M._current_jinja and chatml_default_system(M._current_jinja)
    if default and (not messages[1] or messages[1].role ~= "system") and #messages > 0 then
      add("<|im_start|>system\n" .. default .. "<|im_end|>\n", false)
    end
    for _, m in ipairs(messages) do
      local asst = m.role == "assistant"
      add("<|im_start|>" .. m.role .. "\n", false)
      add(m.content, asst)
      add("<|im_end|>", asst)
      add("\n", false)
    end
    if opts.add_generation_prompt then add("<|im_start|>assistant\n", false) end
    return seg
  end,
})

-- The ChatML template clrt writes into the tokenizers it trains (recipes/train_tokenizer.lua).
M.CHATML_JINJA = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"

local function jinja_of(tok)
  local ct = tok and tok.config and tok.config.chat_template
  if type(ct) == "table" then    -- a list of named templates: take "default"
    local found
    for _, t in ipairs(ct) do if t.name == "default" then found = t.template end end
    ct = found or (ct[1] and ct[1].template)
  end
  return type(ct) == "string" and ct or nil
end

-- The template entry used for this tokenizer (error if none fits).
function M.template_for(tok, opts)
  if opts and opts.template then
    for _, t in ipairs(M.templates) do if t.name == opts.template then return t end end
    error(("chat: no template named %q (have: %s)"):format(opts.template, M.names()), 3)
  end
  local j = jinja_of(tok)
  if not j then
    error("chat: the tokenizer has no chat_template (tokenizer_config.json); pass opts.template = " ..
      "\"chatml\" or \"llama3\", or add one with clrt.chat.register", 3)
  end
  for _, t in ipairs(M.templates) do
    if t.detect(j) then return t, j end
  end
  error(("chat: no Lua template matches this model's chat_template (%s...). Add one with " ..
    "clrt.chat.register(name, {detect = function(jinja) ... end, segments = function(messages, opts, tok) " ..
    "return {{text, train}, ...} end}) reproducing what the Jinja renders (see lua/clrt/chat.lua); have: %s")
    :format(j:sub(1, 80):gsub("\n", " "), M.names()), 3)
end

function M.names()
  local n = {}
  for _, t in ipairs(M.templates) do n[#n + 1] = t.name end
  return table.concat(n, ", ")
end

-- The tool format of a template entry for this Jinja source (nil: it has none).
local function tool_format_of(t, j)
  if type(t.tools) == "function" then return t.tools(j or "") end
  return t.tools or nil
end

-- The tool format (M.TOOL_FORMATS) of this tokenizer's chat template; nil when it has none.
function M.tool_format(tok, opts)
  local ok, t, j = pcall(M.template_for, tok, opts)
  if not ok then return nil end
  return tool_format_of(t, j)
end

-- Does this tokenizer's chat template have a tool format clrt renders?
function M.supports_tools(tok, opts) return M.tool_format(tok, opts) ~= nil end

local function segments(tok, messages, opts)
  opts = opts or {}
  local uses_tools = check_messages(messages) or (opts.tools ~= nil and #opts.tools > 0)
  local t, j = M.template_for(tok, opts)
  if uses_tools and not tool_format_of(t, j) then
    error(("chat: the %s template has no tool format (tools, tool_calls or tool messages)"):format(t.name), 3)
  end
  M._current_jinja = j
  local ok, seg = pcall(t.segments, messages, opts, tok)
  M._current_jinja = nil
  if not ok then error(seg, 0) end
  return seg
end

-- The conversation as text (what the Jinja chat_template renders).
function M.format(tok, messages, opts)
  local seg = segments(tok, messages, opts)
  local parts = {}
  for i, s in ipairs(seg) do parts[i] = s[1] end
  return table.concat(parts)
end

-- ids of the rendered text (exactly tok:encode(text) without extra special tokens) and a
-- mask: 1 for tokens overlapping a trained segment, 0 otherwise.
function M.render(tok, messages, opts)
  local seg = segments(tok, messages, opts)
  local parts = {}
  for i, s in ipairs(seg) do parts[i] = s[1] end
  local text = table.concat(parts)
  local ids = tok:encode(text, { add_special_tokens = false })
  -- trained byte ranges [a, b)
  local ranges, pos = {}, 0
  for _, s in ipairs(seg) do
    if s[2] and #s[1] > 0 then ranges[#ranges + 1] = { pos, pos + #s[1] } end
    pos = pos + #s[1]
  end
  local lens, total = {}, 0
  for i, id in ipairs(ids) do
    lens[i] = #tok:token_bytes(id)
    total = total + lens[i]
  end
  local mask = {}
  if total == #text then
    local at, r = 0, 1
    for i = 1, #ids do
      local a, b = at, at + lens[i]
      while ranges[r] and ranges[r][2] <= a do r = r + 1 end
      mask[i] = (ranges[r] and ranges[r][1] < b and a < ranges[r][2]) and 1 or 0
      at = b
    end
  else
    -- the normalizer changed the text's length: fall back to per-segment encoding for the mask
    local k = 0
    for _, s in ipairs(seg) do
      local n = #tok:encode(s[1], { add_special_tokens = false })
      for _ = 1, n do k = k + 1; mask[k] = s[2] and 1 or 0 end
    end
    for i = k + 1, #ids do mask[i] = 0 end
    while #mask > #ids do mask[#mask] = nil end
  end
  return ids, mask, text
end

return M
