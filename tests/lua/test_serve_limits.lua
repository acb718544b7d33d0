-- What one client can cost `clrt serve` (issue 46), on a real tiny model over loopback, with
-- Python socket clients (tests/support/serve_limits_client.py): the 100,000-message request
-- beside normal ones is refused naming --max-messages while the normal ones and /health are
-- answered in their usual time; 2,000 idle connections from one address leave other clients
-- answered (the per-client limit); past --max-connections a request gets a 503 naming it; a
-- header trickled a byte at a time is cut at --header-timeout; two different Content-Length
-- headers and malformed request lines get a 400 (RFC 9112), a single token or binary bytes
-- too (libmicrohttpd 0.9.75 closes those without an answer: runtime/net/front_door.c).
local T = require("clrt.test")
package.path = T.source_dir() .. "/tests/?.lua;" .. package.path
local cjson = require("cjson")

if os.execute("command -v python3 > /dev/null 2>&1") ~= 0 then
  io.write("skip: python3 is not installed\n")
  os.exit(77)
end
local client = T.source_dir() .. "/tests/support/serve_limits_client.py"
local dir = require("support.tiny_model")(T.tmpdir(), { seed = 2 })

local function run(mode, port, ...)
  local p = io.popen(("timeout 300 python3 %s %s %d %s 2>&1"):format(client, mode, port, table.concat({ ... }, " ")))
  local out = p:read("*a")
  p:close()
  local ok, v = pcall(cjson.decode, out:match("[^\n]*$") ~= "" and out:match("[^\n]*$") or out:match("([^\n]*)\n$"))
  if not ok then error(mode .. ": " .. out, 2) end
  return v
end

local function slowest(rounds, key)
  local m = 0
  for _, r in ipairs(rounds) do m = math.max(m, r[key]) end
  return m
end

T.case("the 100,000-message request is refused naming --max-messages; normal requests keep their usual time", function()
  local srv = require("support.serve")(dir, "")
  local r = run("load", srv.port)
  T.ok(r.bytes > 3e6 and r.bytes < 4 * 1024 * 1024, "3.6 MB, under the default --max-body: " .. r.bytes)
  T.eq(r.big.status, 400, r.big.body)
  T.ok(r.big.body:find("--max-messages", 1, true) and r.big.body:find("100000 messages", 1, true), r.big.body)
  for _, x in ipairs(r.during) do
    T.eq(x.chat, 200, "a normal request during the big one is answered")
    T.eq(x.health, 200, "/health during the big one is answered")
  end
  local usual = math.max(slowest(r.before, "chat_s"), slowest(r.before, "health_s"))
  local during = math.max(slowest(r.during, "chat_s"), slowest(r.during, "health_s"))
  io.write(("  normal requests: slowest %.3f s before, %.3f s while the big one (%.2f s to refuse) was worked on; %d answered meanwhile\n")
    :format(usual, during, r.big.seconds, #r.during))
  T.ok(#r.during >= 2, "several normal rounds ran while the big one was in the server")
  T.ok(during < math.max(4 * usual, usual + 0.25), ("usual time kept: %.3f s against %.3f s"):format(during, usual))
end)

-- POST a body with curl: status, response body.
local function post(port, path, body)
  local f = T.tmpdir() .. "/body.json"
  local h = assert(io.open(f, "w"))
  h:write(body)
  h:close()
  local p = io.popen(("curl -s -m 30 -w '\n%%{http_code}' --data-binary @%s -H 'Content-Type: application/json' http://127.0.0.1:%d%s")
    :format(f, port, path))
  local out = p:read("*a")
  p:close()
  local resp, code = out:match("^(.*)\n(%d+)$")
  return tonumber(code), resp
end

T.case("each request limit is a flag with a default and a 400 naming it", function()
  local srv = require("support.serve")(dir, "--max-messages 3 --max-schema-bytes 2000")
  local msgs = {}
  for i = 1, 4 do msgs[i] = { role = i % 2 == 1 and "user" or "assistant", content = "hi" } end
  local st, body = post(srv.port, "/v1/chat/completions", cjson.encode({ messages = msgs, max_tokens = 2 }))
  T.eq(st, 400, body)
  T.ok(body:find("--max-messages", 1, true) and body:find("4 messages", 1, true), body)
  local props = {}
  for i = 1, 100 do props["field_" .. i] = { type = "string", description = "a field of the object" } end
  st, body = post(srv.port, "/v1/chat/completions", cjson.encode({ messages = { msgs[1] }, max_tokens = 2,
    response_format = { type = "json_schema", json_schema = { name = "x", schema = { type = "object", properties = props } } } }))
  T.eq(st, 400, body)
  T.ok(body:find("--max-schema-bytes", 1, true) and body:find("response_format", 1, true), body)
  -- 2 MB of text: more than 512 tokens of the longest token can hold, refused before tokenizing
  local big = ("hello there "):rep(180000)
  st, body = post(srv.port, "/v1/chat/completions", cjson.encode({ messages = { { role = "user", content = big } }, max_tokens = 2 }))
  T.eq(st, 400, body)
  T.ok(body:find("--max-len", 1, true) and body:find("bytes: more than a context", 1, true), body)
  st, body = post(srv.port, "/v1/completions", cjson.encode({ prompt = big, max_tokens = 2 }))
  T.eq(st, 400, body)
  T.ok(body:find("bytes: more than a context", 1, true) and body:find("context_length_exceeded", 1, true), body)
  st, body = post(srv.port, "/v1/chat/completions", cjson.encode({ messages = { msgs[1] }, max_tokens = 2 }))
  T.eq(st, 200, body)
end)

T.case("2,000 idle connections from one address leave other clients answered", function()
  local srv = require("support.serve")(dir, "")
  local r = run("idle", srv.port, 2000)
  if r.skip then T.skip(r.skip) end
  io.write(("  2000 opened (fd limit %d): %d still open on the server, %d refused at connect\n"):format(r.fd_limit, r.still_open, r.connect_failed))
  T.ok(r.still_open <= 32, "the per-client limit (32) holds: " .. r.still_open .. " open")
  for _, x in ipairs(r.after) do
    T.eq(x.chat, 200, "a normal request is answered")
    T.eq(x.health, 200, "/health is answered")
    T.ok(x.chat_s < 5 and x.health_s < 5, ("in %.3f s / %.3f s"):format(x.chat_s, x.health_s))
  end
end)

T.case("past --max-connections a request gets a 503 naming it; once they close, 200 again", function()
  local srv = require("support.serve")(dir, "--max-connections 20")
  local r = run("busy", srv.port, 30)
  T.eq(r.status, 503, r.body)
  T.ok(r.body:find("--max-connections", 1, true), r.body)
  T.eq(r.after_close, 200)
end)

T.case("a request head trickled a byte at a time is cut at --header-timeout", function()
  local srv = require("support.serve")(dir, "--header-timeout 2")
  local r = run("loris", srv.port)
  T.ok(r.closed_after ~= cjson.null and r.closed_after >= 1.5 and r.closed_after < 5,
    "closed after " .. tostring(r.closed_after) .. " s")
end)

T.case("RFC 9112: two different Content-Length headers and malformed request lines get a 400", function()
  local srv = require("support.serve")(dir, "")
  local r = run("http", srv.port)
  T.ok(r.two_lengths:find("^HTTP/1%.1 400") and r.two_lengths:find("two different Content-Length", 1, true),
    "two lengths refused as such (not read with one of them): " .. r.two_lengths)
  T.ok(r.same_lengths:find("^HTTP/1%.1 200"), "the same length twice is allowed: " .. r.same_lengths)
  T.ok(r.garbage_line:find("^HTTP/1%.1 400"), "garbage: " .. r.garbage_line)
  T.ok(r.extra_token:find("^HTTP/1%.1 400"), "extra token: " .. r.extra_token)
  T.ok(r.no_version:find("^HTTP/1%.1 400"), "no version: " .. r.no_version)
  -- a first line libmicrohttpd closes on without a word: the front door answers it
  for _, k in ipairs({ "bare_token", "tls_hello", "binary" }) do
    T.ok(r[k]:find("^HTTP/1%.1 400") and r[k]:find("bad_request_line", 1, true), k .. ": " .. r[k])
  end
  T.ok(r.leading_crlf:find("^HTTP/1%.1 200"), "an empty line before the request line is skipped (RFC 9112 2.2): " .. r.leading_crlf)
  T.ok(r.trickled:find("^HTTP/1%.1 200"), "a request line in two pieces is one request: " .. r.trickled)
end)

T.run()
