-- JSON-constrained decoding: sampled outputs always parse and validate (checked by a parser
-- and validator written here, not by the automaton), every valid document stays allowed byte
-- by byte (so masking never empties a row that has a valid continuation), the trie's mask
-- equals testing every token one by one, and schema features outside the subset are errors
-- that name them.
local T = require("clrt.test")
package.path = T.source_dir() .. "/tests/lua/?.lua;" .. package.path
local W = require("support.json_world")
local JC = require("clrt.gen.json_constraint")
local generate = require("support.fake_model").generate
local cjson = require("cjson")
local ffi = require("ffi")
local C = require("clrt.core.ffi").C

local list, ids = W.vocab()
local V = #list
local tok = W.tokenizer(list, ids)
local voc = JC.vocab(tok, V)
local bias = W.bias(list, ids)

local function rng(seed)
  local s = seed
  return function(n)
    s = s * 16807 % 2147483647
    return s % n + 1
  end
end

local function check_text(text, schema, where)
  local ok, v = pcall(W.parse, text)
  T.ok(ok, ("%s: %s"):format(where, tostring(v)))
  if not ok then return false end
  T.ok(pcall(cjson.decode, text), where .. ": cjson rejects " .. text)
  local good, why = W.validate(v, schema)
  T.ok(good, ("%s: %s does not validate: %s"):format(where, text, tostring(why)))
  return good
end

-- The state after feeding text one single-byte token at a time; checks that each byte's token
-- is in the mask and the mask is never empty.
local function feed_bytes(c, text, where)
  local s = c:state()
  local mask = ffi.new("uint8_t[?]", V)
  for i = 1, #text do
    local m, n = c:fill(s, mask)
    if not m or n == 0 then
      T.ok(false, ("%s: empty mask after %q"):format(where, text:sub(1, i - 1)))
      return nil
    end
    local b = text:byte(i)
    if mask[b] ~= 1 then
      T.ok(false, ("%s: byte %d (%q) of %q is masked out"):format(where, i, text:sub(i, i), text))
      return nil
    end
    c:advance(s, b)
  end
  return s
end

T.case("sampled outputs of random and adversarial schemas parse and validate (1,000 samples)", function()
  local r = rng(7)
  local samples, stopped, length, ntok, esc, utf = 0, 0, 0, 0, 0, 0
  local configs = {
    { temperature = 1.0 }, { temperature = 1.0, top_p = 0.9 }, { temperature = 1.0, top_k = 20 },
    { temperature = 0.7, top_k = 5, top_p = 0.95 },
  }
  local schemas = {
    { type = "object", properties = { thought = { type = "string" }, response = { type = "string" } },
      required = { "thought", "response" }, additionalProperties = false },
    { type = "object", properties = { tags = { type = "array", items = { enum = { "a", "ab", "abc" } }, minItems = 1, maxItems = 3 },
      n = { type = "integer", minimum = -15, maximum = 37 }, x = { type = "number", minimum = 0.25, maximum = 0.75 } },
      required = { "n", "x", "tags" } },
    { type = "array", items = { type = "object", properties = { ["k\"q"] = { type = "string", maxLength = 3 }, ["中"] = { type = "boolean" } },
      required = { "k\"q", "中" } }, minItems = 2, maxItems = 4 },
    { anyOf = { { type = "string", minLength = 2, maxLength = 4 }, { type = "integer", exclusiveMinimum = 0, maximum = 9 }, { type = "null" } } },
    { type = "integer", minimum = 37, maximum = 37 },
    true,
  }
  for i = 1, 40 do schemas[#schemas + 1] = W.random_schema(r) end
  local dec = W.decoder(V, 32, 400, bias, 11)
  local per = math.ceil(1000 / #schemas)
  for si, schema in ipairs(schemas) do
    local o = configs[si % #configs + 1]
    local prompts = {}
    local n = 4
    for p = 1, math.ceil(per / n) do prompts[p] = { (si * 7 + p) % 200 + 1, p } end
    local out = generate(dec, prompts, { n = n, max_new_tokens = 160, temperature = o.temperature, top_p = o.top_p,
      top_k = o.top_k, seed = si, tokenizer = tok, stop = { ids.eos, ids.im_end }, json_schema = schema })
    for k, row in ipairs(out) do
      samples = samples + 1
      if row.finish_reason == "stop" then
        stopped = stopped + 1
        ntok = ntok + #row.tokens
        if row.text:find("\\", 1, true) then esc = esc + 1 end
        if row.text:find("[\128-\255]") then utf = utf + 1 end
        check_text(row.text, schema, ("schema %d sample %d (%s)"):format(si, k, cjson.encode(schema)))
        local last = row.tokens[#row.tokens]
        T.ok(last == ids.eos or last == ids.im_end, "a stopped row ends with a stop id")
        for j = 1, #row.tokens - 1 do
          T.ok(list[row.tokens[j] + 1] ~= "" and row.tokens[j] ~= ids.think, "no special or added token inside the JSON")
        end
      else
        T.eq(row.finish_reason, "length")
        length = length + 1
      end
    end
  end
  T.ok(samples >= 1000, "at least 1,000 samples")
  T.ok(stopped >= 0.9 * samples, ("%d of %d samples completed"):format(stopped, samples))
  io.write(("  %d samples, %d complete and valid (%.1f tokens on average, %d with escapes, %d with UTF-8), %d ran out of tokens\n")
    :format(samples, stopped, ntok / math.max(1, stopped), esc, utf, length))
end)

T.case("every valid document stays allowed byte by byte: masks never empty a live row", function()
  local r = rng(99)
  local docs = 0
  for i = 1, 150 do
    local schema = W.random_schema(r)
    local c = JC.new({ vocab = voc, schema = schema, stop_ids = { ids.eos } })
    for _ = 1, 8 do
      local text = W.random_instance(r, schema, 1)
      if text then
        local okv, v = pcall(W.parse, text)
        local good, why = okv and W.validate(v, schema)
        T.ok(good, ("the instance generator made a valid document: %s (%s, %s)"):format(text, tostring(why), cjson.encode(schema)))
        local s = feed_bytes(c, text, ("schema %d %s"):format(i, cjson.encode(schema)))
        if s then
          T.ok(c:complete(s), "complete after " .. text)
          local m = c:fill(s)
          T.ok(m and m[ids.eos] == 1, "the stop id is allowed after " .. text)
          docs = docs + 1
        end
      end
    end
  end
  T.ok(docs > 800, ("%d documents checked"):format(docs))
end)

T.case("the trie's mask equals testing every token one by one, over random reachable states", function()
  local r = rng(5)
  local mask = ffi.new("uint8_t[?]", V)
  local probe = ffi.new("uint8_t[?]", V)
  local states = 0
  for i = 1, 30 do
    local schema = i <= 5 and ({ true, "object", { type = "string", maxLength = 3 }, { type = "number", minimum = -1.5, maximum = 2.25 },
      { type = "array", items = { type = "string", minLength = 1 }, minItems = 1 } })[i] or W.random_schema(r)
    local c = JC.new({ vocab = voc, schema = schema, stop_ids = { ids.eos } })
    local s = c:state()
    for _ = 1, 40 do
      local _, n = c:fill(s, mask)
      local allowed = {}
      local count = 0
      for id = 0, V - 1 do
        local b = list[id + 1]
        local ok = false
        if id == ids.eos then
          ok = c:complete(s)
        elseif b ~= "" and id ~= ids.think then
          local t = c:state()
          C.clrt_jschema_state_copy(t, s)
          ok = C.clrt_jschema_state_advance(t, b, #b) == 0
        end
        probe[id] = ok and 1 or 0
        if ok then count = count + 1; allowed[#allowed + 1] = id end
      end
      T.eq(n, count, "allowed count")
      local same = true
      for id = 0, V - 1 do
        if mask[id] ~= probe[id] then same = false; T.ok(false, ("token %d %q: trie %d, one by one %d"):format(id, list[id + 1], mask[id], probe[id])); break end
      end
      T.ok(same, "masks agree")
      states = states + 1
      if #allowed == 0 then break end
      local pickid = allowed[r(#allowed)]
      if pickid == ids.eos then break end
      c:advance(s, pickid)
    end
  end
  T.ok(states > 300, states .. " states")
end)

T.case("bytes that must never pass: escapes, surrogates, control bytes, bad UTF-8, whitespace runs, bounds", function()
  local function accepts(schema, text, max_ws)
    local c = JC.new({ vocab = voc, grammar = JC.compile(schema, { max_ws = max_ws }) })
    local s = c:state()
    return C.clrt_jschema_state_advance(s, text, #text) == 0, c, s
  end
  local function complete(schema, text)
    local ok, c, s = accepts(schema, text)
    return ok and c:complete(s)
  end
  local str = { type = "string" }
  T.ok(complete(str, '"a\\u00e9\\ud83d\\ude00\\"\\\\\\/\\b\\f\\n\\r\\t"'), "every escape")
  T.ok(not accepts(str, '"\\udc00'), "a lone low surrogate")
  T.ok(not accepts(str, '"\\ud83d\\u0041'), "a high surrogate without its low half")
  T.ok(not accepts(str, '"\\ud83dx'), "a high surrogate then text")
  T.ok(not accepts(str, '"\\x'), "an unknown escape")
  T.ok(not accepts(str, '"a\nb"'), "a raw newline")
  T.ok(not accepts(str, '"\xc0\x80"'), "an overlong encoding")
  T.ok(not accepts(str, '"\xed\xa0\x80"'), "a UTF-8 surrogate")
  T.ok(not accepts(str, '"\xf4\x90\x80\x80"'), "beyond U+10FFFF")
  T.ok(complete(str, '"中文😀"'), "raw UTF-8")
  T.ok(complete({ type = "string", maxLength = 3 }, '"中\\u00e9😀"'), "maxLength counts code points")
  T.ok(not accepts({ type = "string", maxLength = 3 }, '"中\\u00e9😀x'), "a 4th code point")
  T.ok(not accepts({ type = "string", minLength = 2 }, '"a"'), "minLength")
  T.ok(accepts(true, '[1, 2]') and accepts(true, '[1,\n2]'), "one space or newline")
  T.ok(not accepts(true, '[1,  2]') and not accepts(true, '[1,\n 2]'), "two whitespace bytes in a gap")
  T.ok(not accepts(true, '[1,\t2]') and not accepts(true, '[1,\r\n2]'), "tab and carriage return")
  T.ok(accepts(true, '[1,2]', 0) and not accepts(true, '[1, 2]', 0), "max_ws 0: compact only")
  T.ok(not accepts(true, '{"a":1} '), "nothing after the value")
  local int = { type = "integer", minimum = -15, maximum = 37 }
  for _, t in ipairs({ "-15", "37", "0", "-9", "30", "9" }) do T.ok(complete(int, t), t .. " in [-15, 37]") end
  for _, t in ipairs({ "-16", "38", "-0", "01", "3.0", "1e1", "370", "-150" }) do T.ok(not complete(int, t), t .. " refused") end
  T.ok(accepts({ type = "integer", minimum = 37, maximum = 37 }, "3"), "3 can still become 37")
  T.ok(not accepts({ type = "integer", minimum = 37, maximum = 37 }, "4"), "4 cannot become 37")
  T.ok(not accepts({ type = "integer", minimum = 0 }, "-"), "no negative number is >= 0")
  T.ok(not accepts({ type = "integer", minimum = 0, maximum = 3 }, "12"), "12 > 3")
  local num = { type = "number", exclusiveMinimum = 0, maximum = 0.5 }
  T.ok(complete(num, "0.5") and complete(num, "0.0001"), "(0, 0.5]")
  T.ok(not complete(num, "0") and not accepts(num, "0.6") and not accepts(num, "0.50001") and not accepts(num, "1"), "outside (0, 0.5]")
  T.ok(accepts(num, "0.500000"), "0.500000 is 0.5")
end)

T.case("schema features outside the subset are errors that name the keyword and its JSON path", function()
  local cases = {
    { { type = "string", pattern = "^a" }, "'pattern' is not supported", "$.pattern" },
    { { type = "object", properties = { e = { type = "string", format = "email", pattern = "@" } } }, "'pattern' is not supported", "$.properties.e.pattern" },
    { { ["not"] = { type = "string" } }, "'not' is not supported", "$.not" },
    { { properties = { a = { ["if"] = { type = "string" }, ["then"] = {} } } }, "is not supported", "$.properties.a." },
    { { type = "array", items = { type = "integer" }, uniqueItems = true }, "'uniqueItems' is not supported", "$.uniqueItems" },
    { { ["$ref"] = "#/x" }, "names nothing", "$.$ref" },
    { { ["$ref"] = "other.json#/x" }, "points outside this schema", "$.$ref" },
    { { ["$ref"] = "#/$defs/A", type = "string", ["$defs"] = { A = { type = "string" } } }, "'type' beside $ref", "$.type" },
    { { allOf = { { type = "string" }, { maxLength = 2 } } }, "exactly one schema", "$.allOf" },
    { { type = "number", multipleOf = 2 }, "'multipleOf' is not supported", "$.multipleOf" },
    { { type = "array", items = { { type = "string" } } }, "'items' as a list", "$.items" },
    { { anyOf = { { type = "object" }, { type = "object", properties = { a = true } } } }, "alternatives 0 and 1 can both start with '{'", "$.anyOf" },
    { { properties = { x = { anyOf = { { type = "integer" }, { type = "number" } } } } }, "can both start with", "$.properties.x.anyOf" },
    { { type = "string", minLength = 5, maxLength = 2 }, "maxLength 2 is below minLength 5", "$.maxLength" },
    { { type = "array", minItems = 5, maxItems = 2 }, "maxItems 2 is below minItems 5", "$.maxItems" },
    { { type = "integer", minimum = 1.2, maximum = 1.8 }, "no integer lies between", "$.maximum" },
    { { properties = { n = { type = "number", minimum = 3, exclusiveMaximum = 3 } } }, "leaves no value", "$.properties.n.exclusiveMaximum" },
    { { properties = { n = { type = "integer", maximum = 1e300 } } }, "beyond +-2^53", "$.properties.n.maximum" },
    { { properties = { n = { type = "integer", minimum = -9007199254740994 } } }, "beyond +-2^53", "$.properties.n.minimum" },
    { { type = "object", properties = { a = true }, required = { "b" } }, "required property 'b'", "$.required[0]" },
    { { properties = { ["a b"] = { type = "uuid" } } }, "type 'uuid' is not supported", '$.properties["a b"].type' },
    { { enum = {} }, "enum has no value", "$.enum" },
    { { type = "string", enum = { 1, 2 } }, "enum has no value of the given type", "$.enum" },
    { { anyOf = {} }, "anyOf must be a non-empty list", "$.anyOf" },
    { { type = "string", maxLength = -1 }, "maxLength must be a non-negative integer", "$.maxLength" },
    { { properties = { t = { type = { "string", "integer", "string" } } } }, "can both start with '\"'", "$.properties.t.type" },
    { { type = "object", properties = { a = { ["$ref"] = "#" } }, required = { "a" } }, "refers to itself with no way to stop", "$.properties.a.$ref" },
  }
  for _, c in ipairs(cases) do
    local ok, err = pcall(JC.compile, c[1])
    T.ok(not ok, "refused: " .. c[3])
    err = tostring(err)
    T.ok(err:find(c[2], 1, true), ("%s: message %q lacks %q"):format(c[3], err, c[2]))
    T.ok(err:find("(at " .. c[3], 1, true), ("message %q lacks the path %s"):format(err, c[3]))
    T.ok(not err:find("node %d"), "no internal node number in " .. err)
  end
  local deep = { type = "string" }
  for _ = 1, 35 do deep = { type = "array", items = deep, minItems = 1 } end
  T.raises(function() JC.compile(deep) end, "nests deeper")
  T.raises(function() JC.compile(true, { max_ws = 2 }) end, "must be 0 (compact) or 1")
end)

T.case("m:generate options: json = true, json = 'object', errors without a tokenizer", function()
  local dec = W.decoder(V, 8, 300, bias, 3)
  local out = generate(dec, { { 1, 2, 3 } }, { n = 8, max_new_tokens = 200, json = true, tokenizer = tok, stop = { ids.eos }, seed = 4 })
  local done = 0
  for _, row in ipairs(out) do
    if row.finish_reason == "stop" then done = done + 1; check_text(row.text, true, "json = true") end
  end
  T.ok(done >= 6, done .. " of 8 complete")
  out = generate(dec, { { 5 } }, { n = 8, max_new_tokens = 200, json = "object", tokenizer = tok, stop = { ids.eos }, seed = 5 })
  for _, row in ipairs(out) do
    if row.finish_reason == "stop" then T.eq(row.text:match("^%s*(.)"), "{"); check_text(row.text, { type = "object" }, "json = object") end
  end
  -- with no stop id, a complete value ends the row by itself
  out = generate(dec, { { 5 } }, { n = 4, max_new_tokens = 200, json_schema = { enum = { "yes", "no" } }, tokenizer = tok, seed = 6 })
  for _, row in ipairs(out) do
    T.eq(row.finish_reason, "stop")
    local v = row.text:match("^%s*(.-)$")
    T.ok(v == '"yes"' or v == '"no"', row.text)
  end
  T.raises(function() generate(dec, { { 1 } }, { json = true }) end, "needs the tokenizer")
end)

T.run()
