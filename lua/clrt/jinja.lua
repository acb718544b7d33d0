-- clrt.jinja — the Jinja dialect of Hugging Face chat templates, rendered byte for byte as
-- @huggingface/jinja (the engine of transformers.js and the Hub) renders it.
--   local t = clrt.jinja.compile(source)        -- parsed once; cached by source text
--   local s = t:render({ messages = {...}, add_generation_prompt = true, bos_token = "<s>" })
-- Context values are Lua data (tables from clrt.json keep their key order; nil/json.null is
-- none) or values already converted with clrt.jinja.values.from_lua (to convert once and
-- render many times). Errors: "chat template line N: what" for syntax the engine does not
-- support, a failed operation, or the template's own raise_exception.
-- What is supported and where it departs from Python's Jinja: docs/chat_templates.md.
local lexer = require("clrt.jinja.lexer")
local parser = require("clrt.jinja.parser")
local evaluator = require("clrt.jinja.eval")
local builtins = require("clrt.jinja.builtins")
local values = require("clrt.jinja.values")

local M = { values = values }

local Template = {}
Template.__index = Template

-- Parsed templates by source text; a process uses a handful, the bound only guards against
-- a caller that makes templates on the fly.
local cache, cached = {}, 0
local CACHE_MAX = 64

function M.compile(source)
  if type(source) ~= "string" then error("clrt.jinja.compile: the template must be a string", 2) end
  local t = cache[source]
  if t then return t end
  t = setmetatable({ source = source, program = parser.parse(lexer.tokenize(source)) }, Template)
  if cached >= CACHE_MAX then cache, cached = {}, 0 end
  cache[source] = t
  cached = cached + 1
  return t
end

local globals = builtins.globals()      -- read-only: renders set names in their own scopes
local globals_mt = { __index = globals }

-- ctx: name -> Lua value or template value. limits: clrt.jinja.budget's (steps, output
-- bytes, scope depth, a tick to yield in); its generous defaults when nil.
function Template:render(ctx, limits)
  local vars = setmetatable({}, globals_mt)
  for k, v in pairs(ctx or {}) do vars[k] = values.from_lua(v) end
  return evaluator.run(self.program, vars, limits)
end

function M.render(source, ctx) return M.compile(source):render(ctx) end

return M
