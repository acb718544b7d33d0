-- clrt.data — datasets as JSONL files of plain Lua tables.
--   rows = data.read_jsonl(path)             -- a line that is not JSON: error "path:LINE: ..."
--   for i, row in data.lines(path) do ... end   -- streaming
--   data.write_jsonl(path, rows)             -- atomic: temp file, flush, rename
--   data.write_atomic(path, text)
--   data.shuffle(rows, seed_or_rng)          -- returns a shuffled copy (input untouched)
--   train, val = data.split(rows, 0.9, seed) -- seeded shuffle, then the first 90% / the rest
--   data.rng                                  -- clrt.rng (seeded xoshiro128**, savable state)
local json = require("clrt.json")
local rng = require("clrt.rng")
local M = { rng = rng, json = json }

local function open(path, mode)
  local f, err = io.open(path, mode)
  if not f then error("data: cannot open " .. tostring(err), 3) end
  return f
end

-- Iterate (line_number, row) over a JSONL file; blank lines are skipped.
function M.lines(path)
  local f = open(path, "rb")
  local n = 0
  return function()
    while true do
      local line = f:read("*l")
      if not line then f:close(); return nil end
      n = n + 1
      if line:sub(-1) == "\r" then line = line:sub(1, -2) end
      if line:find("%S") then
        local ok, row = pcall(json.decode, line)
        if not ok then
          f:close()
          error(("%s:%d: not a JSON line (%s)"):format(path, n, tostring(row)), 2)
        end
        return n, row
      end
    end
  end
end

function M.read_jsonl(path)
  local rows = {}
  for _, row in M.lines(path) do rows[#rows + 1] = row end
  return rows
end

local tmp_counter = 0

-- Write text to path so that readers see either the old file or the whole new one:
-- write a temporary sibling, flush and fsync it, then rename over the target.
function M.write_atomic(path, text)
  -- a unique sibling name without touching math.random (recipes may seed it)
  tmp_counter = tmp_counter + 1
  local tmp = ("%s.tmp.%s.%d"):format(path, tostring({}):match("0x(%x+)") or "0", tmp_counter)
  local f, err = io.open(tmp, "wb")
  if not f then error("data: cannot write " .. tostring(err), 2) end
  local ok, werr = f:write(text)
  if ok then ok, werr = f:flush() end
  if ok then
    -- fsync through the shell is not worth it; `sync FILE` exists in coreutils >= 8.24
    os.execute(("sync %q 2>/dev/null"):format(tmp))
  end
  f:close()
  if not ok then
    os.remove(tmp)
    error(("data: writing %s failed: %s"):format(path, tostring(werr)), 2)
  end
  local rok, rerr = os.rename(tmp, path)
  if not rok then
    os.remove(tmp)
    error(("data: cannot rename %s to %s: %s"):format(tmp, path, tostring(rerr)), 2)
  end
end

function M.encode_jsonl(rows)
  local out = {}
  for i, row in ipairs(rows) do
    local ok, line = pcall(json.encode, row)
    if not ok then error(("data: row %d cannot be written as JSON: %s"):format(i, line), 3) end
    out[i] = line
  end
  return table.concat(out, "\n") .. (#out > 0 and "\n" or "")
end

function M.write_jsonl(path, rows)
  M.write_atomic(path, M.encode_jsonl(rows))
end

-- Append rows to a JSONL file (logs; not atomic by design: each line is one write).
function M.append_jsonl(path, rows)
  local f = open(path, "ab")
  for _, row in ipairs(rows) do f:write(json.encode(row), "\n") end
  f:close()
end

local function as_rng(seed)
  if type(seed) == "table" and seed.next32 then return seed end
  return rng.new(seed or 0)
end

function M.shuffle(rows, seed)
  local out = {}
  for i = 1, #rows do out[i] = rows[i] end
  return as_rng(seed):shuffle(out)
end

-- Split a seeded shuffle into train (the first floor(frac * n + 0.5)) and validation (the rest).
function M.split(rows, frac, seed)
  if type(frac) ~= "number" or frac < 0 or frac > 1 then
    error("data.split: fraction must be in [0, 1], got " .. tostring(frac), 2)
  end
  local s = M.shuffle(rows, seed)
  local ntrain = math.floor(frac * #s + 0.5)
  local train, val = {}, {}
  for i = 1, #s do
    if i <= ntrain then train[#train + 1] = s[i] else val[#val + 1] = s[i] end
  end
  return train, val
end

-- Batches of `size` from a list, in order (the last one may be short).
function M.batches(rows, size)
  local i = 0
  return function()
    if i >= #rows then return nil end
    local b = {}
    for j = i + 1, math.min(i + size, #rows) do b[#b + 1] = rows[j] end
    i = i + size
    return b
  end
end

return M
