-- `clrt serve --deterministic` as a user runs it: a request with a seed, sampled at
-- temperature 1, gets the same tokens and the same log-probabilities (compared as the JSON's
-- numbers, which carry a float's every bit) alone and among 24 concurrent requests of other
-- lengths, seeds and sizes, whatever order they reach the server in.
local T = require("clrt.test")
package.path = T.source_dir() .. "/tests/?.lua;" .. package.path
local cjson = require("cjson")

if os.execute("command -v curl > /dev/null 2>&1") ~= 0 then
  io.write("skip: curl is not installed\n")
  os.exit(77)
end

local dir = require("support.tiny_model")(T.tmpdir(), { seed = 3 })
local srv = require("support.serve")(dir, "--slots 32 --deterministic")

-- Every body posted at once (curl in the background); the response bodies in order.
local function post_all(bodies)
  local cmd, files = {}, {}
  for i, b in ipairs(bodies) do
    local base = ("%s/det%d"):format(dir, i)
    local f = assert(io.open(base .. ".json", "w"))
    f:write(b)
    f:close()
    files[i] = base .. ".out"
    cmd[#cmd + 1] = ("curl -s -m 60 --data-binary @%s.json -H 'Content-Type: application/json' %s/chat/completions -o %s &")
      :format(base, srv.url, files[i])
  end
  cmd[#cmd + 1] = "wait"
  os.execute(table.concat(cmd, "\n"))
  local out = {}
  for i, p in ipairs(files) do
    local ok, r = pcall(cjson.decode, T.read(p) or "")
    T.ok(ok and r.choices, ("request %d got no reply: %s"):format(i, tostring(T.read(p))))
    out[i] = r
  end
  return out
end

local TARGET = cjson.encode({ messages = { { role = "user", content = "write a card for my friend, a trip plan" } },
  temperature = 1, seed = 1234, max_tokens = 20, logprobs = true })

local function other(i)
  local words = {}
  for j = 1, 1 + (i * 7) % 23 do words[j] = ({ "hello", "how", "are", "you", "city", "name" })[(i + j) % 6 + 1] end
  return cjson.encode({ messages = { { role = "user", content = table.concat(words, " ") } }, temperature = 1,
    seed = i, max_tokens = 4 + (i * 5) % 30 })
end

local function tokens_and_logprobs(r)
  local c = r.choices[1]
  local lps = {}
  for i, e in ipairs(c.logprobs.content) do lps[i] = e.logprob end
  return c.message.content, lps
end

T.case("a seeded request: the same tokens and log-probabilities alone and among 24 others", function()
  local alone_text, alone_lps = tokens_and_logprobs(post_all({ TARGET })[1])
  T.ok(#alone_lps >= 5, "the reply has log-probabilities to compare (" .. #alone_lps .. ")")
  for _, at in ipairs({ 1, 13, 25 }) do
    local bodies = {}
    for i = 1, 25 do bodies[i] = i == at and TARGET or other(i) end
    local text, lps = tokens_and_logprobs(post_all(bodies)[at])
    T.eq(text, alone_text, "the reply among 25 requests (sent " .. at .. ")")
    T.eq(#lps, #alone_lps, "as many log-probabilities")
    for i = 1, #alone_lps do
      T.ok(lps[i] == alone_lps[i], ("log-probability %d among 25 requests (sent %d): %.17g vs %.17g alone"):format(
        i, at, lps[i], alone_lps[i]))
    end
  end
end)

T.run()
