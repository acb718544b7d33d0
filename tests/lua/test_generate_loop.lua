-- The generation loop (clrt.gen.engine; whole requests through clrt.gen.scheduler.generate)
-- over a fake decoder whose next-token logits are a known function of (slot's last token,
-- position): greedy must follow that function, samples must be reproducible by seed, and stop
-- rules, n>1 prefill sharing and limits must hold.
local T = require("clrt.test")
local gen = require("clrt.gen.engine")
local options = require("clrt.gen.options")

package.path = T.source_dir() .. "/tests/lua/?.lua;" .. package.path
local fake = require("support.fake_model")
local V = fake.V
local fake_decoder, greedy_reference, generate = fake.decoder, fake.greedy_reference, fake.generate

T.case("greedy follows the model on ragged prompts", function()
  local prompts = { { 1, 2, 3 }, { 4 }, { 5, 6, 7, 8, 9, 10 } }
  local res = generate(fake_decoder(8, 64), prompts, { temperature = 0, max_new_tokens = 9 })
  T.eq(#res, 3)
  for i, p in ipairs(prompts) do
    T.eq(res[i].tokens, greedy_reference(p, 9), "prompt " .. i)
    T.eq(res[i].finish_reason, "length")
    T.eq(res[i].logprobs[1], 0)
  end
end)

T.case("n samples share one prefill, are reproducible by seed, and differ from each other", function()
  local d = fake_decoder(8, 64)
  local a = generate(d, { { 1, 2 }, { 3 } }, { n = 3, temperature = 1.0, max_new_tokens = 12, seed = 5 })
  T.eq(d.prefills, 2)
  T.eq(#a, 6)
  local b = generate(fake_decoder(8, 64), { { 1, 2 }, { 3 } }, { n = 3, temperature = 1.0, max_new_tokens = 12, seed = 5 })
  for i = 1, 6 do T.eq(a[i].tokens, b[i].tokens) end
  T.ok(not T.deep_eq(a[1].tokens, a[2].tokens), "two samples of one prompt should differ")
  local c = generate(fake_decoder(8, 64), { { 1, 2 }, { 3 } }, { n = 3, temperature = 1.0, max_new_tokens = 12, seed = 6 })
  T.ok(not T.deep_eq(a[1].tokens, c[1].tokens), "another seed should differ")
  for _, r in ipairs(a) do for _, lp in ipairs(r.logprobs) do T.ok(lp <= 0 and lp > -50) end end
end)

T.case("stop ids end a row, which then stops costing compute", function()
  local ref = greedy_reference({ 2 }, 10)
  local stop_at = 4
  local d = fake_decoder(4, 64)
  local res = generate(d, { { 2 }, { 7 } }, { temperature = 0, max_new_tokens = 10, stop = { ref[stop_at] } })
  T.eq(res[1].finish_reason, "stop")
  T.eq(#res[1].tokens, (function() for i = 1, 10 do if ref[i] == ref[stop_at] then return i end end end)())
  T.ok(d.decoded_rows < 2 * 9, "finished rows must leave the batch")
end)

T.case("max_new_tokens 0 and 1", function()
  local r0 = generate(fake_decoder(2, 16), { { 1 } }, { max_new_tokens = 0 })
  T.eq(r0[1].tokens, {})
  T.eq(r0[1].finish_reason, "length")
  local r1 = generate(fake_decoder(2, 16), { { 1 } }, { max_new_tokens = 1, temperature = 0 })
  T.eq(r1[1].tokens, greedy_reference({ 1 }, 1))
end)

T.case("logit_bias and the frequency/presence penalties follow OpenAI's formula, per row", function()
  -- greedy by hand: logit + bias, then - (count * frequency + (count > 0) * presence), in f32
  local ffi = require("ffi")
  local function f32(x) return tonumber(ffi.new("float", x)) end
  local function reference(prompt, steps, o)
    local last, pos, out, counts = prompt[#prompt], #prompt, {}, {}
    for _ = 1, steps do
      local best, arg = -math.huge, 0
      for v = 0, V - 1 do
        local l = f32(fake.logit(last, pos, v))
        if o.logit_bias and o.logit_bias[v] then l = f32(l + o.logit_bias[v]) end
        local c = counts[v] or 0
        if c > 0 then l = f32(l - (c * (o.frequency_penalty or 0) + (o.presence_penalty or 0))) end
        if l > best then best, arg = l, v end
      end
      out[#out + 1] = arg
      counts[arg] = (counts[arg] or 0) + 1
      last, pos = arg, pos + 1
    end
    return out
  end
  local cases = {
    { logit_bias = { [3] = 2.5, [7] = -1 } },
    { frequency_penalty = 0.8 },
    { presence_penalty = 1.5 },
    { frequency_penalty = -0.5, presence_penalty = 2, logit_bias = { [1] = 1 } },
  }
  local plain = greedy_reference({ 2, 5 }, 14)
  for i, c in ipairs(cases) do
    local want = reference({ 2, 5 }, 14, c)
    T.ok(not T.deep_eq(want, plain), "case " .. i .. " changes greedy output (else it tests nothing)")
    local eng = gen.engine(fake_decoder(4, 64))
    local o = { temperature = 0, max_new_tokens = 14 }
    for k, v in pairs(c) do o[k] = v end
    -- beside a row without options, which must stay the plain greedy output
    local rows_plain = eng:add({ 2, 5 }, options.check({ temperature = 0, max_new_tokens = 14 }, V), nil, 1)
    local rows = eng:add({ 2, 5 }, options.check(o, V), nil, 2)
    while eng:busy() do eng:step() end
    T.eq(rows[1].tokens, want, "case " .. i)
    T.eq(rows_plain[1].tokens, plain, "case " .. i .. ": the row beside it")
  end
  T.raises(function() options.check({ frequency_penalty = 2.5 }, V) end, "frequency_penalty must be a number in [-2, 2]")
  T.raises(function() options.check({ presence_penalty = "1" }, V) end, "presence_penalty must be a number in [-2, 2]")
  T.raises(function() options.check({ logit_bias = { [V] = 1 } }, V) end, "not a token id in [0, 11)")
  T.raises(function() options.check({ max_tokens = 3 }, V) end, "unknown option 'max_tokens'")
end)

-- A tokenizer where id v is the letter ('a' + v); multi-letter stop strings straddle tokens.
local fake_tok = {}
function fake_tok:stream()
  return { push = function(_, id) return string.char(97 + id) end }
end
function fake_tok:decode(ids)
  local s = {}
  for i, id in ipairs(ids) do s[i] = string.char(97 + id) end
  return table.concat(s)
end

T.case("stop strings are found across token boundaries and cut from the text", function()
  local ref = greedy_reference({ 3, 1 }, 12)
  local full = fake_tok:decode(ref)
  local stop = full:sub(5, 6)   -- two letters, made by tokens 5 and 6
  local first = full:find(stop, 1, true)
  local res = generate(fake_decoder(2, 64), { { 3, 1 } }, { temperature = 0, max_new_tokens = 12, stop = { stop }, tokenizer = fake_tok })
  T.eq(res[1].finish_reason, "stop")
  T.eq(res[1].text, full:sub(1, first - 1))
  T.eq(#res[1].tokens, first + 1)
end)

T.case("bad input is a clear error", function()
  local d = fake_decoder(2, 8)
  T.raises(function() generate(d, { { 1, 2, 3 } }, { max_new_tokens = 6 }) end, "more than the context of 8")
  T.raises(function() generate(d, { { 1, 99 } }, {}) end, "prompt 1 token 2 (99) is not an id")
  T.raises(function() generate(d, { {} }, {}) end, "prompt 1 must be a non-empty list")
  T.raises(function() generate(d, { { 1 } }, { n = 3, max_new_tokens = 2 }) end, "3 rows of 3 tokens (prompt + max_new_tokens) do not fit this engine's 2 slots")
  T.raises(function() generate(d, { { 1 } }, { stop = { "x" }, max_new_tokens = 2 }) end, "no tokenizer")
  T.raises(function() generate(d, { { 1 } }, { n = 0 }) end, "option n must be a positive integer")
  T.raises(function() generate(d, { { 1 } }, { top_p = 0, max_new_tokens = 2 }) end, "top_p must be in (0, 1]")
end)

T.case("rows that join mid-flight (continuous batching) decode as if alone", function()
  local eng = gen.engine(fake_decoder(4, 64))
  local o = options.check({ temperature = 0, max_new_tokens = 8 }, V)
  local a = eng:add({ 1, 2 }, o)
  eng:step(); eng:step(); eng:step()
  local done_b
  local b = eng:add({ 9, 8, 7 }, o, { on_done = function(r) done_b = r.finish_reason end })
  while eng:busy() do eng:step() end
  T.eq(a[1].tokens, greedy_reference({ 1, 2 }, 8))
  T.eq(b[1].tokens, greedy_reference({ 9, 8, 7 }, 8))
  T.eq(done_b, "length")
  T.eq(eng:free_slots(), 4)
end)

T.case("prompts added between two steps are prefilled in one batched call, then decode with the rest", function()
  local d = fake_decoder(8, 64)
  local eng = gen.engine(d)
  local o = options.check({ temperature = 0, max_new_tokens = 6 }, V)
  local s = options.check({ temperature = 1, max_new_tokens = 6, n = 2, seed = 3 }, V)
  local a = eng:add({ 1, 2 }, o)
  local b = eng:add({ 5 }, s)
  local c = eng:add({ 9, 8, 7 }, o)
  eng:step()
  T.eq({ d.prefill_calls, d.prefills }, { 1, 3 })   -- three prompts, one call; b's samples share one
  eng:step()
  local e = eng:add({ 4, 4 }, o)
  local f = eng:add({ 3 }, o)
  local cancelled = eng:add({ 6 }, o)
  eng:cancel(cancelled[1])
  eng:step()
  T.eq({ d.prefill_calls, d.prefills }, { 2, 5 })
  while eng:busy() do eng:step() end
  for _, x in ipairs({ { a, { 1, 2 } }, { c, { 9, 8, 7 } }, { e, { 4, 4 } }, { f, { 3 } } }) do
    T.eq(x[1][1].tokens, greedy_reference(x[2], 6))
  end
  T.eq(cancelled[1].finish_reason, "cancelled")
  -- the sampled rows equal the same request run alone
  local alone = generate(fake_decoder(8, 64), { { 5 } }, { temperature = 1, max_new_tokens = 6, n = 2, seed = 3 })
  T.eq({ b[1].tokens, b[2].tokens }, { alone[1].tokens, alone[2].tokens })
  T.eq(eng:free_slots(), 8)
end)

T.case("rows added together with the same prompt share one prefill and sample as if alone", function()
  local d = fake_decoder(8, 64)
  local eng = gen.engine(d)
  local o = options.check({ temperature = 1, max_new_tokens = 6, seed = 2 }, V)
  local greedy = options.check({ temperature = 0, max_new_tokens = 6 }, V)
  local a = eng:add({ 4, 5, 6 }, o, nil, 1, "asker a")
  local b = eng:add({ 4, 5, 6 }, o, nil, 2, "asker b")
  local c = eng:add({ 4, 5, 7 }, o, nil, 3)   -- as long, other tokens: a prefill of its own
  local g = eng:add({ 4, 5, 6 }, greedy, nil, 4)
  eng:step()
  T.eq(d.prefills, 2)
  while eng:busy() do eng:step() end
  local function alone(prompt, opts, key)
    local e = gen.engine(fake_decoder(8, 64))
    local rows = e:add(prompt, opts, nil, 1, key)
    while e:busy() do e:step() end
    return rows[1].tokens
  end
  T.eq({ a[1].tokens, b[1].tokens, c[1].tokens, g[1].tokens },
    { alone({ 4, 5, 6 }, o, "asker a"), alone({ 4, 5, 6 }, o, "asker b"), alone({ 4, 5, 7 }, o), greedy_reference({ 4, 5, 6 }, 6) })
  T.ok(not T.deep_eq(a[1].tokens, b[1].tokens), "two askers of one prompt draw from their own streams")
  T.eq(eng:free_slots(), 8)
end)

T.case("a row's random stream is chosen by the caller, not by its tag or its batch", function()
  local o = options.check({ temperature = 1, max_new_tokens = 8, n = 2, seed = 4 }, V)
  local eng = gen.engine(fake_decoder(8, 64))
  local others = eng:add({ 3, 3 }, o, nil, 1)
  eng:step()
  local joined = eng:add({ 1, 5 }, o, nil, 7, "asker 3")   -- tag 7 (for messages), key "asker 3"
  while eng:busy() do eng:step() end
  -- m:generate takes one key per prompt: the fourth prompt's rows are those of "asker 3"
  local ref = generate(fake_decoder(8, 64), { { 2 }, { 2 }, { 2 }, { 1, 5 } }, { temperature = 1, max_new_tokens = 8, n = 2, seed = 4,
    seed_key = { "asker 0", "asker 1", "asker 2", "asker 3" } })
  T.eq({ joined[1].tokens, joined[2].tokens }, { ref[7].tokens, ref[8].tokens })
  T.ok(not T.deep_eq(others[1].tokens, joined[1].tokens))
  T.ok(not T.deep_eq(ref[1].tokens, ref[3].tokens), "identical prompts of other askers differ")
  -- without keys the prompt names the stream: identical prompts sample alike, wherever they sit
  local plain = generate(fake_decoder(8, 64), { { 2 }, { 1, 5 }, { 2 } }, { temperature = 1, max_new_tokens = 8, n = 2, seed = 4 })
  T.eq({ plain[1].tokens, plain[2].tokens }, { plain[5].tokens, plain[6].tokens })
  T.raises(function() generate(fake_decoder(8, 64), { { 2 }, { 1 } }, { seed_key = { "only one" } }) end, "2 prompts")
  T.raises(function() generate(fake_decoder(8, 64), { { 2 }, { 1 } }, { seed_key = "one for both" }) end, "one per prompt")
end)

T.case("a cancelled row that was to prefill a prompt for its samples hands the prompt on", function()
  local d = fake_decoder(4, 64)
  local eng = gen.engine(d)
  local rows = eng:add({ 2, 3 }, options.check({ temperature = 1, max_new_tokens = 5, n = 3, seed = 9 }, V))
  eng:cancel(rows[1])
  while eng:busy() do eng:step() end
  local alone = generate(fake_decoder(4, 64), { { 2, 3 } }, { temperature = 1, max_new_tokens = 5, n = 3, seed = 9 })
  T.eq({ rows[2].tokens, rows[3].tokens }, { alone[2].tokens, alone[3].tokens })
  T.eq(eng:free_slots(), 4)
end)

T.run()
