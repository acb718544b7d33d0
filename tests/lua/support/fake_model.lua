-- A fake decoder and tokenizer for tests of the generation engine and the server: the next
-- token's logits are a known function of (the slot's last token, its position), so greedy
-- output can be computed independently by greedy_reference().
local ffi = require("ffi")
local M = {}

M.V = 11
local V = M.V

function M.logit(last, pos, v) return 3 * math.cos(v * (last + 1) * 0.37 + pos * 0.11) end

function M.decoder(slots, max_len)
  local d = { vocab_size = V, slots = slots, max_len = max_len, state = {}, prefills = 0, decoded_rows = 0, steps = 0, max_batch = 0 }
  local function fill(out, last, pos)
    for v = 0, V - 1 do out[v] = M.logit(last, pos, v) end
  end
  function d:prefill(slot, toks, n, out)
    self.prefills = self.prefills + 1
    self.state[slot] = { last = toks[n - 1], pos = n }
    fill(out + slot * V, toks[n - 1], n)
  end
  -- several prompts in one call, as the real decoder batches them (counted in prefill_calls)
  function d:prefill_many(n, slots, toks, lens, out)
    self.prefill_calls = (self.prefill_calls or 0) + 1
    local at = 0
    for k = 0, n - 1 do
      self:prefill(slots[k], toks + at, lens[k], out)
      at = at + lens[k]
    end
  end
  function d:copy_slot(src, dst)
    local s = self.state[src]
    self.state[dst] = { last = s.last, pos = s.pos }
  end
  function d:decode(n, slot_ids, toks, out)
    self.steps = self.steps + 1
    self.max_batch = math.max(self.max_batch, n)
    self.decoded_rows = self.decoded_rows + n
    for k = 0, n - 1 do
      local s = self.state[slot_ids[k]]
      s.last, s.pos = toks[k], s.pos + 1
      fill(out + slot_ids[k] * V, s.last, s.pos)
    end
  end
  return d
end

-- Generate over a decoder (this fake or another test's) as every caller does: through the
-- one owner, clrt.gen.scheduler, the decoder given as its own key (it never grows).
function M.generate(dec, prompts, opts)
  local G = require("clrt.gen.scheduler")
  G.attach(dec, dec)
  return G.generate(dec, prompts, opts)
end

function M.greedy_reference(prompt, steps, stop_id)
  local last, pos, out = prompt[#prompt], #prompt, {}
  for _ = 1, steps do
    local best, arg = -math.huge, 0
    for v = 0, V - 1 do
      local l = tonumber(ffi.new("float", M.logit(last, pos, v)))   -- the sampler works in f32
      if l > best then best, arg = l, v end
    end
    out[#out + 1] = arg
    if arg == stop_id then break end
    last, pos = arg, pos + 1
  end
  return out
end

-- Token v is the letter 'a' + v.
M.tokenizer = {}
function M.tokenizer:stream()
  return { push = function(_, id) return string.char(97 + id) end }
end
function M.tokenizer:decode(ids, opts)
  local s = {}
  for _, id in ipairs(ids) do
    if not (opts and opts.skip_special_tokens and id == M.end_of_turn) then s[#s + 1] = string.char(97 + id) end
  end
  return table.concat(s)
end
M.end_of_turn = 10

-- Messages become the letters of their contents, mapped into the vocabulary.
function M.render(messages)
  local ids = {}
  for _, m in ipairs(messages) do
    for c in m.content:gmatch(".") do ids[#ids + 1] = c:byte() % (V - 1) end
  end
  if #ids == 0 then ids[1] = 0 end
  return ids
end

function M.text_of(ids)
  return M.tokenizer:decode(ids, { skip_special_tokens = true })
end

return M
