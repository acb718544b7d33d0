-- clrt.files — the file steps of a run folder, each one C call (runtime/core/files.c) that checks
-- its result and raises an error naming the path. No shell: a shell step goes through
-- system(), which ignores Ctrl-C in clrt while it runs.
--   files.exists(p) / files.is_dir(p)      -- the one existence test
--   files.mkdir_p(dir)                      -- every missing folder
--   files.write_atomic(path, text)          -- the one atomic write: temp, fsync, rename
--   files.append(path, text)                -- write(2) with O_APPEND; a failed write raises
--   files.rename(a, b)                      -- rename(2), then fsync b's folder
--   files.remove_tree(p) / files.copy(a, b) / files.list(dir) / files.fsync(p)
--   files.temp_dir(prefix)                  -- a new private folder under $TMPDIR or /tmp
local ffi = require("ffi")
local C = require("clrt.core.ffi").C
local M = {}

local function check(rc)
  if rc ~= 0 then error(ffi.string(C.clrt_last_error()), 0) end
end

function M.exists(path) return C.clrt_path_kind(path) ~= 0 end
function M.is_dir(path) return C.clrt_path_kind(path) == 2 end
function M.mkdir_p(path) check(C.clrt_mkdir_p(path), 2) end
function M.fsync(path) check(C.clrt_fsync_path(path), 2) end
function M.rename(from, to) check(C.clrt_rename(from, to), 2) end
function M.remove_tree(path) check(C.clrt_remove_tree(path), 2) end
function M.copy(from, to) check(C.clrt_file_copy(from, to), 2) end

-- A new private folder $TMPDIR/<prefix>.XXXXXX (mode 0700); the caller removes it.
function M.temp_dir(prefix)
  local p = C.clrt_temp_dir(prefix or "clrt")
  if p == nil then error(ffi.string(C.clrt_last_error()), 2) end
  local s = ffi.string(p)
  C.clrt_free_string(p)
  return s
end

-- The whole file as a string, or nil when it cannot be opened.
function M.read(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("*a")
  f:close()
  return s
end

-- A file's size in bytes, or nil when it cannot be opened.
function M.size(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local n = f:seek("end")
  f:close()
  return n
end

function M.append(path, text)
  text = tostring(text)
  check(C.clrt_file_append(path, text, #text), 2)
end

function M.write_atomic(path, text)
  text = tostring(text)
  check(C.clrt_file_write_atomic(path, text, #text), 2)
end

-- Entry names of a folder, sorted.
function M.list(dir)
  local p = C.clrt_list_dir(dir)
  if p == nil then error(ffi.string(C.clrt_last_error()), 0) end
  local text = ffi.string(p)
  C.clrt_free_string(p)
  local out = {}
  for name in text:gmatch("([^\n]+)\n") do out[#out + 1] = name end
  table.sort(out)
  return out
end

return M
