-- bench/args.lua — the benchmarks' command line: key=value arguments over a table of
-- defaults (numbers stay numbers), and comma lists of numbers.
--   local opts = dofile(dir .. "/args.lua").parse({ n = 64, levels = "1,8,32" }, arg)
--   for _, c in ipairs(args.numbers(opts.levels)) do ... end
local M = {}

function M.parse(defaults, argv)
  for _, a in ipairs(argv or {}) do
    local k, v = a:match("^([%w_]+)=(.*)$")
    if k and defaults[k] ~= nil then defaults[k] = tonumber(v) or v end
  end
  return defaults
end

function M.numbers(list)
  local out = {}
  for v in tostring(list):gmatch("%d+") do out[#out + 1] = tonumber(v) end
  return out
end

return M
