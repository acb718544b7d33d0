-- clrt.core.ffi — the runtime's C interface, declared from the header the binary was built with.
-- Only lua/clrt/ may require this; recipes, metrics and interactions go through the wrappers.
local ffi = require("ffi")

ffi.cdef [[const char *clrt_ffi_header(void);]]
local C = ffi.C

local text = ffi.string(C.clrt_ffi_header())
text = ("\n" .. text):gsub("\n#[^\n]*", "\n")
text = text:gsub("const char %*clrt_ffi_header%(void%);", "")
ffi.cdef(text)

local M = { C = C }

-- Raise the runtime's last error as a Lua error, blaming the caller of the wrapper.
function M.fail(level)
  error(ffi.string(C.clrt_last_error()), (level or 1) + 1)
end

-- Return p, or raise the runtime's error when p is NULL.
function M.check(p, level)
  if p == nil then M.fail((level or 1) + 1) end
  return p
end

-- Raise the runtime's error when a status code is non-zero.
function M.ok(status, level)
  if status ~= 0 then M.fail((level or 1) + 1) end
  return status
end

return M
