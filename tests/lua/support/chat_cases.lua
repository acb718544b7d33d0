-- support.chat_cases — seeded conversations for the chat-template tests: system or not,
-- multi-turn, tool calls (arguments as a JSON string or an object) and tool results,
-- reasoning (reasoning_content or an inline <think> block), Unicode whitespace (U+00A0,
-- U+3000, U+2003, tabs, newlines) around content, ending on a user or an assistant turn.
--   local cases = require("support.chat_cases").make(seed, n, {tools = true, reasoning = true})
--   (ascii = true: only ASCII whitespace around content)
--   -- each: {messages = {...}, opts = {add_generation_prompt =, tools =, enable_thinking =}}
local M = {}

local function rng(seed)
  local s = seed % 2147483647
  if s <= 0 then s = s + 2147483646 end
  return function(n)             -- 1..n
    s = (s * 48271) % 2147483647
    return s % n + 1
  end
end

local WORDS = { "hello", "What is 2+2?", "Plan a trip to Lyon.", "中文 ok", "émoji 🙂 here", "two\nlines", "x",
  "quote \" and \\ backslash", "<b>tag</b>", "{{ not jinja }}", "{% if %}", "4.", "Sure, here it is:",
  "tabs\tinside", "Ünïcödé", "ends with space ", "the answer is 42", "- a list\n- of items", "" }
local PADS = { "", "", "", " ", "\n", "  \n", "\194\160", "\227\128\128", "\226\128\131", "\t", "\n\n", " \194\160 " }

M.TOOLS = {
  { type = "function", ["function"] = { name = "get_weather", description = "Weather in a city, now.",
    parameters = { type = "object", properties = { city = { type = "string", description = "City name" },
      days = { type = "integer", minimum = 1 } }, required = { "city" } } } },
  { type = "function", ["function"] = { name = "ping", description = "Check the service.",
    parameters = { type = "object", properties = {} } } },
}

function M.make(seed, n, o)
  o = o or {}
  local r = rng(seed)
  local function pick(t) return t[r(#t)] end
  local function words()
    local k, out = r(3), {}
    for i = 1, k do out[i] = pick(WORDS) end
    return table.concat(out, pick({ " ", "\n", " ", "" }))
  end
  local pads = o.ascii and { "", "", " ", "\n", "  \n", "\t" } or PADS
  local function content() return pick(pads) .. words() .. pick(pads) end
  local call_n = 0
  local function tool_call()
    call_n = call_n + 1
    local args
    if r(2) == 1 then args = r(2) == 1 and '{"city": "Paris"}' or '{"city": "Zürich", "days": 2}'
    else args = r(2) == 1 and { city = "Paris", days = 3 } or { city = "東京" } end
    local name = r(3) == 1 and "ping" or "get_weather"
    if name == "ping" then args = r(2) == 1 and "{}" or {} end
    return { id = "call_" .. call_n, type = "function", ["function"] = { name = name, arguments = args } }
  end
  local cases = {}
  for c = 1, n do
    local msgs = {}
    if r(2) == 1 then msgs[#msgs + 1] = { role = "system", content = content() } end
    local turns = r(4)
    local end_on_user = r(2) == 1
    local tools_used = false
    for t = 1, turns do
      msgs[#msgs + 1] = { role = "user", content = content() }
      if t < turns or not end_on_user then
        local kind = r(6)
        if o.tools and kind == 1 then
          tools_used = true
          local calls = {}
          for k = 1, (r(3) == 1 and 2 or 1) do calls[k] = tool_call() end
          local m = { role = "assistant", tool_calls = calls }
          if r(2) == 1 then m.content = r(2) == 1 and "" or content() end
          msgs[#msgs + 1] = m
          for k = 1, #calls do
            msgs[#msgs + 1] = { role = "tool", tool_call_id = calls[k].id, content = r(2) == 1 and '{"temp": 21}' or content() }
          end
          if t < turns or r(2) == 1 then msgs[#msgs + 1] = { role = "assistant", content = content() } end
        elseif o.reasoning and kind == 2 then
          msgs[#msgs + 1] = { role = "assistant", content = content(), reasoning_content = r(3) == 1 and "" or words() }
        elseif o.reasoning and kind == 3 then
          msgs[#msgs + 1] = { role = "assistant", content = "<think>" .. pick({ "\n", "" }) .. words() .. pick({ "\n", "" }) ..
            "</think>" .. pick({ "\n\n", "", "\n" }) .. content() }
        else
          msgs[#msgs + 1] = { role = "assistant", content = content() }
        end
      end
    end
    local opts = { add_generation_prompt = end_on_user and r(5) > 1 or r(4) == 1 }
    if o.tools and (tools_used or r(3) == 1) then opts.tools = M.TOOLS end
    if o.reasoning then
      local e = r(3)
      if e == 1 then opts.enable_thinking = false elseif e == 2 then opts.enable_thinking = true end
    end
    cases[c] = { messages = msgs, opts = opts }
  end
  return cases
end

return M
