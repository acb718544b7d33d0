-- `clrt serve` as a user runs it, on a real (tiny, random) model folder: 16 concurrent
-- requests each get exactly the reply that in-process greedy generation gives for their own
-- conversation; streamed chunks reassemble to it; n > 1 and stop strings work end to end.
local T = require("clrt.test")
package.path = T.source_dir() .. "/tests/?.lua;" .. package.path
local cjson = require("cjson")

for _, tool in ipairs({ "curl" }) do
  if os.execute("command -v " .. tool .. " > /dev/null 2>&1") ~= 0 then
    io.write("skip: " .. tool .. " is not installed\n")
    os.exit(77)
  end
end

local dir = require("support.tiny_model")(T.tmpdir(), { seed = 2 })
local srv = require("support.serve")(dir, "--slots 32")
local port = srv.port
local bin = os.getenv("CLRT_BIN") or arg[-1]

local m = clrt.model.load(dir)
local tok = clrt.tokenizer.load(dir)

-- Run curl for every body at once; returns the response bodies in order.
local function post_all(bodies, extra_flags)
  local files = {}
  local cmd = {}
  for i, b in ipairs(bodies) do
    local base = ("%s/req%d"):format(dir, i)
    local f = assert(io.open(base .. ".json", "w"))
    f:write(b)
    f:close()
    files[i] = base .. ".out"
    cmd[#cmd + 1] = ("curl -s -N -m 60 %s --data-binary @%s.json -H 'Content-Type: application/json' http://127.0.0.1:%s/v1/chat/completions -o %s &")
      :format(extra_flags or "", base, port, files[i])
  end
  cmd[#cmd + 1] = "wait"
  os.execute(table.concat(cmd, "\n"))
  local out = {}
  for i, p in ipairs(files) do out[i] = T.read(p) end
  return out
end

local function messages_for(i)
  return { { role = "system", content = "be brief" }, { role = "user", content = ("hello %d, how are you today?"):format(i) } }
end

T.case("16 concurrent requests: each reply equals in-process greedy generation", function()
  local bodies = {}
  for i = 1, 16 do
    bodies[i] = cjson.encode({ messages = messages_for(i), temperature = 0, max_tokens = 24 })
  end
  local replies = post_all(bodies)
  for i = 1, 16 do
    local r = cjson.decode(replies[i])
    local want, raw = clrt.chat.generate(m, tok, messages_for(i), { temperature = 0, max_new_tokens = 24 })
    T.eq(r.choices[1].message.content, want, "request " .. i)
    T.eq(r.choices[1].finish_reason, raw.finish_reason)
    T.eq(r.usage.completion_tokens, #raw.tokens)
  end
end)

T.case("prompt caching: a conversation's next request reports cached_tokens and replies as without the cache", function()
  if require("clrt.core.ffi").C.clrt_model_kv_reusable(m.ptr) == 0 then
    io.write("  (no AVX-512: the prefix cache is off on this machine)\n")
    return
  end
  local system = ("you plan a trip for my friend and write a card. "):rep(6)
  local msgs = { { role = "system", content = system }, { role = "user", content = "what is your plan today?" } }
  local r1 = cjson.decode(post_all({ cjson.encode({ messages = msgs, temperature = 0, max_tokens = 16 }) })[1])
  T.eq(r1.usage.prompt_tokens_details.cached_tokens, 0, "first request: nothing cached")
  msgs[#msgs + 1] = { role = "assistant", content = r1.choices[1].message.content }
  msgs[#msgs + 1] = { role = "user", content = "thanks, and the card?" }
  local r2 = cjson.decode(post_all({ cjson.encode({ messages = msgs, temperature = 1, seed = 9, max_tokens = 16 }) })[1])
  local cached = r2.usage.prompt_tokens_details.cached_tokens
  T.ok(cached >= r1.usage.prompt_tokens - 16 and cached < r2.usage.prompt_tokens,
    ("second request: the first one's prompt served (%d cached of %d)"):format(cached, r2.usage.prompt_tokens))
  require("clrt.gen.prefix_cache").configure(m, { mb = 0 })
  local want = clrt.chat.generate(m, tok, msgs, { temperature = 1, seed = 9, max_new_tokens = 16 })
  require("clrt.gen.prefix_cache").configure(m, {})
  T.eq(r2.choices[1].message.content, want, "same reply as a cache-off run in process")
end)

T.case("16 concurrent sampled requests (prefilled together): each equals its seed run alone", function()
  local bodies = {}
  for i = 1, 16 do
    bodies[i] = cjson.encode({ messages = messages_for(i), temperature = 1, seed = 100 + i, max_tokens = 24 })
  end
  local replies = post_all(bodies)
  for i = 1, 16 do
    local r = cjson.decode(replies[i])
    local want = clrt.chat.generate(m, tok, messages_for(i), { temperature = 1, seed = 100 + i, max_new_tokens = 24 })
    T.eq(r.choices[1].message.content, want, "request " .. i)
  end
end)

T.case("a streamed reply reassembles to the same text; n = 3 gives 3 choices", function()
  local body = cjson.encode({ messages = messages_for(99), temperature = 0, max_tokens = 30, stream = true })
  local stream = post_all({ body })[1]
  local parts = {}
  for payload in stream:gmatch("data: ([^\n]+)") do
    if payload ~= "[DONE]" then
      for _, ch in ipairs(cjson.decode(payload).choices) do
        if ch.delta.content then parts[#parts + 1] = ch.delta.content end
      end
    end
  end
  local want = clrt.chat.generate(m, tok, messages_for(99), { temperature = 0, max_new_tokens = 30 })
  T.eq(table.concat(parts), want)
  local three = cjson.decode(post_all({ cjson.encode({ messages = messages_for(5), n = 3, temperature = 1, seed = 4, max_tokens = 8 }) })[1])
  T.eq(#three.choices, 3)
end)

T.case("a stop string ends the reply before it, across token boundaries", function()
  local full = clrt.chat.generate(m, tok, messages_for(7), { temperature = 0, max_new_tokens = 40 })
  if #full < 6 then T.skip("the random model's reply is too short to cut") end
  local stop = full:sub(4, 6)
  local r = cjson.decode(post_all({ cjson.encode({ messages = messages_for(7), temperature = 0, max_tokens = 40, stop = { stop } }) })[1])
  local at = full:find(stop, 1, true)
  T.eq(r.choices[1].message.content, full:sub(1, at - 1))
  T.eq(r.choices[1].finish_reason, "stop")
end)

-- The text of a stream (choice 0), and whether its choices were always arrays.
local function streamed_text(stream)
  local parts, arrays, finish = {}, true, nil
  for payload in stream:gmatch("data: ([^\n]+)") do
    if payload ~= "[DONE]" then
      if not payload:find('"choices":[', 1, true) then arrays = false end
      for _, ch in ipairs(cjson.decode(payload).choices) do
        if ch.delta.content then parts[#parts + 1] = ch.delta.content end
        if ch.finish_reason ~= cjson.null then finish = ch.finish_reason end
      end
    end
  end
  return table.concat(parts), arrays, finish
end

T.case("streamed text equals non-streamed text over seeds and stop strings that span tokens", function()
  local cases, bodies = {}, {}
  for seed = 1, 12 do
    local msgs = messages_for(seed)
    local full = clrt.chat.generate(m, tok, msgs, { temperature = 1, seed = seed, max_new_tokens = 40 })
    -- stops cut from the reply itself (so they match mid-way, across tokens), plus one that never does
    local stops = { "zzq" }
    if #full >= 8 then stops[#stops + 1] = full:sub(seed % 4 + 3, seed % 4 + 6) end
    if #full >= 14 then stops[#stops + 1] = full:sub(10, 11) end
    for _, stream in ipairs({ false, true }) do
      cases[#cases + 1] = { seed = seed, stream = stream }
      bodies[#bodies + 1] = cjson.encode({ messages = msgs, temperature = 1, seed = seed, max_tokens = 40, stop = stops, stream = stream })
    end
  end
  local replies = post_all(bodies)
  local cut = 0
  for i = 1, #cases, 2 do
    local plain = cjson.decode(replies[i]).choices[1]
    local text, arrays, finish = streamed_text(replies[i + 1])
    T.eq(text, plain.message.content, "seed " .. cases[i].seed)
    T.eq(finish, plain.finish_reason, "seed " .. cases[i].seed)
    T.ok(arrays, "every chunk's choices is an array")
    if plain.finish_reason == "stop" then cut = cut + 1 end
  end
  T.ok(cut >= 6, cut .. " of 12 replies ended at a stop string")
end)

T.case("logprobs / top_logprobs: the model's own log-probabilities, in OpenAI's shape, streamed and not", function()
  local msgs = messages_for(42)
  local base = { messages = msgs, temperature = 0, max_tokens = 16, logprobs = true, top_logprobs = 3 }
  local plain_body = cjson.encode(base)
  base.stream = true
  local replies = post_all({ plain_body, cjson.encode(base) })
  local r = cjson.decode(replies[1])
  local ch = r.choices[1]
  local content = ch.logprobs.content
  T.ok(#content >= 1 and #content <= r.usage.completion_tokens, "one entry per sampled token")
  -- the reference: the training path's log p(token | prefix) over prompt + reply
  local ids = clrt.chat.render(tok, msgs, { add_generation_prompt = true })
  local reply_ids = tok:encode(ch.message.content, { add_special_tokens = false })
  local row = {}
  for _, id in ipairs(ids) do row[#row + 1] = id end
  local text = {}
  for i, e in ipairs(content) do
    T.eq(#e.top_logprobs, 3, "top_logprobs has k entries")
    T.eq(e.token, e.top_logprobs[1].token, "greedy takes the most likely token")
    T.ok(math.abs(e.logprob - e.top_logprobs[1].logprob) < 1e-6)
    T.ok(e.top_logprobs[1].logprob >= e.top_logprobs[2].logprob and e.top_logprobs[2].logprob >= e.top_logprobs[3].logprob, "best first")
    T.ok(e.logprob <= 0)
    text[i] = string.char(unpack(e.bytes))
    T.eq(e.token, text[i])
  end
  T.eq(table.concat(text), ch.message.content, "the tokens' bytes spell the reply")
  if #reply_ids == #content then
    for _, id in ipairs(reply_ids) do row[#row + 1] = id end
    local lp = m:logprobs({ row }, { grad = false }):totable()[1]
    for i, e in ipairs(content) do
      T.ok(math.abs(e.logprob - lp[#ids + i - 1]) < 2e-3, ("token %d: %g vs the forward's %g"):format(i, e.logprob, lp[#ids + i - 1]))
    end
  end
  local streamed = {}
  for payload in replies[2]:gmatch("data: ([^\n]+)") do
    if payload ~= "[DONE]" then
      for _, c in ipairs(cjson.decode(payload).choices) do
        if type(c.logprobs) == "table" then
          for _, e in ipairs(c.logprobs.content) do streamed[#streamed + 1] = e end
        end
      end
    end
  end
  -- the two requests may be prefilled in one batched forward, where a row's sums round
  -- differently from a forward of its own (~1e-7): the same tokens, log-probabilities to 1e-5
  T.eq(#streamed, #content, "one streamed entry per token")
  for i, e in ipairs(content) do
    local f = streamed[i]
    T.eq({ f.token, f.bytes, #f.top_logprobs }, { e.token, e.bytes, #e.top_logprobs }, "streamed entry " .. i)
    T.ok(math.abs(f.logprob - e.logprob) < 1e-5, "streamed logprob " .. i)
    for j, t in ipairs(e.top_logprobs) do
      T.eq(f.top_logprobs[j].token, t.token)
      T.ok(math.abs(f.top_logprobs[j].logprob - t.logprob) < 1e-5)
    end
  end
  local bad = cjson.decode(post_all({ cjson.encode({ messages = msgs, logprobs = true, top_logprobs = 21 }) })[1])
  T.eq(bad.error.param, "top_logprobs")
end)

T.case("a busy port is a one-line error", function()
  local out = dir .. "/busy.log"
  local rc = os.execute(("%s serve %s --port %s > %s 2>&1"):format(bin, dir, port, out))
  local said = T.read(out) or ""
  T.ok(rc ~= 0, "a second server on the same port should fail")
  T.ok(said:find("cannot listen", 1, true), said)
  T.ok(not said:find("traceback", 1, true) and select(2, said:gsub("\n", "")) == 1, "not one line: " .. said)
end)

T.run()
