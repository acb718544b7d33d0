-- clrt.prompt_file: header stripping, Python str.format placeholders, clear errors.
local T = require("clrt.test")
local pf = require("clrt.prompt_file")

local function write(dir, name, text)
  local path = dir .. "/" .. name
  local f = assert(io.open(path, "wb")); f:write(text); f:close()
  return path
end

T.case("a '#' header ended by '---' is dropped; a file without one is all prompt", function()
  local dir = T.tmpdir()
  T.eq(pf.read(write(dir, "a.txt", "# from verl\n# {x}: the chat\n---\nHello {x}\n")), "Hello {x}\n")
  T.eq(pf.read(write(dir, "b.txt", "Hello {x}\n---\nmore\n")), "Hello {x}\n---\nmore\n")
  -- '#' lines not closed by '---' are part of the prompt (a Markdown heading, say)
  T.eq(pf.read(write(dir, "c.txt", "# Task\nDo it\n")), "# Task\nDo it\n")
end)

T.case("placeholders are filled as Python's str.format fills them", function()
  T.eq(pf.fill("{a} and {{literal}} {b}{a}", { a = "x", b = 2 }), "x and {literal} 2x")
  T.eq(pf.fill('{{"k": "{v}"}}', { v = "{not a placeholder}" }), '{"k": "{not a placeholder}"}')
  T.eq(pf.placeholders("{a} {{b}} {c} {a}"), { "a", "c" })
end)

T.case("a hole or a lone brace is an error naming the prompt", function()
  T.raises(function() pf.fill("hi {who}", {}, "user.txt") end, "user.txt: no value for placeholder {who}")
  T.raises(function() pf.fill('{"k": 1}', {}, "j.txt") end, "j.txt: a '{' at byte 1")
  T.raises(function() pf.fill("a } b", {}, "k.txt") end, "k.txt: a lone '}'")
  T.raises(function() pf.read("/nonexistent/dir/p.txt") end, "cannot read prompt /nonexistent/dir/p.txt")
end)

T.case("a bare name is a file under lua/prompts/", function()
  T.ok(pf.path("collabllm_user"):find("/lua/prompts/collabllm_user%.txt$"), pf.path("collabllm_user"))
end)

T.run()
