-- clrt.chat — a conversation as the model's own chat template renders it (its Jinja, run by
-- clrt.jinja exactly as @huggingface/jinja runs it), its ids, and a loss mask.
--   local ids, mask = clrt.chat.render(tok, {
--     { role = "system", content = "Be brief." },
--     { role = "user", content = "Hi" },
--     { role = "assistant", content = "Hello!" },
--   }, { add_generation_prompt = false })
--   -- mask[i] == 1 on assistant content and the assistant's end-of-turn token, 0 elsewhere
--   local text = clrt.chat.format(tok, messages, { add_generation_prompt = true, tools = tools })
--
-- The template: opts.template (Jinja source, or a name in the tokenizer's list of named
-- templates, or "chatml"), else the model folder's chat_template.jinja, else
-- tokenizer_config.json's chat_template (a string, or a list of {name, template}: "tool_use"
-- when tools are given and it has one, else "default"). Parsed once per template text.
-- The template sees: messages, add_generation_prompt, tools and documents (none unless
-- given), the tokenizer's special tokens (bos_token, eos_token, ...), and every other opts key
-- as a template kwarg (enable_thinking, reasoning_effort, date_string, ...).
--
-- The mask (docs/chat_templates.md): an assistant message's trained text starts where the
-- rendering of the messages before it with add_generation_prompt ends (their longest common
-- prefix with the whole rendering) and runs through the first end-of-turn marker after it
-- (the tokenizer's end-of-turn and EOS tokens: <|im_end|>, <|eot_id|>, <end_of_turn>, ...)
-- before the next assistant message starts; without one, to the end of the message's own
-- rendering (where the messages through it render as a prefix of the whole).
local jinja = require("clrt.jinja")
local values = require("clrt.jinja.values")
local json = require("clrt.json")

local M = {}

-- The ChatML template clrt writes into the tokenizers it trains (recipes/train_tokenizer.lua).
M.CHATML_JINJA = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"

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

local function has(j, s) return j:find(s, 1, true) ~= nil end

-- The family a template belongs to, read from its text (for the server's tool-call parsing
-- and for logs; rendering never depends on it).
local function family_of(j)
  if has(j, "<|im_start|>") then
    if has(j, "<think>") and has(j, "reasoning_content") then return "qwen3" end
    if has(j, "<tool_call>") and has(j, "tool_calls") and has(j, "<tool_response>") then return "qwen2.5" end
    return "chatml"
  end
  if has(j, "<|start_header_id|>") and has(j, "<|eot_id|>") then
    return has(j, "Cutting Knowledge Date") and "llama3.1" or "llama3"
  end
  if has(j, "<start_of_turn>") then return "gemma" end
  if has(j, "<｜Assistant｜>") then return "deepseek" end
  if has(j, "<|channel|>") then return "gpt-oss" end
  if has(j, "[INST]") then return "llama2" end
  return "jinja"
end

local function tool_format_of(family, j)
  if family == "qwen3" then return M.TOOL_FORMATS.qwen3 end
  if family == "qwen2.5" then return M.TOOL_FORMATS.qwen25 end
  if family == "llama3.1" and has(j, '"parameters": ') and has(j, "tool_calls") and has(j, "ipython") then
    return M.TOOL_FORMATS.llama31
  end
  return nil
end

local file_cache = setmetatable({}, { __mode = "k" })    -- tok -> chat_template.jinja text or false

local function read_template_file(tok)
  local cached = file_cache[tok]
  if cached ~= nil then return cached or nil end
  local text = false
  if type(tok.dir) == "string" then
    local f = io.open(tok.dir .. "/chat_template.jinja", "rb")
    if f then text = f:read("*a"); f:close() end
  end
  file_cache[tok] = text
  return text or nil
end

local function named(list, name)
  for _, t in ipairs(list) do
    if type(t) == "table" and t.name == name and type(t.template) == "string" then return t.template end
  end
end

-- Where a tokenizer's files are, for messages: "DIR/NAME", or NAME when it has no folder.
local function file_of(tok, name)
  return (type(tok) == "table" and type(tok.dir) == "string") and (tok.dir .. "/" .. name) or name
end

-- The Jinja source of this tokenizer's template (error if it has none), and where it came
-- from (a file, for error messages).
function M.template_source(tok, opts)
  opts = opts or {}
  local ct = type(tok) == "table" and type(tok.config) == "table" and tok.config.chat_template or nil
  local config_file = file_of(tok, "tokenizer_config.json")
  if ct ~= nil and ct ~= json.null and type(ct) ~= "string" and type(ct) ~= "table" then
    error(("chat: %s: chat_template must be a string or a list of {name, template} (got a %s)"):format(config_file, type(ct)), 3)
  end
  local want = opts.template
  if want ~= nil then
    if type(want) ~= "string" then error("chat: opts.template must be a string (Jinja source or a template name)", 3) end
    if want:find("{[{%%]") then return want, "the template given" end
    if type(ct) == "table" and named(ct, want) then return named(ct, want), ("%s (chat_template %q)"):format(config_file, want) end
    if want == "chatml" then return M.CHATML_JINJA, "clrt's ChatML template" end
    error(("chat: no template named %q (the tokenizer's: %s; or pass Jinja source)"):format(want,
      type(ct) == "table" and table.concat((function() local n = {}; for _, t in ipairs(ct) do n[#n + 1] = tostring(t.name) end; return n end)(), ", ") or "none"), 3)
  end
  local file = tok and read_template_file(tok)
  if file then return file, file_of(tok, "chat_template.jinja") end
  if type(ct) == "table" then
    local tools = opts.tools ~= nil and opts.tools ~= json.null
    local which = (tools and named(ct, "tool_use")) and "tool_use" or "default"
    local src = named(ct, which)
    if not src then
      error(("chat: %s: chat_template is a list without a \"default\" template; pass opts.template = <name>"):format(config_file), 3)
    end
    return src, ("%s (chat_template %q)"):format(config_file, which)
  end
  if type(ct) == "string" then return ct, config_file end
  error("chat: the tokenizer has no chat template (no chat_template.jinja beside it, no chat_template in " ..
    "tokenizer_config.json); pass opts.template (Jinja source, or \"chatml\")", 3)
end

-- {name = family, source = Jinja} of this tokenizer's template.
function M.template_for(tok, opts)
  local src = M.template_source(tok, opts)
  return { name = family_of(src), source = src }
end

-- The tool format (M.TOOL_FORMATS) of this tokenizer's chat template; nil when it has none
-- the server can parse replies in.
function M.tool_format(tok, opts)
  local ok, src = pcall(M.template_source, tok, opts)
  if not ok then return nil end
  return tool_format_of(family_of(src), src)
end

function M.supports_tools(tok, opts) return M.tool_format(tok, opts) ~= nil end

local function check_messages(messages)
  if type(messages) ~= "table" then error("chat: messages must be a list of {role=, content=}", 3) end
  for i, m in ipairs(messages) do
    if type(m) ~= "table" or type(m.role) ~= "string" then
      error(("chat: message %d needs a string role"):format(i), 3)
    end
    local c = m.content
    if c ~= nil and c ~= json.null and type(c) ~= "string" and type(c) ~= "table" then
      error(("chat: message %d: content must be a string, a list of parts, or absent"):format(i), 3)
    end
    if (c == nil or c == json.null) and m.tool_calls == nil then
      error(("chat: message %d needs a content (or tool_calls)"):format(i), 3)
    end
    if m.tool_calls ~= nil and type(m.tool_calls) ~= "table" then
      error(("chat: message %d: tool_calls must be a list"):format(i), 3)
    end
  end
end

local SPECIAL = { "bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token" }
local OURS = { template = true, limits = true }

-- A template error with the file it came from: "FILE: chat template line N: what".
local function at_file(origin, err)
  err = tostring(err)
  if origin and err:find("^chat template") then return origin .. ": " .. err end
  return err
end

local function special_content(v)
  if type(v) == "string" then return v end
  if type(v) == "table" and type(v.content) == "string" then return v.content end
end

-- The template and the context shared by every rendering of one call.
local function prepare(tok, messages, opts)
  opts = opts or {}
  check_messages(messages)
  local src, origin = M.template_source(tok, opts)
  local ok, t = pcall(jinja.compile, src)
  if not ok then error("chat: " .. at_file(origin, t), 3) end
  local ctx = {}
  local config = type(tok) == "table" and type(tok.config) == "table" and tok.config or {}
  for _, name in ipairs(SPECIAL) do
    local c = special_content(config[name]) or (type(tok) == "table" and type(tok[name]) == "string" and tok[name]) or nil
    if c then ctx[name] = c end
  end
  for k, v in pairs(opts) do
    if not OURS[k] then ctx[k] = values.from_lua(v) end
  end
  ctx.tools = opts.tools ~= nil and values.from_lua(opts.tools) or values.NULL
  ctx.documents = opts.documents ~= nil and values.from_lua(opts.documents) or values.NULL
  -- limits: clrt.jinja.budget's (max_steps, max_output, tick); the origin names the file in errors
  t = { t = t, origin = origin, limits = opts.limits }
  return t, ctx, values.from_lua(messages), opts.add_generation_prompt == true
end

local function render_with(t, ctx, msgs, n, agp)
  local list = msgs
  if n < #msgs then
    list = values.list({})
    for i = 1, n do list[i] = msgs[i] end
  end
  ctx.messages = list
  ctx.add_generation_prompt = agp
  local ok, text = pcall(t.t.render, t.t, ctx, t.limits)
  if not ok then return nil, at_file(t.origin, text) end
  return text
end

-- The conversation as text (what the model's Jinja chat_template renders).
function M.format(tok, messages, opts)
  local t, ctx, msgs, agp = prepare(tok, messages, opts)
  local text, err = render_with(t, ctx, msgs, #msgs, agp)
  if not text then error("chat: " .. err, 2) end
  return text
end

local MARKERS = { "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<end_of_turn>", "<|end|>", "<|return|>", "<|call|>",
  "<｜end▁of▁sentence｜>", "</s>", "<|endoftext|>" }

-- The texts that end an assistant turn: the tokenizer's end-of-turn and EOS tokens, and the
-- known end markers its vocabulary has as added tokens.
local function end_markers(tok)
  local out, seen = {}, {}
  local function add(s) if s and s ~= "" and not seen[s] then seen[s] = true; out[#out + 1] = s end end
  local added = tok.added or {}
  add(added[tok.eot]); add(added[tok.eos])
  add(special_content(type(tok.config) == "table" and tok.config.eos_token or nil))
  for _, m in ipairs(MARKERS) do
    local id = tok.id and tok:id(m)
    if id and added[id] == m then add(m) end
  end
  return out
end

local ffi = require("ffi")
local bytes = ffi.typeof("const uint8_t *")

-- Length of the longest common prefix of strings a and b.
local function common_prefix(a, b)
  local n = math.min(#a, #b)
  local pa, pb = ffi.cast(bytes, a), ffi.cast(bytes, b)
  for i = 0, n - 1 do
    if pa[i] ~= pb[i] then return i end
  end
  return n
end

-- Trained byte ranges [a, b) of the rendering `full`, one per assistant message.
local function trained_ranges(tok, t, ctx, msgs, full)
  local markers = end_markers(tok)
  local turns = {}
  for i = 1, #msgs do
    local m = msgs[i]
    if values.is_attrs(m) and m.map.role == "assistant" then
      local before = render_with(t, ctx, msgs, i - 1, true) or render_with(t, ctx, msgs, i - 1, false)
      turns[#turns + 1] = { i = i, a = before and common_prefix(full, before) }
    end
  end
  local ranges, floor_at = {}, 0
  for k, turn in ipairs(turns) do
    local a = math.max(turn.a or floor_at, floor_at)
    -- the first end marker after the start, before the next assistant message starts
    local nxt = turns[k + 1] and turns[k + 1].a or #full
    local b
    for _, mk in ipairs(markers) do
      local s, e = full:find(mk, a + 1, true)
      if s and e <= nxt and (not b or e < b) then b = e end
    end
    if not b then
      -- no marker of its own (DeepSeek V3's tool call): the turn runs to where the next
      -- message's rendering starts, known when the messages through this one render as a
      -- prefix of the whole
      local upto = render_with(t, ctx, msgs, turn.i, false)
      if upto and #upto > a and #upto <= nxt and full:sub(1, #upto) == upto then b = #upto else b = nxt end
    end
    if b > a then ranges[#ranges + 1] = { a, b } end
    floor_at = b
  end
  return ranges
end

-- The rendered text and its trained byte ranges {{a, b}, ...} (0-based, end exclusive), one
-- per assistant message: what render's mask marks, before tokenization.
function M.spans(tok, messages, opts)
  local t, ctx, msgs, agp = prepare(tok, messages, opts)
  local text, err = render_with(t, ctx, msgs, #msgs, agp)
  if not text then error("chat: " .. err, 2) end
  return text, trained_ranges(tok, t, ctx, msgs, text)
end

-- What a template that cannot be used says at load rather than on every request: it does
-- not parse, or rendering a short conversation exceeds the render budget (clrt.jinja.budget:
-- a loop without end, a string doubled without end, a macro calling itself). One error naming
-- the file and line. A template's own raise_exception (it refuses these roles) is not an
-- error here, and neither is having no template (plain completions need none).
function M.check_template(tok)
  local ok, src, origin = pcall(M.template_source, tok)
  if not ok then
    if tostring(src):find("chat_template must be", 1, true) then error(src, 0) end
    return
  end
  local compiled, err = pcall(jinja.compile, src)
  if not compiled then error("chat: " .. at_file(origin, err), 0) end
  local probe = { { role = "user", content = "Hello, how are you?" }, { role = "assistant", content = "Fine, thanks." },
    { role = "user", content = "What is the plan for today?" } }
  local rendered, why = pcall(M.format, tok, probe, { add_generation_prompt = true })
  if not rendered then
    why = tostring(why)
    if why:find("ran more than", 1, true) or why:find("a string of more than", 1, true) or why:find("nested deeper than", 1, true)
      or why:find("stack overflow", 1, true) then
      error(why, 0)
    end
  end
end

-- ids of the rendered text (exactly tok:encode(text) without extra special tokens), a mask
-- (1 for tokens overlapping an assistant message's trained text), and the text.
function M.render(tok, messages, opts)
  local text, ranges = M.spans(tok, messages, opts)
  local ids = tok:encode(text, { add_special_tokens = false })
  local mask = {}
  local at, r = 0, 1
  for i, id in ipairs(ids) do
    local a = at
    local b = a + #tok:token_bytes(id)
    while ranges[r] and ranges[r][2] <= a do r = r + 1 end
    mask[i] = (ranges[r] and ranges[r][1] < b and a < ranges[r][2]) and 1 or 0
    at = b
  end
  if at ~= #text then
    -- the normalizer changes the text's length (SentencePiece-style "▁"): place each range
    -- by the token counts of the text before its ends (exact at special-token boundaries)
    for i = 1, #ids do mask[i] = 0 end
    for _, rg in ipairs(ranges) do
      local a = rg[1] > 0 and #tok:encode(text:sub(1, rg[1]), { add_special_tokens = false }) or 0
      local b = #tok:encode(text:sub(1, rg[2]), { add_special_tokens = false })
      for i = a + 1, math.min(b, #ids) do mask[i] = 1 end
    end
  end
  return ids, mask, text
end

-- The ids that end an assistant turn: the template's end-of-turn token, EOS, and every
-- eos_token_id of the folder's generation_config.json (transformers' generate stops on each:
-- Llama 3.1's <|eom_id|> and <|end_of_text|>, Qwen2.5's <|endoftext|>).
function M.stop_ids(tok)
  local ids, seen = {}, {}
  local all = { tok.eot, tok.eos }
  for _, id in ipairs(require("clrt.generation_config").stop_ids(tok.generation_config)) do all[#all + 1] = id end
  for i = 1, #all do
    local id = all[i]
    if id and not seen[id] then seen[id] = true; ids[#ids + 1] = id end
  end
  return ids
end

-- A generation's record (tokens, logprobs, finish_reason, text): printed short, so the REPL
-- and print(clrt.chat.generate(...)) show the reply and one line, not `table: 0x...`.
local RESULT = { __tostring = function(r)
  return ("(%d tokens, finish_reason %s)"):format(#(r.tokens or {}), tostring(r.finish_reason))
end }

-- One assistant reply as text: render with the generation prompt, sample until the end of
-- the turn, decode. opts go to m:generate (temperature, top_p, max_new_tokens, seed, stop,
-- n: with n > 1 a list of replies is returned). Also returns the raw generate entries.
function M.generate(m, tok, messages, opts)
  local usage = "clrt.chat.generate(m, tok, messages, opts)"
  if type(m) ~= "table" or type(m.generate) ~= "function" then
    error(("%s: m must be a model (clrt.model.load(dir)), got a %s"):format(usage, type(m)), 2)
  end
  if type(tok) ~= "table" or type(tok.encode) ~= "function" then
    error(("%s: tok must be a tokenizer (clrt.tokenizer.load(dir)), got a %s"):format(usage, type(tok)), 2)
  end
  if type(messages) ~= "table" or #messages == 0 then
    error(("%s: messages must be a non-empty list of {role =, content =} tables, got %s (for a text: m:chat(tok, text))")
      :format(usage, type(messages) == "table" and "an empty table" or "a " .. type(messages)), 2)
  end
  if opts ~= nil and type(opts) ~= "table" then error(("%s: opts must be a table, got a %s"):format(usage, type(opts)), 2) end
  opts = opts or {}
  local ids = M.render(tok, messages, { add_generation_prompt = true })
  local g = {}
  for k, v in pairs(opts) do g[k] = v end
  local stop = {}
  for _, id in ipairs(M.stop_ids(tok)) do stop[#stop + 1] = id end
  for _, s in ipairs(type(opts.stop) == "table" and opts.stop or { opts.stop }) do stop[#stop + 1] = s end
  g.stop, g.tokenizer = stop, tok
  local res = m:generate({ ids }, g)
  for _, r in ipairs(res) do setmetatable(r, RESULT) end
  if (opts.n or 1) == 1 then return res[1].text, res[1] end
  local texts = {}
  for i, r in ipairs(res) do texts[i] = r.text end
  return texts, res
end

return M
