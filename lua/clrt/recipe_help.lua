-- clrt.recipe_help — what `clrt recipes/X.lua --help` and `print_config=true` print: every
-- setting with its default (the world's settings file included, as a run without arguments
-- would use it) and the one-line comment it carries where it is declared, or the resolved
-- config of a command line as JSON, without running anything.
--
--   if recipe_help.handle(who, "recipes.collabllm_rl", argv, parse_args) then return end
local json = require("clrt.json")

local M = {}

-- Braces opened minus closed in a line's code (its comment and strings left out).
local function net_braces(code)
  code = code:gsub('"[^"]*"', ""):gsub("'[^']*'", ""):gsub("%-%-.*$", "")
  return select(2, code:gsub("{", "")) - select(2, code:gsub("}", ""))
end

-- Declarations' comments in Lua source: `key = value, -- comment` at any depth, under the
-- dotted path of the enclosing `name = {` lines (`M.rollout = {` counts as rollout; a line
-- `D.rollout.n = 8` as rollout.n): kept for every tail of two names or more, and for the name
-- alone at a table's first level.
function M.comments(text, into)
  into = into or { path = {}, leaf = {}, links = {} }
  local stack = {}
  for line in (text .. "\n"):gmatch("([^\n]*)\n") do
    local dotted, rest = line:match("^%s*([%a_][%w_.]*)%s*=%s*(.*)$")
    local key = dotted and dotted:match("([%w_]+)$")
    if key and not dotted:match("^local%s") then
      local comment = rest:match("%-%-%s*(.-)%s*$")
      local in_preset = false   -- a preset's values (M.PRESETS.authors) describe that preset, not the default
      for _, name in ipairs(stack) do in_preset = in_preset or name == "PRESETS" end
      in_preset = in_preset or key == "PRESETS"
      -- `rollout = { n = 8,  -- why`: the comment is the inner key's
      local inner
      local body = rest:match("^{(.*)")
      if body then
        for k in body:gsub("%-%-.*$", ""):gmatch("([%a_][%w_]*)%s*=") do inner = k end
      end
      if comment and comment ~= "" and not in_preset then
        local where, name, dotted_line = stack, key, false
        if inner then
          where = { unpack(stack) }
          where[#where + 1], name = key, inner
        elseif #stack == 0 and select(2, dotted:gsub("%.", "")) >= 2 then
          -- `D.rollout.temperature = 0.8  -- why`: the path after the table's own name
          where = {}
          for part in dotted:gmatch("[%w_]+") do where[#where + 1] = part end
          table.remove(where, 1)
          where[#where] = nil
          dotted_line = true   -- a path only: its last name alone is another table's key
        end
        for i = 1, #where do
          local p = table.concat(where, ".", i) .. "." .. name
          into.path[p] = into.path[p] or comment
        end
        if #where <= 1 and not dotted_line then into.leaf[name] = into.leaf[name] or comment end
      end
      -- `lora = require("clrt.train.lora").config(),`: that module's config() declares them
      local linked = rest:match("^require%(%s*[\"']([%w_.]+)[\"']%s*%)%.config%(%)")
      if linked then
        local where = { unpack(stack) }
        where[#where + 1] = key
        for i = 1, #where do into.links[table.concat(where, ".", i)] = into.links[table.concat(where, ".", i)] or linked end
      end
      local net = net_braces(rest)
      if net > 0 then
        -- `PRESETS = { authors = { rollout = {`: each table the line leaves open, by name
        stack[#stack + 1] = key
        local opened = {}
        for name in (rest:gsub("%-%-.*$", "")):gmatch("([%a_][%w_]*)%s*=%s*{") do opened[#opened + 1] = name end
        for i = 1, net - 1 do stack[#stack + 1] = opened[#opened - (net - 1) + i] or "?" end
      end
      for _ = 1, -net do stack[#stack] = nil end   -- `top_k = 50 },`: the line closes its table
    else
      for _ = 1, -net_braces(line) do stack[#stack] = nil end
    end
  end
  return into
end

local config = require("clrt.config")

-- path -> value of every leaf; a setting with no default (config.optional) as {unset = kind}
local function flatten(t, prefix, out)
  for k, v in pairs(t) do
    local p = prefix .. tostring(k)
    if config.is_optional(v) then out[p] = out[p] or { unset = v.kind }
    elseif type(v) == "table" and next(v) ~= nil and #v == 0 then flatten(v, p .. ".", out)
    elseif not (type(v) == "table" and next(v) == nil and out[p]) then out[p] = v end
  end
  return out
end

local function rows_of(defaults, cfg)
  local all = flatten(cfg, "", {})
  for p, v in pairs(flatten(defaults or {}, "", {})) do
    if all[p] == nil and type(v) == "table" and v.unset then all[p] = v end
  end
  local rows = {}
  for p, v in pairs(all) do
    local parent_of_another = false   -- an empty table whose settings are all unset: listed by them
    if type(v) == "table" and next(v) == nil then
      for q in pairs(all) do parent_of_another = parent_of_another or q:sub(1, #p + 1) == p .. "." end
    end
    if not parent_of_another then rows[#rows + 1] = { p, v } end
  end
  table.sort(rows, function(a, b) return a[1] < b[1] end)
  return rows
end

local function source_of(module)
  local path = package.searchpath(module, package.path)
  local f = path and io.open(path)
  if not f then return "" end
  local text = f:read("*a")
  f:close()
  return text
end

-- A module's config() declarations (`return { key = value, -- why`), as comments under "config".
local linked_cache = {}
local function config_comments(module)
  if linked_cache[module] == nil then
    local body = source_of(module):match("\nfunction M%.config%(%)\n(.-)\nend\n")
    linked_cache[module] = body and M.comments((body:gsub("return%s*{", "config = {", 1))) or false
  end
  return linked_cache[module] or nil
end

local function comment_for(c, path)
  local parts = {}
  for s in path:gmatch("[^.]+") do parts[#parts + 1] = s end
  for i = #parts - 1, 1, -1 do   -- a table another module's config() declares: its comment there
    local mod = c.links and c.links[table.concat(parts, ".", 1, i)]
    local sub = mod and config_comments(mod)
    if sub then
      local note = comment_for(sub, "config." .. table.concat(parts, ".", i + 1))
      if note then return note end
    end
  end
  for i = 1, #parts - 1 do   -- the longest declared tail of the path; a first-level name alone
    local suffix = table.concat(parts, ".", i)
    if c.path[suffix] then return c.path[suffix] end
  end
  return #parts == 1 and c.leaf[parts[1]] or nil
end


local function show(v)
  if type(v) == "table" and v.unset then return "(unset: " .. v.unset .. ")" end
  local ok, s = pcall(json.encode, v)
  return ok and s or tostring(v)
end

-- The help text: one line per setting, `path = default   comment`.
function M.text(who, module, cfg)
  local c = M.comments(source_of(module))
  M.comments(source_of("clrt.train.defaults"), c)
  local ok, recipe = pcall(require, module)   -- a recipe returns its table when required by name
  local rows, width = rows_of(ok and type(recipe) == "table" and recipe.defaults or nil, cfg), 0
  for _, r in ipairs(rows) do width = math.max(width, #r[1] + #show(r[2]) + 3) end
  width = math.min(width, 60)
  local out = { ("usage: clrt recipes/%s.lua [key.path=value ...] [config=FILE] [print_config=true]"):format(who),
    "settings (default; a value is JSON or plain text):" }
  for _, r in ipairs(rows) do
    local left = ("  %s = %s"):format(r[1], show(r[2]))
    local note = comment_for(c, r[1])
    out[#out + 1] = note and (left .. string.rep(" ", math.max(1, width - #left + 2)) .. "-- " .. note) or left
  end
  return table.concat(out, "\n")
end

-- --help / -h: the settings; print_config=true: the resolved config as JSON. Either prints
-- and returns true (the recipe then returns without running); else false.
function M.handle(who, module, argv, parse_args)
  local rest, print_config = {}, false
  for _, a in ipairs(argv) do
    if a == "--help" or a == "-h" then
      print(M.text(who, module, parse_args({})))
      return true
    elseif a == "print_config=true" then print_config = true
    elseif a ~= "print_config=false" then rest[#rest + 1] = a end
  end
  if not print_config then return false end
  io.write(require("clrt.config").dump(parse_args(rest)))
  return true
end

return M
