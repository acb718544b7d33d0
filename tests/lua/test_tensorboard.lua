-- TensorBoard event files (clrt.util.tensorboard, written by clrt.log.run under DIR/tb/), read
-- back by an independent decoder: tests/reference/read_tfevents.py under Debian's python3,
-- which builds the Event/Summary/TensorProto classes from the public schema with
-- python3-protobuf and checks every record's CRC32C framing itself.
local T = require("clrt.test")
local json = require("clrt.json")
local log = require("clrt.log")
local tb = require("clrt.util.tensorboard")
local reward = require("clrt.train.reward")
local ffi = require("ffi")

local PY = "/usr/bin/python3"
local sh_quote = require("clrt.util.shell").quote
if os.execute(PY .. " -c 'import google.protobuf' >/dev/null 2>&1") ~= 0 then
  print("skip: " .. PY .. " lacks google.protobuf (apt-get install python3-protobuf; scripts/test.sh does)")
  os.exit(77)
end
local reader = T.source_dir() .. "/tests/reference/read_tfevents.py"

local dirs = {}
local function tmp()
  local d = T.tmpdir()
  dirs[#dirs + 1] = d
  return d
end
T.cleanup(function() for _, d in ipairs(dirs) do require("clrt.files").remove_tree(d) end end)

-- Decode files; returns the decoder's JSON, or nil and its message.
local function decode(paths)
  local q = {}
  for i, p in ipairs(paths) do q[i] = sh_quote(p) end
  local errf = os.tmpname()
  local p = io.popen(PY .. " " .. sh_quote(reader) .. " " .. table.concat(q, " ") .. " 2>" .. errf)
  local out = p:read("*a")
  local ok = p:close()
  local err = T.read(errf) or ""
  os.remove(errf)
  if out == "" or not (ok == true or ok == 0) then return nil, err end
  return json.decode(out)
end

local function event_files(dir)
  local p = io.popen("ls " .. sh_quote(dir .. "/tb") .. " 2>/dev/null")
  local list = {}
  for name in p:lines() do list[#list + 1] = dir .. "/tb/" .. name end
  p:close()
  return list
end

-- A double as the float32 TensorBoard stores.
local f32 = ffi.new("float[1]")
local function as_float(v) f32[0] = v; return tonumber(f32[0]) end

T.case("CRC32C check value and TFRecord mask", function()
  T.eq(tb.crc32c("123456789"), 0xE3069283)
  T.eq(tb.crc32c(""), 0)
  T.eq(tb.crc32c(("\0"):rep(32)), 0x8A9136AA) -- RFC 3720 B.4: 32 bytes of zeros
  T.eq(tb.crc32c(("\255"):rep(32)), 0x62A8AB43) -- RFC 3720 B.4: 32 bytes of 0xFF
  local c = 0xE3069283
  T.eq(tb.mask(c), ((math.floor(c / 2 ^ 15) + (c * 2 ^ 17) % 2 ^ 32) + 0xA282EAD8) % 2 ^ 32)
  T.eq(#tb.record("abc"), 8 + 4 + 3 + 4)
end)

T.case("a run's scalars and samples read back with the public schema", function()
  local dir = tmp() .. "/run"
  local lg = log.run{ dir = dir, quiet = true }
  local logged = {
    { 1, { reward = 0.5, ["metric/accuracy"] = 0.1, kl = 1e-4, loss = 0 / 0, mode = "verl", done = true } },
    { 2, { reward = -0.25, ["metric/accuracy"] = 1 / 3, kl = 2e-4, tokens = 123456789 } },
    { 3, { reward = 1e30, ["val/ask_rate"] = 0 } },
    { 2 ^ 40, { reward = 7 } },
  }
  for _, s in ipairs(logged) do lg:log(s[1], s[2]) end
  local items = {
    { id = "birthday/1", reward = 0.78, advantage = 1.2,
      conversation = { { role = "user", content = "Write a card.\n\nFor | Ann" }, { role = "assistant", content = "Name?" } },
      scores = { exact_match = 1, accuracy = reward.failed("judge down") } },
    { id = "math/7", reward = 0, conversation = { { role = "user", content = "2+2?" } }, scores = {} },
  }
  lg:samples(3, items)
  lg:close()
  local files = event_files(dir)
  T.eq(#files, 1)
  T.ok(files[1]:match("/tb/events%.out%.tfevents%.%d+%.[^/]+$"), files[1])
  local got = assert(decode(files))
  local f = got.files[1]
  T.eq(f.file_version, "brain.Event:2"); T.ok(f.first_is_version)
  T.eq(f.records, 1 + #logged + #items)
  local now = os.time()
  for _, w in ipairs(f.wall_times) do T.ok(w > now - 3600 and w <= now + 1, "wall_time is epoch seconds: " .. w) end
  -- every numeric field and `time`, nothing else, at its step, as float32
  local rows = log.read_metrics(dir)
  local want = {}
  for i, s in ipairs(logged) do
    local keys = { "time" }
    for k, v in pairs(s[2]) do if type(v) == "number" then keys[#keys + 1] = k end end
    table.sort(keys)
    for _, k in ipairs(keys) do
      local v = k == "time" and rows[i].time or s[2][k]
      want[#want + 1] = { s[1], k, v ~= v and "nan" or as_float(v) }
    end
  end
  T.eq(f.scalars, want)
  -- the samples: one text summary each, text plugin, rank-0 DT_STRING tensor
  T.eq(#f.texts, 2)
  local sample_rows = {}
  for line in io.lines(dir .. "/samples.jsonl") do sample_rows[#sample_rows + 1] = json.decode(line) end
  for i, t in ipairs(f.texts) do
    T.eq(t.step, 3); T.eq(t.tag, "samples/" .. i); T.eq(t.plugin, "text"); T.eq(t.dtype, 7)
    T.eq(t.dims, {}); T.ok(t.has_shape)
    T.eq(t.text, log.sample_markdown(3, items[i], sample_rows[i], i))
  end
  local md = f.texts[1].text
  T.ok(md:find("**step 3 · birthday/1** · reward 0.78 · advantage 1.2", 1, true), md)
  T.ok(md:find("| exact_match | 1 |", 1, true), md)
  T.ok(md:find("| accuracy | failed(judge down) |", 1, true), md)
  T.ok(md:find("**user**\n\n> Write a card.\n>\n> For | Ann\n", 1, true), md)
  T.ok(md:find("**assistant**\n\n> Name?", 1, true), md)
end)

T.case("records are on disk before close; a corrupted byte is caught", function()
  local dir = tmp() .. "/run"
  local lg = log.run{ dir = dir, quiet = true }
  lg:log(1, { reward = 0.5 })
  local path = event_files(dir)[1]
  local got = assert(decode({ path }))  -- no close: flushed per record
  T.eq(got.files[1].scalars[1], { 1, "reward", 0.5 })
  lg:close()
  local bytes = T.read(path)
  local bad = path .. ".bad"
  local fh = io.open(bad, "wb")
  fh:write(bytes:sub(1, -6), string.char((bytes:byte(-5) + 1) % 256), bytes:sub(-4))
  fh:close()
  local none, err = decode({ bad })
  T.ok(none == nil and err:find("data CRC mismatch", 1, true), err)
  fh = io.open(bad, "wb"); fh:write(bytes:sub(1, -3)); fh:close()
  none, err = decode({ bad })
  T.ok(none == nil and err:find("truncated", 1, true), err)
end)

T.case("resume opens a second events file that restarts at the checkpoint", function()
  local dir = tmp() .. "/run"
  local lg = log.run{ dir = dir, quiet = true }
  for s = 1, 4 do lg:log(s, { reward = s }) end
  lg:close()
  local first = event_files(dir)[1]
  local before = T.read(first)
  local lg2 = log.run{ dir = dir, quiet = true, resume_step = 2 }
  lg2:log(3, { reward = 30 })
  lg2:close()
  local files = event_files(dir)
  T.eq(#files, 2)
  T.eq(T.read(first), before, "the first file is left as it was")
  local second = files[1] == first and files[2] or files[1]
  local got = assert(decode({ first, second }))
  T.eq(#got.files[1].scalars, 8)
  local g2 = got.files[2]
  T.eq(g2.file_version, "brain.Event:2"); T.ok(g2.first_is_version)
  T.eq(g2.session_starts, { 3 })
  T.eq(g2.scalars[1], { 3, "reward", 30 })
end)

T.case("tensorboard = false writes no event files", function()
  local dir = tmp() .. "/run"
  local lg = log.run{ dir = dir, quiet = true, tensorboard = false }
  lg:log(1, { reward = 1 })
  lg:samples(1, { { id = "a", conversation = {} } })
  lg:close()
  T.eq(#event_files(dir), 0)
end)

T.case("a failed write raises naming the file; bad steps are refused", function()
  local w = tb.open(tmp() .. "/events.out.tfevents.1.test")
  -- hot first: LuaJIT once compiled io's write/flush checks into code that missed the error
  for s = 1, 200 do w:scalars(s, { a = s }); w:text(s, "t", "x") end
  T.raises(function() tb.open("/dev/full") end, "cannot write /dev/full: No space left on device")
  T.raises(function() w:scalars(1.5, { a = 1 }) end, "step must be a whole number")
  T.raises(function() w:text(0 / 0, "t", "x") end, "step must be a whole number")
  w:close()
  T.raises(function() w:scalars(1, { a = 1 }) end, "is closed")
  T.raises(function() tb.open(tmp() .. "/no/such/dir/f") end, "cannot create")
end)

T.run()
