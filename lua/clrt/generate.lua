-- clrt.generate — batched sampling on top of a slot-based KV-cache decoder.
--
-- A decoder (made by the model: m:decoder(slots, max_len)) owns a KV cache with `slots`
-- independent rows. It offers:
--   dec:prefill(slot, tokens_ptr, T, logits_out)        -- run T tokens into an empty slot
--   dec:copy_slot(src, dst)                              -- share a prefilled prompt
--   dec:decode(n, slots_ptr, tokens_ptr, logits_out)     -- one new token for n slots
--   dec.vocab_size, dec.max_len, dec.slots
-- and this file does everything else: one prefill per distinct prompt, its cache copied to
-- the prompt's n samples, per-row seeded RNG streams, sampling in C, stop tokens and stop
-- strings (found across token boundaries), and rows leave the batch as they finish.
local ffi = require("ffi")
local core = require("clrt.ffi")
local C = core.C

local M = {}

local function check_opts(opts, vocab)
  local o = {
    n = opts.n or 1,
    max_new_tokens = opts.max_new_tokens or 64,
    temperature = opts.temperature or 1.0,
    top_p = opts.top_p or 1.0,
    top_k = opts.top_k or 0,
    seed = opts.seed or 0,
  }
  local function bad(k, why) error(("generate: option %s %s"):format(k, why), 4) end
  if type(o.n) ~= "number" or o.n < 1 or o.n ~= math.floor(o.n) then bad("n", "must be a positive integer") end
  if type(o.max_new_tokens) ~= "number" or o.max_new_tokens < 0 then bad("max_new_tokens", "must be >= 0") end
  if type(o.temperature) ~= "number" or o.temperature < 0 then bad("temperature", "must be >= 0") end
  if type(o.top_p) ~= "number" or o.top_p <= 0 or o.top_p > 1 then bad("top_p", "must be in (0, 1]") end
  if type(o.top_k) ~= "number" or o.top_k < 0 then bad("top_k", "must be >= 0") end
  -- stop: token ids (numbers) and strings, one value or a list
  local stop = opts.stop
  if stop ~= nil and type(stop) ~= "table" then stop = { stop } end
  o.stop_ids, o.stop_strings = {}, {}
  for _, s in ipairs(stop or {}) do
    if type(s) == "number" then
      if s < 0 or s >= vocab then bad("stop", ("has token id %d outside the vocabulary of %d"):format(s, vocab)) end
      o.stop_ids[s] = true
    elseif type(s) == "string" then
      if s == "" then bad("stop", "has an empty string") end
      o.stop_strings[#o.stop_strings + 1] = s
    else
      bad("stop", "entries must be token ids or strings")
    end
  end
  if #o.stop_strings > 0 and not opts.tokenizer then
    bad("stop", "has strings but no tokenizer was given (opts.tokenizer) to decode with")
  end
  o.tokenizer = opts.tokenizer
  o.on_step = opts.on_step
  o.on_token = opts.on_token
  o.mask = opts.mask   -- function(row_index, tokens_so_far) -> uint8_t* [V] or nil (constrained decoding)
  return o
end

-- The position in `text` where the first stop string starts, and which one; nil if none.
local function find_stop(text, from, stops)
  local best, which
  for _, s in ipairs(stops) do
    local i = text:find(s, math.max(1, from - #s + 1), true)
    if i and (not best or i < best) then best, which = i, s end
  end
  return best, which
end

-- Row RNG streams: seed and row index give an independent, reproducible stream.
local function row_rng(seed, row)
  local g = ffi.new("clrt_rng")
  C.clrt_rng_seed(g, seed * 1000003 + row)
  return g
end

-- generate(dec, prompts, opts): prompts is a list of token rows (Lua tables of ids).
-- Returns one entry per (prompt, sample), prompt-major:
--   { tokens = {...}, logprobs = {...}, finish_reason = "stop" | "length", text = ... }
-- (`text` only when a tokenizer was given; it ends before a matched stop string.)
function M.run(dec, prompts, opts)
  local V = dec.vocab_size
  local o = check_opts(opts or {}, V)
  if type(prompts) ~= "table" then error("generate: prompts must be a list of token rows", 3) end
  local rows = {}
  for p, prompt in ipairs(prompts) do
    if type(prompt) ~= "table" or #prompt == 0 then
      error(("generate: prompt %d must be a non-empty list of token ids"):format(p), 3)
    end
    for i, t in ipairs(prompt) do
      if type(t) ~= "number" or t < 0 or t >= V or t ~= math.floor(t) then
        error(("generate: prompt %d token %d (%s) is not an id in [0, %d)"):format(p, i, tostring(t), V), 3)
      end
    end
    if #prompt + o.max_new_tokens > dec.max_len then
      error(("generate: prompt %d has %d tokens + max_new_tokens %d = %d, more than the context of %d")
        :format(p, #prompt, o.max_new_tokens, #prompt + o.max_new_tokens, dec.max_len), 3)
    end
    for s = 1, o.n do
      rows[#rows + 1] = { prompt = p, sample = s, tokens = {}, logprobs = {}, len = #prompt }
    end
  end
  local R = #rows
  local results = {}
  for i, r in ipairs(rows) do results[i] = r end
  if o.max_new_tokens == 0 or R == 0 then
    for _, r in ipairs(rows) do
      r.finish_reason = "length"
      if o.tokenizer then r.text = "" end
    end
    return M.pack(results, o)
  end
  if R > dec.slots then
    error(("generate: %d rows (prompts x n) but the decoder has %d slots"):format(R, dec.slots), 3)
  end

  local logits = ffi.new("float[?]", R * V)
  local params = ffi.new("clrt_sample_params[?]", R)
  local uniforms = ffi.new("double[?]", R)
  local out_tok = ffi.new("int32_t[?]", R)
  local out_lp = ffi.new("float[?]", R)
  local slots = ffi.new("int32_t[?]", R)
  local feed = ffi.new("int32_t[?]", R)
  local masks = o.mask and ffi.new("uint8_t[?]", R * V) or nil
  local rngs = {}
  for i = 1, R do rngs[i] = row_rng(o.seed, i) end

  -- Prefill each distinct prompt once; its samples copy the cache and the last logits.
  local first_of = {}
  for i, r in ipairs(rows) do
    if r.sample == 1 then
      local prompt = prompts[r.prompt]
      local buf = ffi.new("int32_t[?]", #prompt)
      for k = 1, #prompt do buf[k - 1] = prompt[k] end
      dec:prefill(i - 1, buf, #prompt, logits + (i - 1) * V)
      first_of[r.prompt] = i
    else
      local src = first_of[r.prompt]
      dec:copy_slot(src - 1, i - 1)
      ffi.copy(logits + (i - 1) * V, logits + (src - 1) * V, V * 4)
    end
  end
  if o.on_step then o.on_step() end

  -- active: rows still generating, as positions into `rows`; their logits sit at
  -- logits[(k-1)*V] for the k-th active row (compacted each step).
  local active = {}
  for i = 1, R do active[i] = i end
  local decoders = {}
  if o.tokenizer and #o.stop_strings > 0 then
    for i = 1, R do decoders[i] = o.tokenizer:stream_decoder() ; rows[i].text_acc = "" end
  end
  local step = 0
  while #active > 0 do
    step = step + 1
    local A = #active
    for k = 1, A do
      local r = rows[active[k]]
      params[k - 1].temperature = o.temperature
      params[k - 1].top_k = o.top_k
      params[k - 1].top_p = o.top_p
      uniforms[k - 1] = C.clrt_rng_uniform(rngs[active[k]])
      if masks then
        local m = o.mask(active[k], r.tokens)
        if m then ffi.copy(masks + (k - 1) * V, m, V) else ffi.fill(masks + (k - 1) * V, V, 1) end
      end
    end
    if C.clrt_sample(logits, A, V, params, uniforms, masks, out_tok, out_lp) ~= 0 then core.fail(2) end
    local still = {}
    for k = 1, A do
      local ri = active[k]
      local r = rows[ri]
      local tok = out_tok[k - 1]
      r.tokens[#r.tokens + 1] = tok
      r.logprobs[#r.logprobs + 1] = out_lp[k - 1]
      r.len = r.len + 1
      if o.on_token then o.on_token(ri, tok) end
      local done
      if o.stop_ids[tok] then
        done = "stop"
      elseif decoders[ri] then
        local piece = decoders[ri]:push(tok)
        if piece ~= "" then
          local before = #r.text_acc
          r.text_acc = r.text_acc .. piece
          local at = find_stop(r.text_acc, before + 1, o.stop_strings)
          if at then
            r.text_cut = at - 1
            done = "stop"
          end
        end
      end
      if not done and #r.tokens >= o.max_new_tokens then done = "length" end
      if done then
        r.finish_reason = done
      else
        still[#still + 1] = ri
      end
    end
    active = still
    if #active > 0 then
      for k, ri in ipairs(active) do
        slots[k - 1] = ri - 1
        local toks = rows[ri].tokens
        feed[k - 1] = toks[#toks]
      end
      dec:decode(#active, slots, feed, logits)
      if o.on_step then o.on_step() end
    end
  end
  return M.pack(results, o)
end

function M.pack(rows, o)
  local out = {}
  for i, r in ipairs(rows) do
    local e = { tokens = r.tokens, logprobs = r.logprobs, finish_reason = r.finish_reason }
    if o.tokenizer then
      if r.text_cut then
        e.text = r.text_acc:sub(1, r.text_cut)
      else
        e.text = o.tokenizer:decode(r.tokens, { skip_special_tokens = true })
      end
    end
    out[i] = e
  end
  return out
end

return M
