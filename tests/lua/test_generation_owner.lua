-- One owner of generation (clrt.gen.scheduler): m:generate, clrt.sched.generate in tasks and
-- `clrt serve`'s handler decode with the same engine and decoder of a model, their rows counted
-- in the same slots; growing the cache frees the old decoder (Decoder:free) before the new one
-- is made, with the garbage collector stopped; a freed decoder says so; dropping the engine
-- leaves no decoder and no prefix-cache storage behind.
local T = require("clrt.test")
package.path = T.source_dir() .. "/tests/?.lua;" .. package.path
local cjson = require("cjson")
local G = require("clrt.gen.scheduler")
local decoder = require("clrt.gen.decoder")
local PC = require("clrt.gen.prefix_cache")
local sched = require("clrt.sched")

if os.execute("command -v curl > /dev/null 2>&1") ~= 0 then
  io.write("skip: curl is not installed\n")
  os.exit(77)
end

local dir = require("support.tiny_model")(T.tmpdir(), { seed = 2 })
local m = clrt.model.load(dir)
local tok = clrt.tokenizer.load(dir)
local greedy = { temperature = 0, max_new_tokens = 6 }

-- The decoders the C side holds beyond `base` (a stats() table).
local function live_since(base)
  local s = decoder.stats()
  return s.live - base.live, s.bytes - base.bytes
end

-- A chat request by curl in the background; wait(srv) ticks the server until curl is done.
local seq = 0
local function post(srv, body)
  seq = seq + 1
  local base = ("%s/r%d"):format(dir, seq)
  local f = assert(io.open(base .. ".json", "w"))
  f:write(cjson.encode(body))
  f:close()
  os.execute(("(curl -s -m 30 -o %s.out --data-binary @%s.json -H 'Content-Type: application/json' "
    .. "http://127.0.0.1:%d/v1/chat/completions; touch %s.done) &"):format(base, base, srv:port(), base))
  return function(on_tick)
    local t0 = os.time()
    while not T.read(base .. ".done") do
      srv:tick(5)
      if on_tick then on_tick() end
      if os.time() - t0 > 40 then error("request " .. base .. " did not finish") end
    end
    return cjson.decode(T.read(base .. ".out"))
  end
end

T.case("m:generate, clrt.sched tasks and the server share one engine: one decoder, slots counted together", function()
  G.drop(m)
  local base = decoder.stats()
  local E = G.reserve(m, 8, 128)
  local dec = E.dec
  T.eq(decoder.stats().made - base.made, 1)
  -- outside a task: the same decoder
  local alone = m:generate({ { 5, 6, 7 } }, greedy)
  T.eq(G.peek(m).dec, dec, "m:generate decodes with the model's one decoder")
  -- in tasks: m:generate's 2 rows and clrt.sched.generate's 2 rows hold 4 of the 8 slots at once
  local free_seen = {}
  local results, errors = sched.run({
    function() return m:generate({ { 5, 6, 7 }, { 8, 9 } }, greedy) end,
    function() return sched.generate(m, { 10, 11 }, { n = 2, temperature = 0, max_new_tokens = 6 }) end,
    function()
      for _ = 1, 4 do
        sched.sleep(0)
        local e = G.peek(m)
        free_seen[#free_seen + 1] = e.eng:free_slots()
        T.eq(e.dec, dec, "the tasks' requests decode with the same decoder")
      end
    end,
  })
  T.eq(errors, {})
  T.ok(#free_seen > 0 and math.min(unpack(free_seen)) == 4,
    "both callers' rows should run in the one engine together (free slots seen: " .. table.concat(free_seen, ", ") .. ")")
  T.eq(results[1][1].tokens, alone[1].tokens, "m:generate in a task gives what it gives alone")
  -- the server: its handler submits to the same engine; m:generate still decodes with it after
  local srv = require("clrt.net.openai_server").new({ model = m, tokenizer = tok, port = 0, slots = 8, max_len = 128 })
  T.eq(srv.dec, dec, "the server decodes with the model's one decoder")
  local busy_free = {}
  local reply = post(srv, { messages = { { role = "user", content = "hi" } }, temperature = 0, max_tokens = 5, n = 3 })(function()
    if srv.engine:busy() then busy_free[#busy_free + 1] = G.peek(m).eng:free_slots() end
  end)
  srv:stop()
  T.eq(#reply.choices, 3)
  T.ok(#busy_free > 0 and busy_free[1] == 5, "the request's 3 rows hold slots of the shared engine")
  T.eq(G.peek(m).dec, dec)
  m:generate({ { 1, 2 } }, greedy)
  T.eq(G.peek(m).dec, dec)
  T.eq(decoder.stats().made - base.made, 1, "one decoder made for every caller")
  G.drop(m)
  T.eq({ live_since(base) }, { 0, 0 }, "dropping the engine frees its decoder")
end)

T.case("growing the cache frees the old decoder before it makes the new one (collector stopped)", function()
  G.drop(m)
  collectgarbage("stop")
  local ok, err = pcall(function()
    local base = decoder.stats()
    local make = decoder.new
    local live_at_make = {}
    decoder.new = function(...)
      live_at_make[#live_at_make + 1] = decoder.stats().live - base.live
      return make(...)
    end
    local finally = function() decoder.new = make end
    local ok2, err2 = pcall(function()
      m:generate({ { 3, 4 } }, { temperature = 0, max_new_tokens = 4 })
      local first = G.peek(m).dec
      -- more rows and a longer prompt than it holds: the engine grows, twice
      m:generate({ { 3, 4 }, { 5 }, { 6 } }, { temperature = 0, max_new_tokens = 4 })
      local second = G.peek(m).dec
      local long = {}
      for i = 1, 100 do long[i] = i % 50 + 1 end
      m:generate({ long }, { temperature = 0, max_new_tokens = 4 })
      T.ok(first ~= second and second ~= G.peek(m).dec, "the decoder should have grown twice")
      T.eq(live_at_make, { 0, 0, 0 }, "no decoder is alive when the next one is made")
      T.eq(decoder.stats().freed - base.freed, 2, "each growth freed the old decoder")
      T.ok(first:freed() and second:freed() and not G.peek(m).dec:freed())
      local live, bytes = live_since(base)
      T.eq(live, 1)
      T.eq(bytes, G.peek(m).dec:bytes(), "only the current cache's bytes are held")
      local used, msg = pcall(first.length, first, 0)
      T.ok(not used and msg:find("used after free()", 1, true), "a freed decoder says so: " .. tostring(msg))
    end)
    finally()
    if not ok2 then error(err2, 0) end
  end)
  collectgarbage("restart")
  if not ok then error(err, 0) end
end)

T.case("Decoder:free is idempotent, and a freed decoder raises a clear error on every use", function()
  local base = decoder.stats()
  local d = m:decoder(2, 32)
  T.eq({ live_since(base) }, { 1, d:bytes() })
  d:free()
  d:free()
  T.eq({ live_since(base) }, { 0, 0 })
  T.eq(decoder.stats().freed - base.freed, 1, "the second free does nothing")
  local ffi = require("ffi")
  local one = ffi.new("int32_t[1]")
  local logits = ffi.new("float[?]", 2 * m.config.vocab_size)
  for name, call in pairs({
    decode = function() d:decode(1, one, one, logits) end,
    prefill = function() d:prefill(0, one, 1, logits) end,
    reset = function() d:reset(0) end,
    bytes = function() return d:bytes() end,
  }) do
    local ok, msg = pcall(call)
    T.ok(not ok and tostring(msg):find("decoder (2 slots x 32 tokens): used after free()", 1, true),
      name .. " on a freed decoder: " .. tostring(msg))
  end
  -- the engine over a freed decoder fails its request with that error rather than crashing
  G.attach(d, d)
  local ok, msg = pcall(G.generate, d, { { 1, 2 } }, { max_new_tokens = 2 })
  T.ok(not ok and tostring(msg):find("used after free()", 1, true), tostring(msg))
end)

T.case("dropping the engine (m:free included) leaves no decoder and no prefix-cache storage", function()
  G.drop(m)
  local base = decoder.stats()
  local prompt = {}
  for i = 1, 40 do prompt[i] = i end
  m:generate({ prompt }, greedy)
  local pc = PC.of(m)
  T.ok(pc and pc.blocks ~= nil and pc.nodes > 0, "the prompt's blocks went into the prefix cache")
  T.eq(select(1, live_since(base)), 1)
  G.drop(m)
  T.eq({ live_since(base) }, { 0, 0 }, "no decoder left")
  T.ok(pc.blocks == nil and pc.nodes == 0, "the prefix cache's storage was freed with the engine")
  T.ok(PC.of(m) ~= pc, "the next lookup starts a fresh cache")
  -- m:free() drops its engine first
  local m2 = clrt.model.load(dir)
  m2:generate({ prompt }, greedy)
  T.eq(select(1, live_since(base)), 1)
  m2:free()
  T.eq({ live_since(base) }, { 0, 0 }, "m:free() freed its decoder")
  T.eq(G.peek(m2), nil)
end)

T.run()
