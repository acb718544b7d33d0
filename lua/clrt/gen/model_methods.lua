-- clrt.gen.model_methods — KV-cache decoding for clrt.model: m:decoder(slots, max_len) and
-- m:generate(prompts, opts). Installed into the Model class by lua/clrt/model.lua.
local ffi = require("ffi")
local core = require("clrt.core.ffi")
local gen = require("clrt.gen.engine")
local C = core.C

local M = {}

local Decoder = {}
Decoder.__index = Decoder

function Decoder:prefill(slot, tokens, T, logits)
  core.ok(C.clrt_decoder_reset(self.ptr, slot), 2)
  core.ok(C.clrt_decoder_append(self.ptr, slot, tokens, T, logits), 2)
end
-- n prompts into n slots in one batched forward per chunk (tokens back to back, lengths[n]).
function Decoder:prefill_many(n, slots, tokens, lengths, logits)
  core.ok(C.clrt_decoder_prefill_many(self.ptr, n, slots, tokens, lengths, logits), 2)
end
function Decoder:copy_slot(src, dst) core.ok(C.clrt_decoder_copy_slot(self.ptr, src, dst), 2) end
function Decoder:decode(n, slots, tokens, logits) core.ok(C.clrt_decoder_decode(self.ptr, n, slots, tokens, logits), 2) end
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

function M.install(Model)
  -- A KV cache for `slots` sequences of up to max_len tokens (the parameters are shared
  -- with the model: train, then decode with the updated weights, no copy).
  function Model:decoder(slots, max_len)
    return new_decoder(self, slots or 1, max_len or math.min(self.config.max_position_embeddings or 2048, 2048))
  end

  -- generate(prompts, {n, max_new_tokens, temperature, top_p, top_k, stop, seed, tokenizer,
  -- on_step}) -> one entry per (prompt, sample), prompt-major:
  -- {tokens = {...}, logprobs = {...}, finish_reason = "stop" | "length", text = ...}.
  -- The decoder is kept on the model and grows to the largest request seen.
  function Model:generate(prompts, opts)
    opts = opts or {}
    if type(prompts) ~= "table" then error("generate: prompts must be a list of token rows", 2) end
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
