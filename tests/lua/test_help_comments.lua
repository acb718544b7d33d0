-- help(x) prints the comment above a function (clrt.cli.help): a comment that opens with
-- another function's call form (`set_matmul(...)` above `copy_repacks`) is that function's,
-- left behind when code moved between them. No function of lua/ may carry one.
local T = require("clrt.test")
local files = require("clrt.files")

local function lua_files(dir, out)
  for _, n in ipairs(files.list(dir)) do
    local p = dir .. "/" .. n
    if files.is_dir(p) then lua_files(p, out) elseif n:match("%.lua$") then out[#out + 1] = p end
  end
  return out
end

-- {file:line, function, the name the comment opens with} for each misplaced comment of a text
local function misplaced(path, text)
  local lines, defined = {}, {}
  for l in (text .. "\n"):gmatch("([^\n]*)\n") do
    lines[#lines + 1] = l
    local name = l:match("^function%s+[%w_.:]-([%w_]+)%s*%(") or l:match("^local%s+function%s+([%w_]+)%s*%(")
    if name then defined[name] = true end
  end
  local out = {}
  for i, l in ipairs(lines) do
    local name = l:match("^function%s+[%w_.:]-([%w_]+)%s*%(")
    if name then
      local j = i - 1
      while j > 1 and lines[j - 1]:match("^%-%-") do j = j - 1 end
      local first = lines[j] and lines[j]:match("^%-%-%s*(.*)$")
      local opens = first and first:match("^[%w_.:]-([%w_]+)%(")
      if opens and opens ~= name and defined[opens] then out[#out + 1] = ("%s:%d %s carries %s's comment"):format(path, i, name, opens) end
    end
  end
  return out
end

T.case("the checker finds a comment left above the wrong function", function()
  local text = "-- set_matmul(kind): the precision.\nfunction M.copy_repacks() end\n\nfunction M.set_matmul(kind) end\n"
  T.eq(misplaced("x.lua", text), { "x.lua:2 copy_repacks carries set_matmul's comment" })
  T.eq(misplaced("y.lua", "-- set_matmul(kind): the precision.\nfunction M.set_matmul(kind) end\n"), {})
end)

T.case("no function of lua/ carries another function's doc comment", function()
  local bad = {}
  for _, p in ipairs(lua_files(T.source_dir() .. "/lua", {})) do
    for _, b in ipairs(misplaced(p:sub(#T.source_dir() + 2), T.read(p))) do bad[#bad + 1] = b end
  end
  T.eq(bad, {})
end)

T.run()
