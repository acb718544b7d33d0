-- JSON-constrained m:generate on a real (tiny, random-weights) model with its trained
-- byte-level BPE tokenizer: the token bytes come from the real tokenizer (special and added
-- tokens excluded), and every completed sample parses and validates (json_world's parser and
-- validator, not the automaton); with n, top-p and top-k.
local T = require("clrt.test")
package.path = T.source_dir() .. "/tests/?.lua;" .. T.source_dir() .. "/tests/lua/?.lua;" .. package.path
local W = require("support.json_world")

local dir = require("support.tiny_model")(T.tmpdir(), { seed = 3 })
local m = clrt.model.load(dir)
local tok = clrt.tokenizer.load(dir)
local stops = clrt.chat.stop_ids(tok)

T.case("token bytes from the real tokenizer: specials are excluded, every byte is a token", function()
  local JC = require("clrt.gen.json_constraint")
  local V = m.config.vocab_size
  local bytes = JC.token_bytes(tok, V)
  local singles = {}
  for id = 0, V - 1 do
    if tok:is_special(id) then T.eq(bytes[id + 1], "", "special token " .. id) end
    if #bytes[id + 1] == 1 then singles[bytes[id + 1]] = true end
  end
  local n = 0
  for _ in pairs(singles) do n = n + 1 end
  T.eq(n, 256, "single-byte tokens")
end)

T.case("m:generate with json_schema: samples at temperature 1 parse and validate", function()
  local schemas = {
    { type = "object", properties = { thought = { type = "string", maxLength = 12 }, accuracy = { type = "number", minimum = 0, maximum = 1 } },
      required = { "thought", "accuracy" }, additionalProperties = false },
    { type = "array", items = { enum = { "hello", "hell", "there" } }, minItems = 1, maxItems = 4 },
    { type = "object", properties = { n = { type = "integer", minimum = -3, maximum = 250 }, ok = { type = "boolean" }, none = { type = "null" } },
      required = { "n", "ok", "none" } },
  }
  local prompt = tok:encode("hello there, how are you")
  local done, total = 0, 0
  for si, schema in ipairs(schemas) do
    local out = m:generate({ prompt }, { n = 8, max_new_tokens = 120, temperature = 1, top_p = si == 2 and 0.9 or 1,
      top_k = si == 3 and 50 or 0, seed = si, tokenizer = tok, stop = stops, json_schema = schema })
    for k, row in ipairs(out) do
      total = total + 1
      if row.finish_reason == "stop" then
        done = done + 1
        local ok, v = pcall(W.parse, row.text)
        T.ok(ok, ("schema %d sample %d: %s"):format(si, k, tostring(v)))
        if ok then
          local good, why = W.validate(v, schema)
          T.ok(good, ("schema %d sample %d: %s: %s"):format(si, k, row.text, tostring(why)))
        end
      else
        T.eq(row.finish_reason, "length")
      end
    end
  end
  T.ok(done >= total / 2, ("%d of %d samples completed"):format(done, total))
end)

T.case("clrt serve on this model: response_format json_schema over HTTP gives valid JSON", function()
  if os.execute("command -v curl > /dev/null 2>&1") ~= 0 then return T.skip("curl is not installed") end
  local cjson = require("cjson")
  local srv = require("clrt.net.openai_server").new({ model = m, tokenizer = tok, name = "tiny", port = 0, slots = 8, max_len = 256, max_tokens = 120 })
  local schema = { type = "object", properties = { thought = { type = "string", maxLength = 10 }, accuracy = { type = "number", minimum = 0, maximum = 1 } },
    required = { "thought", "accuracy" }, additionalProperties = false }
  local base = T.tmpdir() .. "/req"
  local f = assert(io.open(base .. ".json", "w"))
  f:write(cjson.encode({ model = "tiny", messages = { { role = "user", content = "judge this" } }, n = 4, temperature = 1, max_tokens = 120,
    response_format = { type = "json_schema", json_schema = { name = "judge", strict = true, schema = schema } } }))
  f:close()
  os.execute(("(curl -s -m 60 -o %s.out -w '%%{http_code}' -H 'Content-Type: application/json' --data-binary @%s.json http://127.0.0.1:%d/v1/chat/completions > %s.code; touch %s.done) &")
    :format(base, base, srv:port(), base, base))
  local t0 = os.time()
  while not T.read(base .. ".done") do
    srv:tick(5)
    if os.time() - t0 > 90 then error("the request did not finish") end
  end
  srv:stop()
  T.eq(tonumber(T.read(base .. ".code")), 200)
  local done = 0
  for _, ch in ipairs(cjson.decode(T.read(base .. ".out")).choices) do
    if ch.finish_reason == "stop" then
      done = done + 1
      local ok, v = pcall(W.parse, ch.message.content)
      T.ok(ok and W.validate(v, schema), "valid reply: " .. ch.message.content)
      if os.getenv("SHOW") then print(ch.message.content) end
    end
  end
  T.ok(done >= 2, done .. " of 4 replies complete")
end)

T.run()
