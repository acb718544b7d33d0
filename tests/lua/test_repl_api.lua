-- What a user meets at the REPL, on a real (tiny, random) model folder: the public methods
-- say what they expected when given the wrong thing (m:generate(tok, "text") among them),
-- m:chat answers in one call (with or without the tokenizer, a text or messages) exactly as
-- clrt.chat.generate does, and help(x) prints the doc comments of modules, objects and
-- functions.
local T = require("clrt.test")
package.path = T.source_dir() .. "/tests/?.lua;" .. package.path

local dir = require("support.tiny_model")(T.tmpdir(), { seed = 4 })
local m = clrt.model.load(dir)
local tok = clrt.tokenizer.load(dir)

T.case("m:generate and m:decoder name what they expected", function()
  T.raises(function() m:generate(tok, "Plan a trip.", { max_new_tokens = 20 }) end, "prompts must be a list of token lists")
  T.raises(function() m:generate(tok, "Plan a trip.", { max_new_tokens = 20 }) end, "m:chat(tok, text)")
  T.raises(function() m:generate("Plan a trip.") end, "not a string: m:generate({tok:encode(text)}, opts)")
  T.raises(function() m:generate({ 1, 2, 3 }) end, "this is one token list: wrap it")
  T.raises(function() m:generate({}) end, "this list is empty")
  T.raises(function() m:generate({ { 1, 2 }, "x" }) end, "prompts[2] is a string")
  T.raises(function() m:generate({ { 1, 2 } }, 5) end, "opts must be a table")
  T.raises(function() m:generate({ { 1, 2 } }, { max_tokens = 5 }) end, "unknown option 'max_tokens'")
  T.raises(function() m:generate({ { 1, 2 } }, { logit_bias = { [1] = 500 } }) end, "logit_bias")
  T.raises(function() m:decoder(0, 64) end, "slots must be a positive integer")
  T.raises(function() m:decoder(2, 1.5) end, "max_len must be a positive integer")
  -- a right call still works after the wrong ones
  T.eq(#m:generate({ { 1, 2, 3 } }, { max_new_tokens = 3, temperature = 0 })[1].tokens, 3)
end)

T.case("the model's and tokenizer's functions check their arguments", function()
  T.raises(function() clrt.model.load(5) end, "dir must be the path of a Hugging Face model folder")
  T.raises(function() clrt.model.load(dir, "bf16") end, "opts must be a table")
  T.raises(function() clrt.model.new("config.json") end, "cfg must be a table")
  T.raises(function() m:save(1) end, "m:save(dir): dir must be a folder path")
  T.raises(function() clrt.tokenizer.load() end, "path must be a model folder or a tokenizer.json")
  T.raises(function() tok:encode(5) end, "tok:encode(text, opts): text must be a string, got a number")
  T.raises(function() tok:encode("x", true) end, "opts must be a table")
  T.raises(function() tok:decode("hello") end, "ids must be a list of token ids, got a string")
  T.raises(function() tok:decode({ 1, "2" }) end, "ids[2] = 2 is not a token id")
  T.raises(function() tok:decode({ 1, 2.5 }) end, "ids[2] = 2.5 is not a token id")
  T.raises(function() tok:decode({ tok:vocab_size() }) end, "is not in the vocabulary")
  T.raises(function() tok:token_bytes(-1) end, "tok:token_bytes(id): -1 is not a token id")
  T.raises(function() tok:id(5) end, "tok:id(token): token must be a string")
  T.raises(function() tok:encode_batch({ "a", 2 }) end, "texts[2] is a number")
  T.raises(function() clrt.chat.generate(m, tok, "Plan a trip.") end, "messages must be a non-empty list")
  T.raises(function() clrt.chat.generate(tok, m, {}) end, "m must be a model")
  T.raises(function() clrt.chat.generate(m, nil, { { role = "user", content = "x" } }) end, "tok must be a tokenizer")
end)

T.case("m:chat answers in one call, as clrt.chat.generate does", function()
  local q = { { role = "user", content = "Plan a trip." } }
  local want = clrt.chat.generate(m, tok, q, { temperature = 0.7, max_new_tokens = 16 })
  T.eq(m:chat(tok, "Plan a trip.", { max_new_tokens = 16 }), want, "with the tokenizer, a text")
  T.eq(m:chat("Plan a trip.", { max_new_tokens = 16 }), want, "without: the folder's tokenizer")
  T.eq(m:chat(q, { max_new_tokens = 16 }), want, "a messages list")
  local greedy = clrt.chat.generate(m, tok, q, { temperature = 0, max_new_tokens = 16 })
  T.eq(m:chat("Plan a trip.", { temperature = 0, max_new_tokens = 16 }), greedy, "opts reach generate")
  local text, raw = m:chat("Plan a trip.", { max_new_tokens = 4 })
  T.eq(type(text), "string")
  T.ok(#raw.tokens >= 1 and #raw.tokens <= 4, "the raw entry comes second")
  T.raises(function() m:chat(5) end, "the first argument must be a tokenizer, a text or a list of messages")
  T.raises(function() m:chat({}) end, "got an empty table")
  T.raises(function() m:chat({ { role = "user" } }) end, "message 1 must be {role")
  local fresh = clrt.model.new(m.config, { seed = 1 })
  T.raises(function() fresh:chat("hi") end, "not loaded from a folder")
  T.eq(type(fresh:chat(tok, "hi", { max_new_tokens = 2 })), "string", "a new() model with a tokenizer")
end)

-- What help(...) prints.
local function help_text(...)
  local real, parts = io.stdout, {}
  io.stdout = { write = function(_, ...) for _, s in ipairs({ ... }) do parts[#parts + 1] = s end end, flush = function() end }
  local ok, err = pcall(require("clrt.cli.help").help, ...)
  io.stdout = real
  if not ok then error(err, 2) end
  return table.concat(parts)
end

T.case("what the REPL prints of a tokenizer and of a reply's record is one short line", function()
  local show = require("clrt.cli.repl").show or require("clrt.cli.repl").format
  T.ok(tostring(tok):match("^clrt%.tokenizer%(vocab %d+"), tostring(tok))
  local text, raw = clrt.chat.generate(m, tok, { { role = "user", content = "Plan a trip." } }, { max_new_tokens = 4, temperature = 0 })
  T.eq(type(text), "string")
  T.ok(tostring(raw):match("^%(%d+ tokens, finish_reason %a+%)$"), tostring(raw))
  T.ok(not tostring(raw):find("table: 0x", 1, true))
  local _, raw2 = m:chat(tok, "Plan a trip.", { max_new_tokens = 4, temperature = 0 })
  T.ok(tostring(raw2):match("^%(%d+ tokens"), "m:chat's record too: " .. tostring(raw2))
  if show then T.ok(not show(tok):find("table: 0x", 1, true), show(tok)) end
end)

T.case("help(x) prints the doc comments of modules, objects, methods and names", function()
  local all = help_text()
  T.ok(all:find("model%s+the Llama%-family transformer"), "help(): a module's first sentence\n" .. all)
  T.ok(all:find("tokenizer%s+Hugging Face tokenizer.json"), "help(): the tokenizer module")
  T.ok(all:find('m:chat("Plan a trip.")', 1, true), "help(): how to start")
  local mod = help_text(clrt.model)
  T.ok(mod:find("clrt.model (lua/clrt/model.lua)", 1, true), mod)
  T.ok(mod:find("model.load(dir, opts)", 1, true), "help(clrt.model) lists load with its arguments")
  T.ok(mod:find("Model:chat(tok, input, opts)", 1, true), "and the Model class's methods")
  local obj = help_text(m)
  for _, name in ipairs({ "m:chat(", "m:generate(prompts, opts)", "m:decoder(", "m:logprobs(", "m:save(dir)", "m:tokenizer()" }) do
    T.ok(obj:find(name, 1, true), "help(m) lists " .. name .. "\n" .. obj)
  end
  T.ok(obj:find("one entry per", 1, true) == nil, "one line each, not the whole comment")
  local t = help_text(tok)
  T.ok(t:find("tok:encode(text, opts)", 1, true) and t:find("tok:decode(ids, opts)", 1, true), t)
  local tt = help_text(clrt.tensor.ones({ 2 }))
  T.ok(tt:find("Tensor (clrt.tensor.Tensor)", 1, true) and tt:find("t:sum(", 1, true), "help(a tensor)\n" .. tt)
  local g = help_text(m.generate)
  T.ok(g:find("Model:generate(prompts, opts)", 1, true) and g:find("prompt-major", 1, true), g)
  T.eq(help_text("model.generate"), g, "by name, the same")
  T.ok(help_text("clrt.chat.generate"):find("One assistant reply as text", 1, true))
  T.ok(help_text("tokenizer.load"):find("tokenizer_config.json beside it", 1, true))
  T.ok(help_text("model.nope"):find("clrt.model has no 'nope'", 1, true))
  -- a bare function name: where functions of that name are, not an error
  local bare = help_text("generate")
  T.ok(bare:find("'generate' is ", 1, true) and bare:find("Model:generate", 1, true) and bare:find("clrt.chat.generate", 1, true), bare)
  rawset(_G, "mm", m)   -- a global object by name, as typed at the prompt
  T.ok(help_text("mm:chat"):find("chat([tok,] text or messages", 1, true), "help(\"mm:chat\")")
  T.ok(help_text("mm"):find("m:generate(prompts, opts)", 1, true), "help(\"mm\")")
  rawset(_G, "mm", nil)
  T.ok(help_text(42):find("a number has no doc", 1, true))
end)

T.run()
