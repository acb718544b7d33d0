-- clrt.config — recipe configuration: a Lua table of defaults, overridden from the command
-- line the way verl/Hydra users expect.
--   local cfg = clrt.config.parse(defaults, arg)     -- arg[1..n] = "key.path=value" ...
--   print(clrt.config.dump(cfg))                     -- stable pretty JSON (sorted keys)
-- Rules:
--   key.path=value   overrides an existing key; an unknown key is an error naming the
--                    closest known key (edit distance over the full dotted paths).
--   +key.path=value  adds a key that the defaults do not have (an existing one is an error).
--   value            true/false -> boolean, nil/null -> nil, a decimal number -> number,
--                    {...} or [...] -> JSON, '...' or "..." -> that string, else the text.
--   The new value must have the default's type: a string default takes the raw text
--   (so name=123 stays "123"), a number default needs a number, a boolean true/false,
--   a table default JSON of a table. nil is accepted for any key (turns it off).
--   config.optional("string") as a default declares a key with no value (nil after
--   parsing) that accepts values of that type.
--   config.map{...} as a default declares a table whose keys are data, not settings (metric
--   weights, per-metric options): a config file's value replaces it whole, and
--   map.key=value (or map.key.sub=value) sets or adds an entry without '+'.
--   config=FILE      (anywhere in argv) a config file: a Lua file returning a table, or a
--                    .json file, merged over the defaults BEFORE the command line, so
--                    every key=value still wins (a Hydra-style config file). Its keys are
--                    checked like overrides (unknown key -> error naming the file).
local json = require("clrt.json")
local M = {}

local optional_mt = {}
function M.optional(kind)
  assert(kind == "string" or kind == "number" or kind == "boolean" or kind == "table",
         "config.optional: kind must be string, number, boolean or table")
  return setmetatable({ kind = kind }, optional_mt)
end
local function is_optional(v) return type(v) == "table" and getmetatable(v) == optional_mt end
M.is_optional = is_optional   -- a setting with no default (model=, data=): help lists it as unset

local map_mt = {}
function M.map(t)
  assert(type(t) == "table", "config.map: expects a table")
  return setmetatable(t, map_mt)
end
local function is_map(v) return type(v) == "table" and getmetatable(v) == map_mt end

local function deepcopy(v)
  if type(v) ~= "table" or is_optional(v) then return v end
  local out = {}
  for k, x in pairs(v) do out[k] = deepcopy(x) end
  return setmetatable(out, getmetatable(v))
end
M.deepcopy = deepcopy

-- Levenshtein distance, two rows.
function M.edit_distance(a, b)
  local prev, cur = {}, {}
  for j = 0, #b do prev[j] = j end
  for i = 1, #a do
    cur[0] = i
    local ca = a:byte(i)
    for j = 1, #b do
      local cost = (ca == b:byte(j)) and 0 or 1
      cur[j] = math.min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
    end
    prev, cur = cur, prev
  end
  return prev[#b]
end

-- Every dotted path in a table of defaults (inner tables and their leaves).
local function paths(t, prefix, out)
  out = out or {}
  for k, v in pairs(t) do
    local p = prefix and (prefix .. "." .. tostring(k)) or tostring(k)
    out[#out + 1] = p
    if type(v) == "table" and not is_optional(v) and not is_map(v) then paths(v, p, out) end
  end
  return out
end

-- The known key a mistyped one most likely meant: one that starts with it (a key cut short:
-- rollout.num_repeat -> rollout.num_repeat_rollouts) or ends with it (a missing table:
-- n -> rollout.n), the shortest such; else the nearest by edit distance.
local function closest(known, key)
  local best, bestd
  table.sort(known)
  for _, p in ipairs(known) do
    if p:sub(1, #key) == key or p:sub(-#key - 1) == "." .. key then
      if not best or #p < #best then best = p end
    end
  end
  if best then return best end
  for _, p in ipairs(known) do
    local d = M.edit_distance(key, p)
    if not bestd or d < bestd then best, bestd = p, d end
  end
  return best
end

function M.parse_value(text)
  if text == "true" then return true end
  if text == "false" then return false end
  if text == "nil" or text == "null" then return nil end
  if text:match("^[-+]?%d+%.?%d*[eE][-+]?%d+$") or text:match("^[-+]?%d+%.?%d*$")
     or text:match("^[-+]?%.%d+[eE]?[-+]?%d*$") then
    local n = tonumber(text)
    if n then return n end
  end
  local first = text:sub(1, 1)
  if first == "{" or first == "[" then return json.decode(text, "value") end
  if #text >= 2 and (first == "'" or first == '"') and text:sub(-1) == first then
    return text:sub(2, -2)
  end
  return text
end

local function typename(v)
  if is_optional(v) then return v.kind end
  return type(v)
end

-- Convert the parsed value to the default's type or raise.
local function coerce(key, default, raw, parsed)
  if parsed == nil then return nil end
  local want = typename(default)
  if want == "nil" then return parsed end
  if want == "string" then
    if type(parsed) == "table" then
      error(("config: %s expects a string, got %s"):format(key, raw), 0)
    end
    if raw:match("^'.*'$") or raw:match('^".*"$') then return parsed end
    return raw
  end
  if type(parsed) ~= want then
    error(("config: %s expects a %s (default %s), got '%s'"):format(
      key, want, is_optional(default) and "none" or json.encode(default), raw), 0)
  end
  if is_map(default) then return M.map(parsed) end
  return parsed
end

-- Apply one "key.path=value" (or "+key.path=value") to cfg; `known` lists default paths.
local function apply(cfg, known, item)
  if type(item) ~= "string" then error("config: argument is not a string", 0) end
  local add = item:sub(1, 1) == "+"
  local body = add and item:sub(2) or item
  local eq = body:find("=", 1, true)
  if not eq then
    error(("config: '%s' is not key.path=value"):format(item), 0)
  end
  local key, raw = body:sub(1, eq - 1), body:sub(eq + 1)
  if key == "" or key:find("..", 1, true) or key:match("^%.") or key:match("%.$") then
    error(("config: bad key '%s' in '%s'"):format(key, item), 0)
  end
  local parts = {}
  for p in key:gmatch("[^.]+") do parts[#parts + 1] = p end
  local t, in_map = cfg, false
  for i = 1, #parts - 1 do
    local k = parts[i]
    if type(t) == "table" and #t > 0 and tonumber(k) then k = tonumber(k) end
    in_map = in_map or is_map(t)
    local nxt = t[k]
    if in_map and type(nxt) ~= "table" then   -- inside a map any path is data: make it
      nxt = {}
      t[k] = nxt
    elseif nxt == nil and add then
      nxt = {}
      t[k] = nxt
    elseif type(nxt) ~= "table" or is_optional(nxt) then
      if nxt == nil then
        local c = closest(known, key)
        error(("config: unknown key '%s'%s (use +%s=... to add a new key)"):format(
          key, c and ("; did you mean '" .. c .. "'?") or "", key), 0)
      end
      error(("config: '%s' is a %s, not a table, so '%s' cannot be set"):format(
        table.concat(parts, ".", 1, i), typename(nxt), key), 0)
    end
    t = nxt
  end
  local last = parts[#parts]
  if #t > 0 and tonumber(last) then last = tonumber(last) end
  local pok, parsed = pcall(M.parse_value, raw)
  if not pok then
    error(("config: %s=%s is not valid JSON (%s)"):format(key, raw, tostring(parsed):gsub("^.-:%d+: ", "")), 0)
  end
  local exists = t[last] ~= nil
  if in_map or is_map(t) then
    t[last] = parsed
    return
  end
  if add then
    if exists then
      error(("config: '+%s' adds a key, but '%s' already exists (drop the '+')"):format(key, key), 0)
    end
    t[last] = parsed
    return
  end
  if not exists then
    local c = closest(known, key)
    error(("config: unknown key '%s'%s (use +%s=... to add a new key)"):format(
      key, c and ("; did you mean '" .. c .. "'?") or "", key), 0)
  end
  t[last] = coerce(key, t[last], raw, parsed)
end

-- Resolve optional placeholders that were never set to nil.
local function strip(t)
  for k, v in pairs(t) do
    if is_optional(v) then t[k] = nil
    elseif type(v) == "table" then strip(v) end
  end
  return t
end

-- Merge table `src` (from `where`) into cfg: settings tables merge key by key; maps, lists
-- and leaves are replaced; every key must exist and keep its type.
local function merge(cfg, src, where, prefix, known)
  known = known or paths(cfg)
  for k, v in pairs(src) do
    local key = prefix and (prefix .. "." .. tostring(k)) or tostring(k)
    local cur = cfg[k]
    if cur == nil then
      local c = closest(known, key)
      error(("config: %s: unknown key '%s'%s"):format(where, key, c and ("; did you mean '" .. c .. "'?") or ""), 0)
    end
    if type(cur) == "table" and not is_optional(cur) and not is_map(cur) and #cur == 0 then
      if type(v) ~= "table" then
        error(("config: %s: '%s' is a table of settings, got %s"):format(where, key, type(v)), 0)
      end
      merge(cur, v, where, key, known)
    else
      local want = typename(cur)
      if want ~= "nil" and type(v) ~= want then
        error(("config: %s: '%s' expects a %s, got %s"):format(where, key, want, type(v)), 0)
      end
      cfg[k] = is_map(cur) and M.map(deepcopy(v)) or v
    end
  end
end

-- Read a config file: a Lua chunk returning a table, or JSON (.json).
function M.read_file(path)
  if tostring(path):match("%.json$") then return M.load(path) end
  local chunk, err = loadfile(path)
  if not chunk then error("config: cannot read config file " .. tostring(err), 0) end
  local ok, t = pcall(chunk)
  if not ok then error(("config: %s failed: %s"):format(path, tostring(t)), 0) end
  if type(t) ~= "table" then error(("config: %s must return a table, got %s"):format(path, type(t)), 0) end
  return t
end

-- The value of `key=...` among argv, if given (e.g. to tell whether model= was set).
function M.arg_value(argv, key)
  for i = 1, #(argv or {}) do
    local k, v = tostring(argv[i]):match("^%+?([^=]+)=(.*)$")
    if k == key then return v end
  end
  return nil
end

-- defaults, then `base` (a table, e.g. a recipe's world settings, or nil), then every
-- config=FILE in argv, then the other key=value arguments in order.
function M.parse(defaults, argv, base)
  assert(type(defaults) == "table", "config.parse: defaults must be a table")
  local cfg = deepcopy(defaults)
  local known = paths(defaults)
  if base then merge(cfg, base, "base config") end
  local rest = {}
  for i = 1, #(argv or {}) do
    local file = type(argv[i]) == "string" and argv[i]:match("^config=(.+)$")
    if file then merge(cfg, M.read_file(file), file) else rest[#rest + 1] = argv[i] end
  end
  for i = 1, #rest do apply(cfg, known, rest[i]) end
  return strip(cfg)
end

-- The value at a dotted path ("rollout.n") of a config, or nil.
function M.get(cfg, path)
  local t = cfg
  for part in path:gmatch("[^.]+") do
    if type(t) ~= "table" then return nil end
    t = t[part]
  end
  return t
end

-- Continue from a saved config (a run folder's config.json): every key takes the saved
-- value (a key the saved run left unset stays unset, not the default), then argv overrides
-- it as in parse. Keys listed in `fixed` (dotted paths) may not change: an override that
-- changes one is an error naming it. Returns cfg and the list of changes
-- {"steps: 10 -> 20", ...}.
function M.resume(defaults, saved, argv, fixed, who)
  local cfg = deepcopy(defaults)
  local function overlay(t, src)
    for k, v in pairs(t) do
      local sv = nil
      if type(src) == "table" then sv = src[k] end
      if type(v) == "table" and not is_optional(v) and not is_map(v) and #v == 0 then
        overlay(v, sv)
      elseif sv == nil then
        -- not in the saved config: an optional key was unset; any other is newer than the run
        -- (config.json holds every set key) and keeps its default, which is the behaviour the
        -- run had before the key existed
      elseif is_map(v) then
        t[k] = M.map(deepcopy(sv))
      else
        t[k] = sv
      end
    end
  end
  overlay(cfg, saved)
  local resumed = deepcopy(cfg)   -- the run's settings, newer keys at their defaults
  strip(resumed)
  local known = paths(defaults)
  for i = 1, #(argv or {}) do
    if type(argv[i]) == "string" and argv[i]:match("^config=") then
      error(("%s: config=FILE cannot be given with resume= (the run's own config.json is used; override single keys)"):format(who or "config"), 0)
    end
    apply(cfg, known, argv[i])
  end
  strip(cfg)
  local function same(a, b)
    if type(a) ~= type(b) then return false end
    if type(a) ~= "table" then return a == b end
    for k, v in pairs(a) do if not same(v, b[k]) then return false end end
    for k in pairs(b) do if a[k] == nil then return false end end
    return true
  end
  local show = function(v) return v == nil and "unset" or (type(v) == "table" and json.encode(v) or tostring(v)) end
  for _, path in ipairs(fixed or {}) do
    local a, b = M.get(resumed, path), M.get(cfg, path)
    if not same(a, b) then
      error(("%s: resume: %s cannot change when a run continues (the run has %s, got %s); start a new run instead")
        :format(who or "config", path, show(a), show(b)), 0)
    end
  end
  local changes = {}
  local function diff(a, b, prefix)
    local keys, seen = {}, {}
    for k in pairs(a or {}) do if not seen[k] then seen[k] = true; keys[#keys + 1] = k end end
    for k in pairs(b or {}) do if not seen[k] then seen[k] = true; keys[#keys + 1] = k end end
    table.sort(keys, function(x, y) return tostring(x) < tostring(y) end)
    for _, k in ipairs(keys) do
      local p = prefix and (prefix .. "." .. tostring(k)) or tostring(k)
      local x, y = a and a[k], b and b[k]
      if type(x) == "table" and type(y) == "table" and not json.is_array(x) and next(x) ~= nil then
        diff(x, y, p)
      elseif not same(x, y) then
        changes[#changes + 1] = ("%s: %s -> %s"):format(p, show(x), show(y))
      end
    end
  end
  diff(saved, cfg, nil)
  return cfg, changes
end

-- Checks of a parsed config against declared kinds: rules is a list of {path, kind[, arg]}:
--   "count"     an integer >= 1          "count0"  an integer >= 0
--   "rate"      a finite number > 0      "nonneg"  a finite number >= 0
--   "finite"    any finite number        "prob"    a number in [0, 1]
--   "fraction"  a number in (0, 1]       "one_of"  one of the strings in arg
-- A nil value passes (optional keys). Every failing key gives one line "who: KEY must be
-- ..., got VALUE"; all of them are raised together.
local KIND_TEXT = {
  count = "an integer >= 1", count0 = "an integer >= 0", rate = "a finite number > 0",
  nonneg = "a finite number >= 0", finite = "a finite number", prob = "a number in [0, 1]",
  fraction = "a number in (0, 1]",
}
local function finite(v) return type(v) == "number" and v == v and v ~= math.huge and v ~= -math.huge end
local KIND_OK = {
  count = function(v) return finite(v) and v >= 1 and v == math.floor(v) end,
  count0 = function(v) return finite(v) and v >= 0 and v == math.floor(v) end,
  rate = function(v) return finite(v) and v > 0 end,
  nonneg = function(v) return finite(v) and v >= 0 end,
  finite = finite,
  prob = function(v) return finite(v) and v >= 0 and v <= 1 end,
  fraction = function(v) return finite(v) and v > 0 and v <= 1 end,
}
function M.check(cfg, rules, who)
  local errs = {}
  for _, r in ipairs(rules) do
    local path, kind, arg = r[1], r[2], r[3]
    local v = M.get(cfg, path)
    if v ~= nil then
      local shown = type(v) == "table" and json.encode(v) or (type(v) == "string" and ("'" .. v .. "'") or tostring(v))
      if kind == "one_of" then
        local okk = false
        for _, a in ipairs(arg) do if v == a then okk = true end end
        if not okk then
          errs[#errs + 1] = ("%s: %s must be one of %s, got %s"):format(who, path, table.concat(arg, ", "), shown)
        end
      elseif not KIND_OK[kind](v) then
        errs[#errs + 1] = ("%s: %s must be %s, got %s"):format(who, path, KIND_TEXT[kind], shown)
      end
    end
  end
  if #errs > 0 then error(table.concat(errs, "\n"), 0) end
end

function M.dump(cfg)
  return json.encode(cfg, { pretty = true }) .. "\n"
end

-- Read a config saved by dump (a run folder's config.json).
function M.load(path)
  local f, err = io.open(path, "rb")
  if not f then error("config: cannot open " .. tostring(err), 0) end
  local s = f:read("*a")
  f:close()
  return json.decode(s, path)
end

return M
