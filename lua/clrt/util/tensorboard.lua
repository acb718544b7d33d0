-- clrt.util.tensorboard — TensorBoard event files, written without TensorFlow.
--   local tb = require("clrt.util.tensorboard")
--   local w = tb.create(dir, {clock = fn})        -- dir/events.out.tfevents.<unix time>.<host>
--   w:scalars(step, {["metric/accuracy"] = 0.9, loss = 1.2})  -- one Event, numbers only
--   w:text(step, "samples/1", "**markdown**")     -- a text-plugin summary
--   w:session_start(step)                         -- after a resume: readers drop points >= step
--   w:close()
-- A file is a TFRecord stream of serialized Event protos (tensorflow/core/util/event.proto,
-- summary.proto, tensor.proto): each record is uint64 LE length, uint32 masked CRC32C of
-- those 8 bytes, the data, uint32 masked CRC32C of the data. Every record is flushed as it
-- is written (one write(2) each), so a crash loses at most the record being written.
local ffi = require("ffi")
local bit = require("bit")
local band, bor, bxor, rshift, lshift = bit.band, bit.bor, bit.bxor, bit.rshift, bit.lshift

local M = {}

---------------------------------------------------------------- CRC32C (Castagnoli)
local crc_table = {}
for i = 0, 255 do
  local c = i
  for _ = 1, 8 do
    if band(c, 1) ~= 0 then c = bxor(rshift(c, 1), 0x82F63B78) else c = rshift(c, 1) end
  end
  crc_table[i] = c
end

local function u32(x) return x % 4294967296 end -- bit ops yield signed 32-bit numbers

-- CRC32C of string s (an unsigned number), the checksum TFRecord uses.
function M.crc32c(s)
  local c = -1 -- 0xFFFFFFFF
  for i = 1, #s do
    c = bxor(rshift(c, 8), crc_table[band(bxor(c, s:byte(i)), 255)])
  end
  return u32(bit.bnot(c))
end

-- TFRecord stores CRCs rotated and offset, so a CRC over data that holds CRCs stays useful.
function M.mask(crc)
  return u32(bor(rshift(crc, 15), lshift(crc, 17)) + 0xA282EAD8)
end

---------------------------------------------------------------- protobuf wire format
local function le32(x)
  return string.char(band(x, 255), band(rshift(x, 8), 255), band(rshift(x, 16), 255), band(rshift(x, 24), 255))
end

local LITTLE = ffi.abi("le")
local dbuf, fbuf = ffi.new("double[1]"), ffi.new("float[1]")
local function bytes_of(buf, n)
  local s = ffi.string(buf, n)
  return LITTLE and s or s:reverse()
end

-- Varint of a whole number; negatives as their 64-bit two's complement (10 bytes), as int64.
local function varint(n)
  local out = {}
  if n < 0 then
    local u = ffi.cast("uint64_t", ffi.cast("int64_t", n))
    repeat
      local b = tonumber(u % 128)
      u = u / 128
      out[#out + 1] = string.char(u ~= 0 and b + 128 or b)
    until u == 0
  else
    repeat
      local b = n % 128
      n = (n - b) / 128
      out[#out + 1] = string.char(n ~= 0 and b + 128 or b)
    until n == 0
  end
  return table.concat(out)
end
M.varint = varint

local function key(field, wire) return varint(field * 8 + wire) end
local function f_varint(field, n) return key(field, 0) .. varint(n) end
local function f_bytes(field, s) return key(field, 2) .. varint(#s) .. s end
local function f_double(field, v) dbuf[0] = v; return key(field, 1) .. bytes_of(dbuf, 8) end
local function f_float(field, v) fbuf[0] = v; return key(field, 5) .. bytes_of(fbuf, 4) end

-- Field numbers from the public .proto files (tensorboard/compat/proto, same as TensorFlow's).
local EVENT = { wall_time = 1, step = 2, file_version = 3, summary = 5, session_log = 7 }
local SUMMARY = { value = 1 }
local VALUE = { tag = 1, simple_value = 2, tensor = 8, metadata = 9 }
local METADATA = { plugin_data = 1 }
local PLUGIN_DATA = { plugin_name = 1 }
local TENSOR = { dtype = 1, tensor_shape = 2, string_val = 8 }
local SESSION_LOG = { status = 1 }
local DT_STRING, SESSION_START = 7, 1
M.FILE_VERSION = "brain.Event:2"

local function check_step(step)
  if type(step) ~= "number" or step ~= math.floor(step) or step ~= step or math.abs(step) >= 2 ^ 53 then
    error("tensorboard: step must be a whole number, got " .. tostring(step), 3)
  end
end

-- One serialized Event: e = {wall_time =, step =, file_version =, summary = bytes, session_log = bytes}.
function M.event(e)
  local parts = { f_double(EVENT.wall_time, e.wall_time) }
  if e.step and e.step ~= 0 then parts[#parts + 1] = f_varint(EVENT.step, e.step) end
  if e.file_version then parts[#parts + 1] = f_bytes(EVENT.file_version, e.file_version) end
  if e.summary then parts[#parts + 1] = f_bytes(EVENT.summary, e.summary) end
  if e.session_log then parts[#parts + 1] = f_bytes(EVENT.session_log, e.session_log) end
  return table.concat(parts)
end

-- Summary with one simple_value per (tag, value) pair, in the order given.
function M.scalar_summary(pairs_)
  local parts = {}
  for i, p in ipairs(pairs_) do
    parts[i] = f_bytes(SUMMARY.value, f_bytes(VALUE.tag, p[1]) .. f_float(VALUE.simple_value, p[2]))
  end
  return table.concat(parts)
end

-- Summary with one text-plugin value: a rank-0 DT_STRING tensor holding markdown.
function M.text_summary(tag, markdown)
  local tensor = f_varint(TENSOR.dtype, DT_STRING) .. f_bytes(TENSOR.tensor_shape, "")
    .. f_bytes(TENSOR.string_val, markdown)
  local metadata = f_bytes(METADATA.plugin_data, f_bytes(PLUGIN_DATA.plugin_name, "text"))
  local value = f_bytes(VALUE.tag, tag) .. f_bytes(VALUE.tensor, tensor) .. f_bytes(VALUE.metadata, metadata)
  return f_bytes(SUMMARY.value, value)
end

-- One TFRecord: framing around data.
function M.record(data)
  local n = #data
  local len = le32(n % 4294967296) .. le32(math.floor(n / 4294967296))
  return len .. le32(M.mask(M.crc32c(len))) .. data .. le32(M.mask(M.crc32c(data)))
end

---------------------------------------------------------------- the writer
local W = {}
W.__index = W

local function hostname()
  local f = io.open("/proc/sys/kernel/hostname", "rb")
  local h = f and f:read("*l")
  if f then f:close() end
  h = h or os.getenv("HOSTNAME") or "localhost"
  h = h:gsub("[^%w%.%-_]", "_")
  return h ~= "" and h or "localhost"
end

-- Raw file descriptors, one write(2) per record: nothing sits in a stdio buffer, and the
-- result of every write is a plain number. (LuaJIT 2.1.0-beta3 here: once io's
-- `f:write(...)`/`f:flush()` pair ran hot, the compiled code reported a failed flush on
-- /dev/full as success.)
for _, decl in ipairs({ "int open(const char *path, int flags, ...);",
                        "long write(int fd, const void *buf, size_t n);",
                        "int close(int fd);", "char *strerror(int errnum);" }) do
  pcall(ffi.cdef, decl)
end
local C = ffi.C
local O_WRONLY, O_CREAT, O_EXCL, O_TRUNC, O_CLOEXEC = 0x1, 0x40, 0x80, 0x200, 0x80000 -- Linux
local EINTR, EEXIST = 4, 17

local function errstr(e) return ffi.string(C.strerror(e)) end

local function close_fd(h)
  if h[0] >= 0 then C.close(h[0]); h[0] = -1 end
end

-- Open `path` for writing: a new file only (exclusive), or created/truncated; nil, errno
-- when it cannot be.
local function create_file(path, exclusive)
  local flags = bor(O_WRONLY, O_CREAT, O_CLOEXEC, exclusive and O_EXCL or O_TRUNC)
  local fd = C.open(path, flags, ffi.cast("int", 420)) -- 0644
  if fd < 0 then return nil, ffi.errno() end
  return ffi.gc(ffi.new("int[1]", fd), close_fd)
end

local function new_writer(path, handle, opts)
  local w = setmetatable({ path = path, handle = handle, clock = opts.clock or os.time }, W)
  w:write_event({ wall_time = w.clock(), file_version = M.FILE_VERSION })
  return w
end

-- Write events to `path` (replacing a file there), starting with the file_version record. opts.clock: wall-clock
-- seconds (default os.time).
function M.open(path, opts)
  local h, e = create_file(path)
  if not h then error(("tensorboard: cannot create %s: %s"):format(path, errstr(e)), 2) end
  return new_writer(path, h, opts or {})
end

-- A new events file in dir (created if missing), named as TensorBoard looks for; never
-- an existing one, so a resumed run adds a file beside the first (TensorBoard reads them all).
function M.create(dir, opts)
  local ok, err = pcall(require("clrt.files").mkdir_p, dir)
  if not ok then error("tensorboard: cannot create folder " .. dir .. ": " .. tostring(err), 2) end
  local base = ("%s/events.out.tfevents.%d.%s"):format(dir, os.time(), hostname())
  local path, i = base, 2
  while true do
    local h, e = create_file(path, true)
    if h then return new_writer(path, h, opts or {}) end
    if e ~= EEXIST then error(("tensorboard: cannot create %s: %s"):format(path, errstr(e)), 2) end
    path = base .. "." .. i
    i = i + 1
  end
end

function W:write_event(e)
  local fd = self.handle[0]
  if fd < 0 then error("tensorboard: " .. self.path .. " is closed", 3) end
  local rec = M.record(M.event(e))
  local buf, n, off = ffi.cast("const char *", rec), #rec, 0
  while off < n do
    local got = tonumber(C.write(fd, buf + off, n - off))
    if got > 0 then
      off = off + got
    else
      local errno = ffi.errno()
      if got < 0 and errno == EINTR then
        -- interrupted before writing anything: try again
      else
        -- leave no half record behind a later one: the file is closed
        close_fd(self.handle)
        error(("tensorboard: cannot write %s: %s"):format(self.path, got < 0 and errstr(errno) or "nothing written"), 3)
      end
    end
  end
end

-- One Event at `step` with a scalar for every numeric field of row (tags sorted by name).
function W:scalars(step, row)
  check_step(step)
  local list = {}
  for k, v in pairs(row) do
    if type(v) == "number" then list[#list + 1] = { tostring(k), v } end
  end
  if #list == 0 then return end
  table.sort(list, function(a, b) return a[1] < b[1] end)
  self:write_event({ wall_time = self.clock(), step = step, summary = M.scalar_summary(list) })
end

function W:text(step, tag, markdown)
  check_step(step)
  self:write_event({ wall_time = self.clock(), step = step, summary = M.text_summary(tag, markdown) })
end

-- SessionLog START: TensorBoard drops the points it has read with step >= `step`, so the
-- steps a resumed run redoes replace those the first run logged after its checkpoint.
function W:session_start(step)
  check_step(step)
  self:write_event({ wall_time = self.clock(), step = step,
    session_log = f_varint(SESSION_LOG.status, SESSION_START) })
end

function W:close() close_fd(self.handle) end

return M
