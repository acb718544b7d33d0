-- clrt.gen.decoder — the Lua side of a KV-cache decoder (runtime/model/decode.c): m:decoder
-- makes one; clrt.gen.scheduler owns the one each model decodes with and frees it with
-- d:free() when it grows or drops it (never the garbage collector's timing: a cache is
-- gigabytes the collector does not see). A freed decoder raises an error naming itself.
--   M.new(m, slots, max_len) -> d;  d:free();  M.stats() -> {live =, bytes =, made =, freed =}
local ffi = require("ffi")
local core = require("clrt.core.ffi")
local C = core.C

local M = {}

-- Decoders the C side holds now (made and not freed, whether by d:free() or collection).
local counts = { live = 0, bytes = 0, made = 0, freed = 0 }
function M.stats() return { live = counts.live, bytes = counts.bytes, made = counts.made, freed = counts.freed } end

local Decoder = {}
M.Decoder = Decoder
-- d.model is the model's table while the model lives: held weakly, so that a scheduler's
-- table keyed by the model can let both go (LuaJIT's weak keys are not ephemerons).
Decoder.__index = function(d, k)
  if k == "model" then return rawget(d, "_model")[1] end
  return Decoder[k]
end

local function live(d)
  local p = d.ptr
  if p == nil then
    error(("decoder (%d slots x %d tokens): used after free(); the scheduler released this KV cache "
      .. "(ask m:decoder for a new one)"):format(d.slots, d.max_len), 3)
  end
  return p
end

-- logits is [slots, V]: a row lands at slot * V. A Lua-owned array too short for the highest
-- slot written is refused here (the C side would write past it into the Lua heap, which
-- crashes the garbage collector later, far from the cause); a bare pointer is trusted.
local function check_logits(self, logits, n, slots, op)
  if type(logits) ~= "cdata" or ffi.istype("float *", logits) then return end
  local top = 0   -- over slots in range (the C side names one out of range)
  for i = 0, n - 1 do
    local s = tonumber(type(slots) == "number" and slots or slots[i])
    if s < self.slots then top = math.max(top, s) end
  end
  local need = (top + 1) * self.vocab_size * ffi.sizeof("float")
  if ffi.sizeof(logits) < need then
    error(("decoder: %s: logits holds %d bytes, and slot %d's row ends at byte %d (logits is [slots, vocab_size] floats)")
      :format(op, ffi.sizeof(logits), top, need), 3)
  end
end

function Decoder:prefill(slot, tokens, T, logits)
  local p = live(self)
  check_logits(self, logits, 1, slot, "prefill")
  core.ok(C.clrt_decoder_reset(p, slot), 2)
  core.ok(C.clrt_decoder_append(p, slot, tokens, T, logits), 2)
end
-- n prompts into n slots in one batched forward per chunk (tokens back to back, lengths[n]).
function Decoder:prefill_many(n, slots, tokens, lengths, logits)
  check_logits(self, logits, n, slots, "prefill_many")
  core.ok(C.clrt_decoder_prefill_many(live(self), n, slots, tokens, lengths, logits), 2)
end
-- n prompts, each after what its slot holds (a prefix loaded from the prefix cache).
function Decoder:extend_many(n, slots, tokens, lengths, logits)
  check_logits(self, logits, n, slots, "extend_many")
  core.ok(C.clrt_decoder_extend_many(live(self), n, slots, tokens, lengths, logits), 2)
end
function Decoder:reset(slot) core.ok(C.clrt_decoder_reset(live(self), slot), 2) end
function Decoder:exact_length(slot) return C.clrt_decoder_exact_length(live(self), slot) end
function Decoder:load_blocks(slot, count, ids, blocks) core.ok(C.clrt_decoder_load_blocks(live(self), slot, count, ids, blocks), 2) end
function Decoder:save_blocks(slot, first, count, ids, blocks)
  core.ok(C.clrt_decoder_save_blocks(live(self), slot, first, count, ids, blocks), 2)
end
function Decoder:copy_slot(src, dst) core.ok(C.clrt_decoder_copy_slot(live(self), src, dst), 2) end
function Decoder:decode(n, slots, tokens, logits)
  check_logits(self, logits, n, slots, "decode")
  core.ok(C.clrt_decoder_decode(live(self), n, slots, tokens, logits), 2)
end
function Decoder:length(slot) return C.clrt_decoder_length(live(self), slot) end
function Decoder:bytes() return tonumber(C.clrt_decoder_bytes(live(self))) end
function Decoder:freed() return self.ptr == nil end

local function release(p, bytes)
  C.clrt_decoder_free(p)
  counts.live, counts.bytes, counts.freed = counts.live - 1, counts.bytes - bytes, counts.freed + 1
end

-- Give the cache back now; a second call does nothing.
function Decoder:free()
  local p = self.ptr
  if p == nil then return end
  self.ptr = nil
  release(ffi.gc(p, nil), self.cache_bytes)
end

function M.new(m, slots, max_len)
  local limit = m.config.max_position_embeddings
  if limit and max_len > limit then
    error(("decoder: max_len %d is beyond the model's max_position_embeddings %d"):format(max_len, limit), 3)
  end
  local p = C.clrt_decoder_new(m.ptr, slots, max_len)
  if p == nil then core.fail(3) end
  local bytes = tonumber(C.clrt_decoder_bytes(p))
  counts.live, counts.bytes, counts.made = counts.live + 1, counts.bytes + bytes, counts.made + 1
  return setmetatable({
    ptr = ffi.gc(p, function(q) release(q, bytes) end), cache_bytes = bytes,
    -- the C model stays alive while its decoder does (its cdata, not its table: see __index)
    model_ptr = m.ptr, _model = setmetatable({ m }, { __mode = "v" }),
    slots = slots, max_len = max_len, vocab_size = m.config.vocab_size,
  }, Decoder)
end

return M
