-- `clrt serve`'s request parameters over raw HTTP on a real (tiny, random) model: logit_bias
-- has its OpenAI effect (a bias added to the logits before sampling, per request, streamed or
-- not, equal to in-process generation with the same bias), a bias on one row leaves the rows
-- decoded beside it unchanged, and client mistakes (bad logit_bias, text that is not UTF-8,
-- parameters the server does not support) are 400s naming the field, with no source path.
local T = require("clrt.test")
package.path = T.source_dir() .. "/tests/?.lua;" .. package.path
local cjson = require("cjson")
local gen = require("clrt.gen.engine")
local options = require("clrt.gen.options")

if os.execute("command -v curl > /dev/null 2>&1") ~= 0 then
  io.write("skip: curl is not installed\n")
  os.exit(77)
end

local dir = require("support.tiny_model")(T.tmpdir(), { seed = 5 })
local srv = require("support.serve")(dir, "--slots 8")
local m = clrt.model.load(dir)
local tok = clrt.tokenizer.load(dir)
local V = m.config.vocab_size

-- POST a raw body; returns the HTTP status and the body.
local n_posts = 0
local function post(body, path)
  n_posts = n_posts + 1
  local base = ("%s/p%d"):format(dir, n_posts)
  local f = assert(io.open(base .. ".json", "wb"))
  f:write(body)
  f:close()
  local p = io.popen(("curl -s -N -m 60 -o %s.out -w '%%{http_code}' --data-binary @%s.json -H 'Content-Type: application/json' http://127.0.0.1:%d%s")
    :format(base, base, srv.port, path or "/v1/chat/completions"))
  local status = tonumber(p:read("*a"))
  p:close()
  return status, T.read(base .. ".out") or ""
end

local msgs = { { role = "user", content = "plan a trip for my friend" } }
local function chat_body(extra)
  local b = { messages = msgs, temperature = 0, max_tokens = 12 }
  for k, v in pairs(extra or {}) do b[k] = v end
  return cjson.encode(b)
end
local function reply(body)
  local status, out = post(body)
  T.eq(status, 200, out)
  return cjson.decode(out).choices[1].message.content
end
local function streamed(body, path)
  local status, out = post(body, path)
  T.eq(status, 200, out)
  local text = {}
  for data in out:gmatch("data: ([^\n]+)") do
    if data ~= "[DONE]" then
      local c = cjson.decode(data).choices[1]
      local piece = c and (c.delta and c.delta.content or c.text)
      if piece then text[#text + 1] = piece end
    end
  end
  return table.concat(text)
end

-- the greedy reply in-process, its tokens, and the prompt ids
local prompt = clrt.chat.render(tok, msgs, { add_generation_prompt = true })
local stop = clrt.chat.stop_ids(tok)
local function local_gen(opts)
  local o = { temperature = 0, max_new_tokens = 12, stop = stop, tokenizer = tok }
  for k, v in pairs(opts or {}) do o[k] = v end
  return m:generate({ prompt }, o)[1]
end
local greedy = local_gen()

T.case("logit_bias -100 on the greedy token changes the reply, as in-process generation with it", function()
  local first = greedy.tokens[1]
  T.eq(reply(chat_body()), greedy.text, "no bias: the server's reply is the greedy one")
  local biased = local_gen({ logit_bias = { [first] = -100 } })
  T.ok(biased.tokens[1] ~= first, "in-process: the biased token is no longer chosen")
  local body = chat_body({ logit_bias = { [tostring(first)] = -100 } })
  local got = reply(body)
  T.ok(got ~= greedy.text, "the reply changed")
  T.eq(got, biased.text, "and equals in-process generation with the bias")
  T.eq(streamed(chat_body({ logit_bias = { [tostring(first)] = -100 }, stream = true })), biased.text, "streamed too")
end)

T.case("logit_bias +100 forces a token, greedy and sampled, streamed and not", function()
  -- a token that is not the end of the turn, so the row runs to max_tokens
  local forced = 40
  for _, temp in ipairs({ 0, 1 }) do
    for _, stream in ipairs({ false, true }) do
      local body = chat_body({ temperature = temp, seed = 3, stream = stream, logit_bias = { [tostring(forced)] = 100 } })
      local want = tok:decode((function() local t = {} for i = 1, 12 do t[i] = forced end return t end)(), { skip_special_tokens = true })
      local got = stream and streamed(body) or reply(body)
      T.eq(got, want, ("temperature %g, stream %s"):format(temp, tostring(stream)))
    end
  end
end)

T.case("a bias on one row leaves the rows decoded beside it unchanged (one engine step, several rows)", function()
  local dec = m:decoder(4, 128)
  local function rows_of(list)   -- list of {prompt, opts}: all added before the first step
    local eng = gen.engine(dec)
    local rows = {}
    for i, x in ipairs(list) do
      rows[i] = eng:add(x[1], options.check(x[2], V), nil, 1, 0)[1]
    end
    while eng:busy() do eng:step() end
    return rows
  end
  local plain = { temperature = 1, seed = 7, max_new_tokens = 10 }
  local biased = { temperature = 1, seed = 7, max_new_tokens = 10, logit_bias = { [greedy.tokens[1]] = -100, [17] = 5 } }
  local alone = rows_of({ { prompt, plain } })[1].tokens
  local alone_b = rows_of({ { prompt, biased } })[1].tokens
  for _, order in ipairs({ { 1, 2 }, { 2, 1 } }) do   -- the biased row second in the batch, then first
    local list = {}
    list[order[1]], list[order[2]] = { prompt, plain }, { prompt, biased }
    list[3] = { { 3, 4, 5 }, plain }
    local together = rows_of(list)
    T.eq(together[order[1]].tokens, alone, "the unbiased row beside a biased one")
    T.eq(together[order[2]].tokens, alone_b, "the biased row is the same as alone")
  end
  T.ok(table.concat(alone, ",") ~= table.concat(alone_b, ","), "the bias changed its row")
  -- top_logprobs report the model's own log-probabilities, not the biased ones
  local forced = { temperature = 0, max_new_tokens = 4, logit_bias = { [40] = 100 }, top_logprobs = 0 }
  local row = rows_of({ { prompt, forced } })[1]
  local seq = {}
  for _, id in ipairs(prompt) do seq[#seq + 1] = id end
  for _, id in ipairs(row.tokens) do seq[#seq + 1] = id end
  local lp = m:logprobs({ seq }, { grad = false })
  for i, id in ipairs(row.tokens) do
    T.eq(id, 40)
    T.near(row.model_logprobs[i].lp, lp:get(1, #prompt + i - 1), 1e-3, "token " .. i)
  end
  T.ok(row.model_logprobs[1].lp < -1, "a forced token the model finds unlikely keeps its low log-probability")
  T.raises(function() options.check({ logit_bias = { [V] = 1 } }, V) end, "logit_bias")
  T.raises(function() options.check({ logit_bias = { [1] = 101 } }, V) end, "logit_bias")
end)

T.case("frequency_penalty and presence_penalty: the reply equals in-process generation with them", function()
  for _, c in ipairs({ { frequency_penalty = 1.5 }, { presence_penalty = 2 }, { frequency_penalty = -1, presence_penalty = 0.5 } }) do
    local want = local_gen({ frequency_penalty = c.frequency_penalty, presence_penalty = c.presence_penalty, max_new_tokens = 12 })
    local got = reply(chat_body(c))
    T.eq(got, want.text, cjson.encode(c))
    if (c.presence_penalty or 0) > 0 and (c.frequency_penalty or 0) >= 0 then
      T.ok(got ~= greedy.text, "a positive penalty changes this repetitive greedy reply: " .. cjson.encode(c))
    end
  end
end)

T.case("/v1/completions continues a plain prompt; logit_bias applies there too, streamed and not", function()
  local text_prompt = "plan a trip for my"
  local ids = tok:encode(text_prompt)
  local function complete(opts)
    local o = { temperature = 0, max_new_tokens = 10, stop = stop, tokenizer = tok }
    for k, v in pairs(opts or {}) do o[k] = v end
    return m:generate({ ids }, o)[1]
  end
  local plain = complete()
  local function body(extra)
    local b = { prompt = text_prompt, temperature = 0, max_tokens = 10 }
    for k, v in pairs(extra or {}) do b[k] = v end
    return cjson.encode(b)
  end
  local status, out = post(body(), "/v1/completions")
  T.eq(status, 200, out)
  local r = cjson.decode(out)
  T.eq(r.object, "text_completion")
  T.eq(r.choices[1].text, plain.text, "the greedy continuation, as in-process")
  T.eq(r.usage.prompt_tokens, #ids)
  T.eq(streamed(body({ stream = true }), "/v1/completions"), plain.text, "streamed")
  local status_ids, out_ids = post(cjson.encode({ prompt = ids, temperature = 0, max_tokens = 10 }), "/v1/completions")
  T.eq({ status_ids, cjson.decode(out_ids).choices[1].text }, { 200, plain.text }, "a prompt of token ids")
  local biased = complete({ logit_bias = { [plain.tokens[1]] = -100 } })
  local lb = { [tostring(plain.tokens[1])] = -100 }
  local _, out_b = post(body({ logit_bias = lb }), "/v1/completions")
  T.ok(biased.text ~= plain.text, "the bias changes the continuation")
  T.eq(cjson.decode(out_b).choices[1].text, biased.text, "-100 on the greedy token, as in-process")
  T.eq(streamed(body({ logit_bias = lb, stream = true }), "/v1/completions"), biased.text, "streamed")
  local _, out_f = post(body({ logit_bias = { ["40"] = 100 }, temperature = 1, seed = 2 }), "/v1/completions")
  local forty = {}
  for i = 1, 10 do forty[i] = 40 end
  T.eq(cjson.decode(out_f).choices[1].text, tok:decode(forty, { skip_special_tokens = true }), "+100 forces a token")
end)

-- Every error body: a 400 whose param and message name `field`, and no source path.
local function expect_400(body, field, what, path)
  local status, out = post(body, path)
  T.eq(status, 400, what .. ": " .. out)
  local ok, e = pcall(cjson.decode, out)
  T.ok(ok and type(e.error) == "table", what .. ": an OpenAI error object")
  if field then
    T.eq(e.error.param, field, what .. ": " .. out)
    T.ok(e.error.message:find(field, 1, true), what .. ": the message names " .. field .. ": " .. e.error.message)
  end
  T.ok(not out:find("%.lua"), what .. ": no source path in " .. out)
end

T.case("bad logit_bias values are 400s naming logit_bias", function()
  for _, lb in ipairs({ '{"abc": 1}', '{"-1": 1}', '{"1.5": 1}', '{"1e2": 1}', ('{"%d": 1}'):format(V),
    '{"5": 101}', '{"5": -100.5}', '{"5": "x"}', '{"5": null}', '[1, 2]', '"x"', '5' }) do
    local body = chat_body():gsub("}$", ', "logit_bias": ' .. lb .. "}")
    expect_400(body, "logit_bias", "logit_bias " .. lb)
  end
  expect_400('{"prompt": "hi", "logit_bias": {"x": 1}}', "logit_bias", "on /v1/completions", "/v1/completions")
  local many = {}
  for i = 0, 300 do many[tostring(i)] = 1 end
  expect_400(chat_body({ logit_bias = many }), "logit_bias", "301 entries")
end)

T.case("text that is not UTF-8 is a 400 naming its field, never a 500 with a source path", function()
  local cases = {
    { '{"messages": [{"role": "user", "content": "caf\xe9"}]}', "messages[0].content" },
    { '{"messages": [{"role": "user", "content": "\\ud800 lone"}]}', nil, "a lone surrogate escape (not JSON)" },
    { '{"messages": [{"role": "user", "content": "ov\xc0\xafer"}]}', "messages[0].content" },
    { '{"messages": [{"role": "user", "content": "sur\xed\xa0\x80"}]}', "messages[0].content" },
    { '{"messages": [{"role": "user", "content": "big\xf4\x90\x80\x80"}]}', "messages[0].content" },
    { '{"messages": [{"role": "system", "content": "ok"}, {"role": "user", "content": [{"type": "text", "text": "cut\xe2\x82"}]}]}',
      "messages[1].content[0].text" },
    { '{"model": "m\xff", "messages": [{"role": "user", "content": "hi"}]}', "model" },
  }
  for _, c in ipairs(cases) do expect_400(c[1], c[2], c[3] or c[2]) end
  -- still well-formed multi-byte text is fine
  local status = post(cjson.encode({ messages = { { role = "user", content = "café ☕ 😀" } }, max_tokens = 2 }))
  T.eq(status, 200)
end)

T.case("an error message sent to a client carries no source position", function()
  local clean = require("clrt.net.openai_server").without_source
  T.eq(clean("internal error: /opt/clrt/lua/clrt/chat.lua:493: tokenizer: input is not valid UTF-8"),
    "internal error: tokenizer: input is not valid UTF-8")
  T.eq(clean('x.lua:1: [string "chunk"]:3: boom'), "boom")
  T.eq(clean("a plain message: nothing to cut"), "a plain message: nothing to cut")
end)

T.case("parameters the server does not apply, or out of range, are refused with a 400 naming them", function()
  expect_400(chat_body({ frequency_penalty = 2.5 }), "frequency_penalty", "frequency_penalty out of range")
  expect_400(chat_body({ presence_penalty = "1" }), "presence_penalty", "presence_penalty not a number")
  expect_400(chat_body({ top_k = 5 }), "top_k", "an unknown parameter")
  expect_400(chat_body({ functions = { { name = "f" } } }), "functions", "the old functions parameter")
  expect_400(cjson.encode({ messages = { { role = "user", content = "hi", name = "ann" } } }), "messages[0].name", "a message's name")
  expect_400(chat_body({ parallel_tool_calls = "no" }), "parallel_tool_calls", "parallel_tool_calls")
  expect_400(chat_body({ user = 5 }), "user", "user")
  local C = "/v1/completions"
  expect_400('{"prompt": "hi", "echo": true}', "echo", "echo", C)
  expect_400('{"prompt": "hi", "suffix": "x"}', "suffix", "suffix", C)
  expect_400('{"prompt": "hi", "logprobs": 2}', "logprobs", "logprobs on completions", C)
  expect_400('{"prompt": "hi", "best_of": 3}', "best_of", "best_of", C)
  expect_400('{"prompt": ["a", "b"]}', "prompt", "several prompts", C)
  expect_400('{"prompt": [1, 99999]}', "prompt[1]", "a token id past the vocabulary", C)
  expect_400('{"prompt": ""}', "prompt", "an empty prompt", C)
  expect_400('{"prompt": "caf\xe9"}', "prompt", "a prompt that is not UTF-8", C)
  expect_400('{"prompt": "hi", "messages": []}', "messages", "a chat parameter on completions", C)
  expect_400('{"prompt": "hi", "frequency_penalty": -3}', "frequency_penalty", "a penalty out of range on completions", C)
  -- the no-op values clients send by default are accepted
  T.eq(reply(chat_body({ frequency_penalty = 0, presence_penalty = 0, user = "u1", parallel_tool_calls = true })), greedy.text)
end)

T.run()
