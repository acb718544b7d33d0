-- clrt.gen.model_methods — KV-cache decoding for clrt.model: m:decoder(slots, max_len) and
-- m:generate(prompts, opts). Installed into the Model class by lua/clrt/model.lua.
local ffi = require("ffi")
local core = require("clrt.core.ffi")
local gen = require("clrt.gen.engine")
local C = core.C

local M = {}

local Decoder = {}
Decoder.__index = Decoder

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
  check_logits(self, logits, 1, slot, "prefill")
  core.ok(C.clrt_decoder_reset(self.ptr, slot), 2)
  core.ok(C.clrt_decoder_append(self.ptr, slot, tokens, T, logits), 2)
end
-- n prompts into n slots in one batched forward per chunk (tokens back to back, lengths[n]).
function Decoder:prefill_many(n, slots, tokens, lengths, logits)
  check_logits(self, logits, n, slots, "prefill_many")
  core.ok(C.clrt_decoder_prefill_many(self.ptr, n, slots, tokens, lengths, logits), 2)
end
-- n prompts, each after what its slot holds (a prefix loaded from the prefix cache).
function Decoder:extend_many(n, slots, tokens, lengths, logits)
  check_logits(self, logits, n, slots, "extend_many")
  core.ok(C.clrt_decoder_extend_many(self.ptr, n, slots, tokens, lengths, logits), 2)
end
function Decoder:reset(slot) core.ok(C.clrt_decoder_reset(self.ptr, slot), 2) end
function Decoder:exact_length(slot) return C.clrt_decoder_exact_length(self.ptr, slot) end
function Decoder:load_blocks(slot, count, ids, blocks) core.ok(C.clrt_decoder_load_blocks(self.ptr, slot, count, ids, blocks), 2) end
function Decoder:save_blocks(slot, first, count, ids, blocks)
  core.ok(C.clrt_decoder_save_blocks(self.ptr, slot, first, count, ids, blocks), 2)
end
function Decoder:copy_slot(src, dst) core.ok(C.clrt_decoder_copy_slot(self.ptr, src, dst), 2) end
function Decoder:decode(n, slots, tokens, logits)
  check_logits(self, logits, n, slots, "decode")
  core.ok(C.clrt_decoder_decode(self.ptr, n, slots, tokens, logits), 2)
end
function Decoder:length(slot) return C.clrt_decoder_length(self.ptr, slot) end
function Decoder:bytes() return tonumber(C.clrt_decoder_bytes(self.ptr)) end

local function new_decoder(m, slots, max_len)
  local limit = m.config.max_position_embeddings
  if limit and max_len > limit then
    error(("decoder: max_len %d is beyond the model's max_position_embeddings %d"):format(max_len, limit), 3)
  end
  local p = C.clrt_decoder_new(m.ptr, slots, max_len)
  if p == nil then core.fail(3) end
  return setmetatable({
    ptr = ffi.gc(p, C.clrt_decoder_free), model = m, slots = slots, max_len = max_len,
    vocab_size = m.config.vocab_size,
  }, Decoder)
end

local function is_tokenizer(x) return type(x) == "table" and type(x.encode) == "function" and type(x.decode) == "function" end

-- What m:generate was given, checked before any cache is sized from it: the usual slips
-- (a tokenizer, a text, one token list) get an error that says what to write instead.
local function check_prompts(prompts, opts)
  local usage = "m:generate(prompts, opts): prompts must be a list of token lists ({{id, id, ...}, ...})"
  if is_tokenizer(prompts) then
    error(usage .. ", and the first argument is a tokenizer: for a chat reply to a text use m:chat(tok, text) "
      .. "or clrt.chat.generate(m, tok, messages, opts); to continue a text, m:generate({tok:encode(text)}, opts)", 3)
  end
  if type(prompts) == "string" then
    error(usage .. ", not a string: m:generate({tok:encode(text)}, opts), or m:chat(tok, text) for a chat reply", 3)
  end
  if type(prompts) ~= "table" then error(("%s, got a %s"):format(usage, type(prompts)), 3) end
  if #prompts == 0 then error(usage .. ", and this list is empty", 3) end
  if type(prompts[1]) == "number" then
    error(usage .. ", and this is one token list: wrap it, m:generate({ids}, opts)", 3)
  end
  for i, p in ipairs(prompts) do
    if type(p) ~= "table" then error(("%s; prompts[%d] is a %s"):format(usage, i, type(p)), 3) end
  end
  if opts ~= nil and type(opts) ~= "table" then
    error(("m:generate(prompts, opts): opts must be a table {max_new_tokens =, temperature =, ...}, got a %s"):format(type(opts)), 3)
  end
end

local function check_count(name, v, what)
  if type(v) ~= "number" or v < 1 or v ~= math.floor(v) then
    error(("m:decoder(slots, max_len): %s must be a positive integer (%s), got %s"):format(name, what, tostring(v)), 3)
  end
end

function M.install(Model)
  -- A KV cache for `slots` sequences of up to max_len tokens (the parameters are shared
  -- with the model: train, then decode with the updated weights, no copy).
  function Model:decoder(slots, max_len)
    slots = slots or 1
    max_len = max_len or math.min(self.config.max_position_embeddings or 2048, 2048)
    check_count("slots", slots, "sequences decoded at once")
    check_count("max_len", max_len, "tokens per sequence, prompt included")
    return new_decoder(self, slots, max_len)
  end

  -- generate(prompts, {n, max_new_tokens, temperature, top_p, top_k, stop, seed, seed_key, tokenizer,
  -- logit_bias, frequency_penalty, presence_penalty, on_step}) -> one entry per (prompt,
  -- sample), prompt-major:
  -- {tokens = {...}, logprobs = {...}, finish_reason = "stop" | "length", text = ...}.
  -- A prompt's samples draw from the stream of (seed, its prompt's tokens), or of (seed, key)
  -- with seed_key = {key per prompt} (clrt.gen.engine.row_seed); with a tokenizer, ids it
  -- cannot decode are never sampled. The decoder is kept on the model and grows to the
  -- largest request seen.
  function Model:generate(prompts, opts)
    check_prompts(prompts, opts)
    opts = opts or {}
    local checked, err = pcall(gen.options, opts, self.config.vocab_size)
    if not checked then error(err, 2) end
    local rows = #prompts * (opts.n or 1)
    local longest = 0
    for _, p in ipairs(prompts) do if type(p) == "table" and #p > longest then longest = #p end end
    local need = longest + (opts.max_new_tokens or 64)
    local d = self._decoder
    if not d or d.slots < rows or d.max_len < need then
      self._decoder = nil
      collectgarbage()   -- let the old cache go before the new one is allocated
      local slots = math.max(rows, d and d.slots or 0)
      local len = math.max(need, d and d.max_len or 0)
      local limit = self.config.max_position_embeddings
      if limit and len > limit then
        error(("generate: a prompt of %d tokens + max_new_tokens %d exceeds the model's context of %d"):format(longest, opts.max_new_tokens or 64, limit), 2)
      end
      d = new_decoder(self, slots, len)
      self._decoder = d
    end
    local ok, res = pcall(gen.run, d, prompts, opts)
    if not ok then error(res, 2) end
    return res
  end
end

return M
