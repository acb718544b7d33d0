-- clrt.llm.extract_json on the replies judges and simulated users actually write.
local T = require("clrt.test")
local ej = clrt.llm.extract_json

local cases = {
  { "plain JSON", '{"score": 8, "reason": "ok"}', { score = 8, reason = "ok" } },
  { "prose around a code fence", 'Here you go:\n```json\n{"accuracy": 1}\n```\nThanks!', { accuracy = 1 } },
  { "single-quoted strings (a Python dict)", "{'a': 'x', 'b': [1, 'two']}", { a = "x", b = { 1, "two" } } },
  { "triple-quoted strings keep newlines and quotes", '{"why": """line one\nsays "hi" """}',
    { why = 'line one\nsays "hi" ' } },
  { "triple single quotes", "{'t': '''it's fine'''}", { t = "it's fine" } },
  { "Python True/False/None", "{'ok': True, 'bad': False, 'x': None}", { ok = true, bad = false } },
  { "any case of true/false/null", '{"a": TRUE, "b": fAlSe, "c": NULL, "d": nil}', { a = true, b = false } },
  { "numeric strings become numbers", '{"score": "8", "p": "0.75", "e": "-1e3", "s": "8 points"}',
    { score = 8, p = 0.75, e = -1000, s = "8 points" } },
  { "numbers in every form", '{"a": -3, "b": 2.5, "c": 1E2, "d": .5, "e": +4}', { a = -3, b = 2.5, c = 100, d = 0.5, e = 4 } },
  { "trailing commas", '{"a": [1, 2, ], "b": 3, }', { a = { 1, 2 }, b = 3 } },
  { "unquoted keys", "{score: 3, interactivity_score: 0.5}", { score = 3, interactivity_score = 0.5 } },
  { "unescaped quotes inside a string", '{"r": "the user said "thanks" twice", "n": 1}',
    { r = 'the user said "thanks" twice', n = 1 } },
  { "escapes and unicode", '{"s": "a\\nb\\t\\u00e9\\ud83d\\ude00\\/"}', { s = "a\nb\t\195\169\240\159\152\128/" } },
  { "nested objects: the outermost wins", 'x {"outer": {"inner": {"v": 2}}} y {"later": 1}',
    { outer = { inner = { v = 2 } } } },
  { "a stray brace in prose before the object", 'Score {not json} follows: {"score": 4}', { score = 4 } },
  { "braces inside strings", '{"text": "use {x} and }", "k": 1}', { text = "use {x} and }", k = 1 } },
  { "empty object", "{}", {} },
}

for _, c in ipairs(cases) do
  T.case(c[1], function() T.eq(ej(c[2]), c[3]) end)
end

T.case("nothing that parses is a clear error", function()
  T.raises(function() ej("I cannot rate this conversation.") end, "no {...} object in the reply: I cannot rate")
  T.raises(function() ej('{"a": 1, "b": }') end, "cannot parse the object at offset 1: expected a value, found '}'")
  T.raises(function() ej('{"a" 1}') end, "expected ':' after key \"a\"")
  T.raises(function() ej('{"a": "unterminated}') end, "unterminated string")
  T.raises(function() ej('{"a": [1, 2}') end, "expected ',' or ']'")
  T.raises(function() ej('{"a": maybe}') end, "expected a value, found 'maybe'")
  T.raises(function() ej(42) end, "expected a string, got number")
end)

T.case("a broken outer object is not replaced by an object nested inside it", function()
  T.raises(function() ej('{"a": {"b": 1}, oops}') end, "cannot parse the object at offset 1")
end)

T.case("deep nesting is an error, not a crash", function()
  T.raises(function() ej(("["):rep(1) .. ("{\"a\":"):rep(300) .. "1" .. ("}"):rep(300)) end, "nesting deeper than 200")
end)

T.case("agrees with cjson on strict JSON", function()
  local cj = require("cjson")   -- lua-cjson as the reference
  local docs = { '{"a": [1, 2.5, "x", {"b": false}], "c": "\\u00fc", "d": {"e": []}}',
                 '{"n": 12345678901, "neg": -0.001, "s": "q\\"uote"}' }
  for _, d in ipairs(docs) do T.eq(ej(d), cj.decode(d)) end
end)

T.run()
