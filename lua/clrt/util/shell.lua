-- clrt.util.shell — the one way a word is put on a shell command line (os.execute, io.popen,
-- a command printed for the user to paste): words of safe characters stay as they are,
-- anything else goes in single quotes with each ' written as '\''.
local M = {}

function M.quote(s)
  s = tostring(s)
  if s:match("^[%w%._/%-+=:,@]+$") then return s end
  return "'" .. s:gsub("'", "'\\''") .. "'"
end

return M
