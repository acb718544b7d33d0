-- Structured output with the schemas SDK helpers really emit: openai's zodResponseFormat
-- (fixtures made with the real openai + zod packages, zod 3 and zod 4) and Pydantic v2's
-- model_json_schema() (written by hand in its documented shape; see
-- tests/fixtures/json_schema/README.md). For each, the grammar accepts valid documents and
-- refuses invalid ones byte by byte (not just "it compiles"); the whitespace it allows is one
-- space or newline per gap at most; and a tiny real model constrained by each schema writes
-- JSON that parses and validates against it (an independent validator), over many seeds.
local T = require("clrt.test")
package.path = T.source_dir() .. "/tests/?.lua;" .. T.source_dir() .. "/tests/lua/?.lua;" .. package.path
local W = require("support.json_world")
local JC = require("clrt.gen.json_constraint")
local C = require("clrt.core.ffi").C
local cjson = require("cjson")

local function fixture(name)
  local rf = cjson.decode(assert(T.read(T.source_dir() .. "/tests/fixtures/json_schema/" .. name .. ".json")))
  return rf.json_schema and rf.json_schema.schema or rf
end

-- Does the grammar take the whole text as one complete value?
local function fits(grammar, text)
  local s = C.clrt_jschema_state_new(grammar.grammar)
  local ok = C.clrt_jschema_state_advance(s, text, #text) == 0 and C.clrt_jschema_state_complete(s) == 1
  C.clrt_jschema_state_free(s)
  return ok
end

-- Whitespace outside strings: the longest run, and whether a tab or CR appears.
local function gaps(text)
  local in_str, esc, run, longest, bad = false, false, 0, 0, false
  for i = 1, #text do
    local ch = text:sub(i, i)
    if in_str then
      if esc then esc = false elseif ch == "\\" then esc = true elseif ch == '"' then in_str = false end
    elseif ch:match("%s") then
      run = run + 1
      longest = math.max(longest, run)
      if ch == "\r" or ch == "\t" then bad = true end
    else
      run = 0
      if ch == '"' then in_str = true end
    end
  end
  return longest, bad
end

local function check_docs(name, schema, good, bad)
  local g = JC.compile(schema)
  for _, text in ipairs(good) do
    T.ok(fits(g, text), ("%s accepts %s"):format(name, text))
    local ok, v = pcall(W.parse, text)
    T.ok(ok and W.validate(v, schema), ("%s: the validator agrees on %s"):format(name, text))
  end
  for _, text in ipairs(bad) do T.ok(not fits(g, text), ("%s refuses %s"):format(name, text)) end
end

local person = '{"name":"Ann","age":41,"n":-12,"score":0.25,"role":"user","kind":"person",' ..
  '"home":{"street":"Main 1","city":"Oslo","zip":null},"work":{"street":"Dock 2","city":"Bergen","zip":"5003"},' ..
  '"tags":["a","bb"],"matrix":[[1,-2],[]],"nick":null,"ok":true,"either":"x"}'
local function swap(text, from, to)
  local i, j = text:find(from, 1, true)
  assert(i, from)
  return text:sub(1, i - 1) .. to .. text:sub(j + 1)
end

T.case("zod (3 and 4) person: every field kind is honoured and violations are refused", function()
  for _, name in ipairs({ "zod4_person", "zod3_person" }) do
    check_docs(name, fixture(name), {
      person,
      swap(swap(person, '"work":{"street":"Dock 2","city":"Bergen","zip":"5003"}', '"work":null'), '"either":"x"', '"either":42'),
      swap(person, '"nick":null', '"nick":"Annie"'),
      swap(person, '"n":-12', '"n":9007199254740991'),
      '{ "name": "Ann",\n"age": 41, "n": -12, "score": 0.25, "role": "user", "kind": "person", "home": {"street": "Main 1", "city": "Oslo", "zip": null}, ' ..
        '"work": null, "tags": ["a"], "matrix": [], "nick": null, "ok": false, "either": 0}',
    }, {
      swap(person, '"age":41', '"age":151'),
      swap(person, '"age":41', '"age":4.5'),
      swap(person, '"score":0.25', '"score":1'),
      swap(person, '"score":0.25', '"score":0'),
      swap(person, '"role":"user"', '"role":"root"'),
      swap(person, '"kind":"person"', '"kind":"persons"'),
      swap(person, '"zip":null', '"zip":"123456"'),
      swap(person, '"work":{"street":"Dock 2","city":"Bergen","zip":"5003"}', '"work":"Dock 2"'),
      swap(person, '"tags":["a","bb"]', '"tags":[]'),
      swap(person, '"tags":["a","bb"]', '"tags":["a","b","c","d"]'),
      swap(person, '"matrix":[[1,-2],[]]', '"matrix":[[10]]'),
      swap(person, '"either":"x"', '"either":100'),
      swap(person, '"either":"x"', '"either":true'),
      swap(person, ',"ok":true', ''),
      swap(person, '"ok":true', '"ok":true,"extra":1'),
      swap(person, '"name":"Ann"', '"name":""'),
    })
  end
end)

T.case("zod .int() bounds of +-(2^53 - 1) are exact; zod 3's unbounded integer is any integer", function()
  check_docs("zod4_int", fixture("zod4_int"), { '{"n":9007199254740991}', '{"n":-9007199254740991}', '{"n":0}' },
    { '{"n":9007199254740992}', '{"n":-9007199254740992}', '{"n":90071992547409910}', '{"n":1.5}', '{"n":1e3}' })
  -- at 2^53 a double cannot tell 2^53 + 1 from 2^53: integer bounds are compared exactly
  check_docs("2^53", { type = "integer", minimum = -9007199254740992, maximum = 9007199254740992 },
    { "9007199254740992", "-9007199254740992" }, { "9007199254740993", "-9007199254740993", "9007199254740999" })
  check_docs("exclusive 2^53", { type = "integer", exclusiveMaximum = 9007199254740992 }, { "9007199254740991" }, { "9007199254740992" })
  check_docs("zod3_int", fixture("zod3_int"), { '{"n":123456789012345678}', '{"n":-5}' }, { '{"n":1.5}', '{"n":"1"}' })
end)

T.case("$ref / definitions / $defs: zod's reused and id'd sub-schemas, used several times", function()
  local good = {
    '{"home":{"street":"a","city":"b"},"work":null,"past":[]}',
    '{"home":{"street":"a","city":"b"},"work":{"street":"c","city":"d"},"past":[{"street":"e","city":"f"},{"street":"g","city":"h"}]}',
  }
  local bad = {
    '{"home":{"street":"a","city":"b"},"work":null,"past":[{"street":"e","city":"f"},{"street":"e","city":"f"},{"street":"e","city":"f"},{"street":"e","city":"f"}]}',
    '{"home":{"street":"a","city":"b"},"work":null,"past":[{"street":"e"}]}',
    '{"home":{"street":"a","city":"b"},"work":{"street":"c","city":"01234567890"},"past":[]}',
    '{"home":null,"work":null,"past":[]}',
  }
  check_docs("zod4_defs", fixture("zod4_defs"), good, bad)
  check_docs("zod3_reuse", fixture("zod3_reuse"), good, bad)
end)

T.case("recursive refs (zod's '#' and definitions, Pydantic's root $ref) are unrolled to four levels or more", function()
  local leaf = '{"value":3,"children":null}'
  local d3 = ('{"value":1,"children":[{"value":2,"children":[{"value":3,"children":[%s]}]}]}'):format(leaf)
  local d4 = ('{"value":1,"children":[{"value":2,"children":[{"value":3,"children":[{"value":4,"children":[%s]}]}]}]}'):format(leaf)
  check_docs("zod4_tree", fixture("zod4_tree"), { leaf, '{"value":1,"children":[]}', d3 }, { d4, '{"value":100,"children":null}', '{"value":1}' })
  -- zod 3 writes the first level inline and the rest through the definition: one level more
  local d5 = ('{"value":0,"children":[%s]}'):format(d4)
  check_docs("zod3_tree", fixture("zod3_tree"), { '{"root":' .. leaf .. "}", '{"root":' .. d3 .. "}", '{"root":' .. d4 .. "}" }, { '{"root":' .. d5 .. "}" })
  local p3 = '{"value":1,"children":[{"value":2,"children":[{"value":3,"children":[{"value":4}]}]}]}'
  check_docs("pydantic_tree", fixture("pydantic_tree"), { '{"value":1}', '{"value":1,"children":[{"value":2},{"value":3,"children":[]}]}', p3 },
    { '{"value":1,"children":[{"value":2},{"value":3},{"value":4}]}', '{"children":[]}',
      '{"value":1,"children":[{"value":2,"children":[{"value":3,"children":[{"value":4,"children":[{"value":5}]}]}]}]}' })
end)

T.case("Pydantic v2 shapes: $defs, described $ref, allOf wrapper, Optional as anyOf null, const, Enum, dict", function()
  local addr = '{"street":"Main 1","city":"Oslo"}'
  -- written in the grammar's fixed order: the required properties as listed, then the optional
  -- ones by name (kind has a default, so it is optional too)
  local doc = ('{"name":"Ann","age":41,"score":0.5,"color":"red","home":%s,"billing":{"street":"x","city":"y","zip":"1"},' ..
    '"tags":["a"],"counts":{"a":1,"b":-2},"choice":"yes","ok":true,"kind":"person"}'):format(addr)
  local full = swap(swap(doc, '"choice":"yes"', '"choice":null'), '"kind":"person"', '"kind":"person","level":7,"past":[%s],"work":null')
  full = full:gsub("%%s", addr)
  check_docs("pydantic_person", fixture("pydantic_person"), { doc, full,
    swap(doc, '"counts":{"a":1,"b":-2}', '"counts":{}'), swap(swap(doc, '"tags":["a"]', '"tags":[]'), '"choice":"yes"', '"choice":"no"'),
    swap(doc, ',"kind":"person"', ''), swap(doc, '"kind":"person"', '"kind":"person","work":' .. addr) }, {
    swap(doc, '"color":"red"', '"color":"pink"'),
    swap(doc, '"choice":"yes"', '"choice":"maybe"'),
    swap(doc, '"counts":{"a":1,"b":-2}', '"counts":{"a":1.5}'),
    swap(doc, '"billing":{"street":"x","city":"y","zip":"1"}', '"billing":null'),
    swap(doc, '"kind":"person"', '"kind":"robot"'),
    swap(doc, '"score":0.5', '"score":1.0'),
    swap(doc, '"home":' .. addr, '"home":{"street":"Main 1"}'),
    swap(doc, '"kind":"person"', '"kind":"person","level":"x"'),
    (swap(doc, '"kind":"person"', '"kind":"person","past":[%s,%s,%s]'):gsub("%%s", addr)),
  })
  -- an any-value alternative (Pydantic's Optional[Any]) takes the others in
  check_docs("any or null", { anyOf = { {}, { type = "null" } } }, { "null", "[1]", '{"a":"b"}' }, { "nul" })
  -- zod 3 writes OpenAPI's nullable inside definitions
  check_docs("nullable", { type = "string", maxLength = 3, nullable = true }, { '"abc"', "null" }, { "1", '"abcd"' })
end)

T.case("zod 4 email (format + pattern) is a 400-style error naming the pattern's path", function()
  T.raises(function() JC.compile(fixture("zod4_email")) end, "'pattern' is not supported")
  T.raises(function() JC.compile(fixture("zod4_email")) end, "(at $.properties.e.pattern)")
  check_docs("zod3_email", fixture("zod3_email"), { '{"e":"a@b.c"}' }, { '{"e":1}' })   -- format alone is an annotation
end)

-- The tiny real model and its trained byte-level tokenizer.
local dir = require("support.tiny_model")(T.tmpdir(), { seed = 5 })
local m = clrt.model.load(dir)
local tok = clrt.tokenizer.load(dir)
local stops = clrt.chat.stop_ids(tok)
local V = m.config.vocab_size
local bytes = JC.token_bytes(tok, V)

T.case("whitespace: at most one space or newline per gap, so {\"ask\":...,\"city\":...} fits a small budget", function()
  local schema = fixture("zod4_ask")
  local g = JC.compile(schema)
  T.ok(fits(g, '{"ask":true,"city":"Paris"}') and fits(g, '{ "ask" : true ,\n"city" : "Paris" }') and fits(g, ' {"ask":false,"city":""}'), "one byte per gap")
  for _, t in ipairs({ '{"ask":  true,"city":"Paris"}', '{"ask":true,\n\n"city":"Paris"}', '{"ask":true, \n"city":"Paris"}',
    '{"ask":true,\r\n"city":"Paris"}', '{"ask":\ttrue,"city":"Paris"}', '{"ask":true,\r"city":"Paris"}', '  {"ask":true,"city":"Paris"}' }) do
    T.ok(not fits(g, t), "refused: " .. cjson.encode(t))
  end
  -- An adversary that takes every whitespace token the mask allows, before each byte of the
  -- compact reply: the real tokenizer's whitespace tokens (single bytes and runs alike).
  local c = JC.new({ tokenizer = tok, V = V, grammar = g, stop_ids = stops })
  local ws_ids = {}
  for id = 0, V - 1 do
    if bytes[id + 1] ~= "" and bytes[id + 1]:match("^%s+$") then ws_ids[#ws_ids + 1] = id end
  end
  T.ok(#ws_ids >= 4, #ws_ids .. " whitespace tokens in the vocabulary")
  local compact = '{"ask":true,"city":"Paris"}'
  local s = c:state()
  local out, ws_tokens, longest, in_str = {}, 0, 0, false
  for i = 1, #compact do
    local run = 0
    while not in_str do   -- between JSON tokens only: inside a string a space is text
      local mask = c:fill(s)
      local pick
      for _, id in ipairs(ws_ids) do if mask[id] == 1 then pick = id; break end end
      if not pick then break end
      c:advance(s, pick)
      out[#out + 1] = bytes[pick + 1]
      ws_tokens, run = ws_tokens + 1, run + #bytes[pick + 1]
      if ws_tokens > 100 then break end
    end
    longest = math.max(longest, run)
    c:advance(s, compact:byte(i))
    out[#out + 1] = compact:sub(i, i)
    if compact:sub(i, i) == '"' then in_str = not in_str end
  end
  local text = table.concat(out)
  T.ok(c:complete(s), "complete")
  local n_compact, n_worst = #tok:encode(compact), #tok:encode(text)
  io.write(("  compact reply %d tokens; with all the whitespace the grammar allows %d tokens (%d whitespace tokens, longest run %d bytes)\n")
    :format(n_compact, n_worst + 0, ws_tokens, longest))
  T.eq(longest, 1, "longest whitespace run")
  T.ok(ws_tokens <= 10, ws_tokens .. " whitespace tokens in the worst case")
  T.ok(n_worst <= n_compact + 10, "the worst case fits the compact reply + 10 tokens")
end)

-- Each step, with some probability, the row must take a token that closes or separates
-- something if the mask allows one: a random-weights model otherwise writes strings and
-- arrays hundreds of tokens long. It only narrows the grammar's mask, never widens it.
local closer = {}
for id = 0, V - 1 do
  if bytes[id + 1]:find('["%]},]') then closer[id] = true end
end
for _, id in ipairs(stops) do closer[id] = true end

local function hurried(c, every)
  return function(row)
    local mask = c:mask(row)
    if mask and #row.tokens % every == every - 1 then
      local any = false
      for id in pairs(closer) do if mask[id] == 1 then any = true; break end end
      if any then for id = 0, V - 1 do if not closer[id] then mask[id] = 0 end end end
    end
    return mask
  end
end

T.case("end to end: a tiny model constrained by every fixture writes JSON that parses and validates (many seeds)", function()
  local names = { "zod4_person", "zod3_person", "zod4_int", "zod3_int", "zod4_ask", "zod3_ask", "zod4_defs", "zod3_reuse",
    "zod4_tree", "zod3_tree", "pydantic_person", "pydantic_tree" }
  local prompt = tok:encode("write a card for my friend")
  local total, done, ntok = 0, 0, 0
  for si, name in ipairs(names) do
    local schema = fixture(name)
    local g = JC.compile(schema)
    for seed = 1, 4 do
      local c = JC.new({ tokenizer = tok, V = V, grammar = g, stop_ids = stops })
      local out = m:generate({ prompt }, { n = 8, max_new_tokens = 400, temperature = 1, seed = si * 100 + seed, tokenizer = tok,
        stop = stops, mask = hurried(c, seed % 2 == 0 and 2 or 3) })
      for k, row in ipairs(out) do
        total = total + 1
        local where = ("%s seed %d row %d"):format(name, seed, k)
        if row.finish_reason == "stop" then
          done = done + 1
          ntok = ntok + #row.tokens
          local ok, v = pcall(W.parse, row.text)
          T.ok(ok, where .. ": " .. tostring(v) .. ": " .. row.text)
          T.ok(pcall(cjson.decode, row.text), where .. ": cjson refuses " .. row.text)
          if ok then
            local good, why = W.validate(v, schema)
            T.ok(good, ("%s: %s: %s"):format(where, row.text, tostring(why)))
          end
          local longest, tab_cr = gaps(row.text)
          T.ok(longest <= 1 and not tab_cr, where .. ": a whitespace run, tab or CR between tokens in " .. cjson.encode(row.text))
          if os.getenv("SHOW") then print(name, row.text) end
        else
          T.eq(row.finish_reason, "length", where)
        end
      end
    end
  end
  io.write(("  %d samples, %d complete and valid (%.1f tokens on average)\n"):format(total, done, ntok / math.max(1, done)))
  T.ok(done >= 0.95 * total, ("%d of %d samples completed"):format(done, total))
end)

T.case("end to end without hurrying: an {ask, city} reply (city a zod enum) always fits 38 tokens", function()
  local schema = { type = "object", properties = { ask = { type = "boolean" }, city = { type = "string", enum = { "Paris", "Oslo", "Lima" } } },
    required = { "ask", "city" }, additionalProperties = false }
  local g = JC.compile(schema)
  local prompt = tok:encode("what is your city")
  local total, done, most = 0, 0, 0
  for seed = 1, 6 do
    local c = JC.new({ tokenizer = tok, V = V, grammar = g, stop_ids = stops })
    local out = m:generate({ prompt }, { n = 8, max_new_tokens = 38, temperature = 1, seed = seed, tokenizer = tok, stop = stops,
      mask = function(row) return c:mask(row) end })
    for _, row in ipairs(out) do
      total = total + 1
      if row.finish_reason == "stop" then
        done = done + 1
        most = math.max(most, #row.tokens)
        local ok, v = pcall(W.parse, row.text)
        T.ok(ok and W.validate(v, schema), "valid: " .. row.text)
        T.ok(gaps(row.text) <= 1, "one whitespace byte per gap at most: " .. cjson.encode(row.text))
      end
    end
  end
  -- the longest reply is 28 bytes of {"ask":false,"city":"Paris"} + 9 gaps of one byte + the stop token
  io.write(("  %d of %d replies complete within 38 tokens (longest %d; the compact reply is %d tokens + stop)\n")
    :format(done, total, most, #tok:encode('{"ask":false,"city":"Paris"}')))
  T.eq(done, total, "replies complete within 38 tokens")
end)

T.run()
