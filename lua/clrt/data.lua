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
  if not f then error("data: cannot open " .. tostring(err), 0) end
  return f
end

-- Invalid UTF-8 in a line replaced by U+FFFD: the fixed text and how many bytes were bad.
local REPLACEMENT = "\239\191\189"
function M.fix_utf8(s)
  if not s:find("[\128-\255]") then return s, 0 end
  local out, bad, i, n = {}, 0, 1, #s
  while i <= n do
    local c = s:byte(i)
    local len, lo, hi = 0, 0x80, 0xBF
    if c < 0x80 then len = 1
    elseif c >= 0xC2 and c <= 0xDF then len = 2
    elseif c >= 0xE0 and c <= 0xEF then len = 3
      if c == 0xE0 then lo = 0xA0 elseif c == 0xED then hi = 0x9F end
    elseif c >= 0xF0 and c <= 0xF4 then len = 4
      if c == 0xF0 then lo = 0x90 elseif c == 0xF4 then hi = 0x8F end
    end
    local ok = len > 0 and i + len - 1 <= n
    if ok and len > 1 then
      local c2 = s:byte(i + 1)
      ok = c2 >= lo and c2 <= hi
      for k = i + 2, i + len - 1 do ok = ok and s:byte(k) >= 0x80 and s:byte(k) <= 0xBF end
    end
    if ok then
      out[#out + 1] = s:sub(i, i + len - 1)
      i = i + len
    else
      out[#out + 1] = REPLACEMENT
      bad = bad + 1
      i = i + 1
    end
  end
  return table.concat(out), bad
end

-- Iterate (line_number, row) over a JSONL file; blank lines are skipped but counted, so the
-- numbers are the file's own. A UTF-8 byte-order mark is skipped; invalid UTF-8 is replaced
-- by U+FFFD and counted in stats.bad_utf8_lines (when a stats table is given).
function M.lines(path, stats)
  local f = open(path, "rb")
  local n = 0
  return function()
    while true do
      local line = f:read("*l")
      if not line then f:close(); return nil end
      n = n + 1
      if n == 1 and line:sub(1, 3) == "\239\187\191" then line = line:sub(4) end
      if line:sub(-1) == "\r" then line = line:sub(1, -2) end
      if line:find("%S") then
        local fixed, bad = M.fix_utf8(line)
        if bad > 0 and stats then stats.bad_utf8_lines = (stats.bad_utf8_lines or 0) + 1 end
        local ok, row = pcall(json.decode, fixed)
        if not ok then
          f:close()
          error(("%s:%d: not a JSON line (%s)"):format(path, n, tostring(row):gsub("^.-:%d+: ", "")), 0)
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

-- A data set for training: its rows and each row's line number. An empty file (no row) is
-- an error; invalid UTF-8 is replaced and reported once through warn(msg) (io.stderr).
function M.read_dataset(path, warn)
  local rows, line_of, stats = {}, {}, {}
  for n, row in M.lines(path, stats) do
    rows[#rows + 1] = row
    line_of[#rows] = n
  end
  if #rows == 0 then error(("%s: the data file has no rows"):format(path), 0) end
  if (stats.bad_utf8_lines or 0) > 0 then
    local msg = ("%s: %d lines held invalid UTF-8, replaced by U+FFFD"):format(path, stats.bad_utf8_lines)
    if warn then warn(msg) else io.stderr:write("warning: ", msg, "\n") end
  end
  return rows, line_of
end

-- Write text to path so that readers see either the old file or the whole new one
-- (clrt.files.write_atomic: a temporary sibling, fsync, rename).
function M.write_atomic(path, text)
  require("clrt.files").write_atomic(path, text)
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

-- Append rows to a JSONL file (logs; each call one write(2), every error raised).
function M.append_jsonl(path, rows)
  require("clrt.files").append(path, M.encode_jsonl(rows))
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
