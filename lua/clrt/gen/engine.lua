-- clrt.gen.engine — batched sampling on top of a slot-based KV-cache decoder.
--
-- A decoder (made by the model: m:decoder(slots, max_len)) owns a KV cache with `slots`
-- independent rows and writes next-token logits into a [slots, V] buffer, row = slot:
--   dec:prefill(slot, tokens_ptr, T, logits)         -- run T tokens into an empty slot
--   dec:prefill_many(n, slots_ptr, tokens_ptr, lengths_ptr, logits)   -- optional: n prompts
--                                                     -- (back to back) in one batched forward
--   dec:copy_slot(src, dst)                           -- share a prefilled prompt
--   dec:decode(n, slots_ptr, tokens_ptr, logits)      -- one new token for each of n slots
--   dec.vocab_size, dec.max_len, dec.slots
-- An Engine holds the rows being generated. Rows join at any step (a server adds requests
-- between steps: continuous batching) and leave when they finish, so a finished row costs
-- nothing. Every row has its own options, seeded RNG stream, stop rules and callbacks.
-- Prompts added between two steps are prefilled together at the start of the next step (one
-- batched forward, as a server's newly arrived requests are), then join the decode batch.
-- With a prefix cache (clrt.gen.prefix_cache: the model's own unless opts.prefix_cache is
-- false), a prompt's longest cached prefix is loaded into its slot and only the rest is
-- prefilled; the blocks of every prompt and of every finished row go back into the cache.
-- row.cached_tokens says how many prompt tokens came from the cache.
local ffi = require("ffi")
local bit = require("bit")
local core = require("clrt.core.ffi")
local clock = require("clrt.log").now
local options = require("clrt.gen.options")
local C = core.C

local M = {}

-- The position in `text` where the first stop string starts; nil if none. Only the tail
-- that new text could complete is searched.
local function find_stop(text, new_from, stops)
  local best
  for _, s in ipairs(stops) do
    local i = text:find(s, math.max(1, new_from - #s + 1), true)
    if i and (not best or i < best) then best = i end
  end
  return best
end

-- The ids in [0, V) that `tok` cannot decode, as {n =, ids = int32_t[n]}: a model's
-- embedding often has rows beyond its tokenizer (Qwen2.5: 151,936 rows, 151,665 ids), and a
-- sampled one would end the request with "id ... is not in the vocabulary". Computed once
-- per tokenizer and V. A tokenizer without the C handle (a test's own) is taken as whole
-- up to its vocab_size().
local lacking_cache = setmetatable({}, { __mode = "k" })
function M.undecodable(tok, V)
  local per = lacking_cache[tok]
  if not per then per = {}; lacking_cache[tok] = per end
  if per[V] then return per[V] end
  local ids = {}
  local n_tok = type(tok.vocab_size) == "function" and tok:vocab_size() or V
  if tok.h then
    local len = ffi.new("size_t[1]")
    for id = 0, math.min(n_tok, V) - 1 do
      if C.clrt_tokenizer_token_bytes(tok.h, id, len) == nil then ids[#ids + 1] = id end
    end
  end
  for id = n_tok, V - 1 do ids[#ids + 1] = id end
  local out = { n = #ids, ids = ffi.new("int32_t[?]", math.max(#ids, 1)) }
  for i, id in ipairs(ids) do out.ids[i - 1] = id end
  per[V] = out
  return out
end

local Engine = {}
Engine.__index = Engine

function M.engine(dec, eopts)
  local V, S = dec.vocab_size, dec.slots
  local no_cache = (eopts and eopts.prefix_cache == false) or not (dec.extend_many and dec.model)
  local self = setmetatable({
    dec = dec, V = V,
    logits = ffi.new("float[?]", S * V),     -- [slots, V], row = slot
    batch = ffi.new("float[?]", S * V),      -- [active, V] gathered for the sampler
    masks = nil,
    params = ffi.new("clrt_sample_params[?]", S),
    uniforms = ffi.new("double[?]", S),
    out_tok = ffi.new("int32_t[?]", S),
    out_lp = ffi.new("float[?]", S),
    slot_ids = ffi.new("int32_t[?]", S),
    feed = ffi.new("int32_t[?]", S),
    free = {}, active = {},
    pending = {},                            -- rows added since the last step, not yet prefilled
    no_cache = no_cache,
    -- eopts.times: {prefill_s, decode_s} the caller sums steps into (clrt.gen.scheduler keeps one
    -- per model, across the engines growth makes), so a caller can split its time
    times = eopts and eopts.times,
  }, Engine)
  for s = S - 1, 0, -1 do self.free[#self.free + 1] = s end
  return self
end

-- The model's prefix cache as it is now (configure may have changed or turned it off), or nil.
function Engine:prefix_cache()
  if self.no_cache then return nil end
  return require("clrt.gen.prefix_cache").of(self.dec.model)
end

function Engine:free_slots() return #self.free end
function Engine:busy() return #self.active > 0 or #self.pending > 0 end

-- FNV-1a (64 bits) of a string: the seed of a row's xoshiro stream (clrt_rng_seed mixes it
-- further through splitmix64).
local function fnv64(str)
  local h = 0xcbf29ce484222325ULL
  for i = 1, #str do h = bit.bxor(h, str:byte(i)) * 0x100000001b3ULL end
  return h
end

-- The name of a request's random stream: its seed_key when the caller says who asks, else
-- its prompt's tokens (the fallback: identical requests without a key draw alike).
function M.stream_name(prompt, key)
  if key ~= nil and key ~= false then return "key:" .. tostring(key) end
  return "prompt:" .. table.concat(prompt, ",")
end

-- The seed of sample s (1..n) of a request: a pure function of (seed, stream name, s). The
-- name (a long prompt's tokens) is hashed once per request, then with each s.
local function stream_hash(seed, name) return fnv64(("%.17g|%s"):format(seed, name)) end
local function sample_seed(h, s) return fnv64(("%s|%d"):format(tostring(h), s)) end
function M.row_seed(seed, name, s) return sample_seed(stream_hash(seed, name), s) end

-- Start n = o.n rows for one prompt (o from clrt.gen.options.check). cb.on_token(row, id,
-- text_piece) and cb.on_done(row) are optional. Returns the rows; each ends with
-- row.finish_reason set. Sample s of the request draws its random numbers from the stream
-- M.row_seed(o.seed, name, s), name = M.stream_name(prompt, key) (key: the request's one seed
-- key, clrt.gen.options.seed_keys; nil or false: none): a row's tokens depend on its seed, its
-- key (or prompt) and s only, never on which rows it shares a step with or when it came.
function Engine:add(prompt, o, cb, tag, key)
  cb = cb or {}
  options.check_prompt(tag or 1, prompt, self.V, o, self.dec.max_len)
  if o.n > #self.free then
    error(("generate: %d rows need slots but the decoder has %d free of %d"):format(o.n, #self.free, self.dec.slots), 0)
  end
  local h = stream_hash(o.seed, M.stream_name(prompt, key))
  local rows = {}
  for s = 1, o.n do
    local row = { o = o, cb = cb, tokens = {}, logprobs = {}, sample = s, tag = tag }
    if o.frequency_penalty ~= 0 or o.presence_penalty ~= 0 then row.counts = {} end   -- token id -> times sampled
    row.rng = ffi.new("clrt_rng")
    C.clrt_rng_seed(row.rng, sample_seed(h, s))
    if o.tokenizer then
      local lack = M.undecodable(o.tokenizer, self.V)
      if lack.n > 0 then row.undecodable = lack end
    end
    if o.tokenizer then row.text, row.stream = "", o.tokenizer:stream({ skip_special_tokens = true }) end
    rows[s] = row
  end
  if o.max_new_tokens == 0 then
    for _, row in ipairs(rows) do self:finish(row, "length", true) end
    return rows
  end
  -- the first row is prefilled with the prompt, the others copy its cache (Engine:prefill)
  for s, row in ipairs(rows) do
    row.slot = table.remove(self.free)
    if s == 1 then row.prompt = prompt else row.copy_of = rows[1] end
    row.full_prompt = prompt
    self.pending[#self.pending + 1] = row
  end
  return rows
end

-- Most prompt positions one batched prefill call takes (rows x the longest's chunk of at most
-- 256): bounds the activations and attention scores of a burst of long prompts.
local PREFILL_TOKENS = 8192

-- A batch's shared blocks run first only when that saves at least this many prompt tokens: the
-- extra forward reads every weight once more (a guess to be checked on a quiet machine with
-- bench/prefix_cache.lua).
local MIN_SHARED_SAVING = 128

-- Runs each row's prompt tokens (row.held, row.upto] after the row.held its slot holds, all
-- rows in as few batched forwards as PREFILL_TOKENS allows; extend: slots keep what they hold
-- (else they are emptied first).
local function run_batches(dec, rows, logits, extend)
  local i = 1
  while i <= #rows do
    local j, width = i, 0
    while j <= #rows do
      local w = math.max(width, math.min(rows[j].upto - rows[j].held, 256))
      if j > i and w * (j - i + 1) > PREFILL_TOKENS then break end
      width, j = w, j + 1
    end
    local n, total = j - i, 0
    for k = i, j - 1 do total = total + rows[k].upto - rows[k].held end
    local slots, lengths = ffi.new("int32_t[?]", n), ffi.new("int32_t[?]", n)
    local buf, at = ffi.new("int32_t[?]", total), 0
    for k = i, j - 1 do
      local row = rows[k]
      slots[k - i], lengths[k - i] = row.slot, row.upto - row.held
      for t = row.held + 1, row.upto do buf[at] = row.prompt[t]; at = at + 1 end
    end
    if extend then
      dec:extend_many(n, slots, buf, lengths, logits)
    elseif dec.prefill_many then
      dec:prefill_many(n, slots, buf, lengths, logits)
    else
      at = 0
      for k = 0, n - 1 do
        dec:prefill(slots[k], buf + at, lengths[k], logits)
        at = at + lengths[k]
      end
    end
    i = j
  end
end

-- The rows that share whole blocks with another row of the batch beyond what their slot holds,
-- each the first row to reach such a block: row.upto becomes the end of the deepest one, which
-- it runs before the others look the cache up again. Blocks stop before each prompt's last
-- token, as lookups do.
local function shared_prefixes(pc, rows)
  local bt, root, paths = pc.bt, { children = {} }, {}
  for _, row in ipairs(rows) do
    local n, path = root, {}
    for first = 1, #row.prompt - bt, bt do
      local key = table.concat(row.prompt, ",", first, first + bt - 1)
      local c = n.children[key]
      if not c then
        c = { children = {}, count = 0, first = row }
        n.children[key] = c
      end
      c.count = c.count + 1
      path[#path + 1] = c
      n = c
    end
    paths[row] = path
  end
  local saved = 0
  for _, row in ipairs(rows) do
    for d, c in ipairs(paths[row]) do
      if c.count >= 2 and c.first == row and d * bt > row.held then saved = saved + bt * (c.count - 1) end
    end
  end
  local leaders = {}
  if saved < MIN_SHARED_SAVING then return leaders end
  for _, row in ipairs(rows) do
    local need = 0
    for d, c in ipairs(paths[row]) do
      if c.count >= 2 and c.first == row then need = d * bt end
    end
    if need > row.held then
      row.upto = need
      leaders[#leaders + 1] = row
    end
  end
  return leaders
end

-- The row's longest cached prefix into its slot, when longer than what the slot holds.
function Engine:load_cached(pc, row)
  local nodes = pc:lookup(row.prompt, #row.prompt - 1)
  local got = #nodes * pc.bt
  if got > row.held then
    pc:load(self.dec, row.slot, nodes)
    row.held, row.cached_tokens = got, got
  elseif row.held == 0 then
    self.dec:reset(row.slot)
  end
  pc:release(nodes)
end

-- Prefill the rows added since the last step, all prompts in as few batched forwards as the
-- budget allows, then let them join the decode batch.
function Engine:prefill()
  local pending = self.pending
  if #pending == 0 then return end
  self.pending = {}
  -- A row whose prompt equals an earlier pending row's copies that row's cache as a request's
  -- n samples do: an RL step's futures of one response reach the same context turn after
  -- turn (the world's user answers alike), and prefills were most of its generation time.
  local firsts, seen = {}, {}
  for _, row in ipairs(pending) do
    if row.prompt then
      local key = table.concat(row.prompt, ",")
      local same = seen[key]
      if same then
        row.prompt, row.copy_of = nil, same
      else
        seen[key] = row
        firsts[#firsts + 1] = row
      end
    end
  end
  local dec, pc = self.dec, self:prefix_cache()
  -- each row runs its prompt's tokens after the `held` its slot holds (at least the last one,
  -- whose logits the row samples from)
  for _, row in ipairs(firsts) do row.held, row.upto, row.cached_tokens = 0, #row.prompt, 0 end
  if pc then
    for _, row in ipairs(firsts) do
      self:load_cached(pc, row)
      row.weights = pc.stamp_key   -- the weights its keys and values come from
    end
    -- prompts of this batch that share whole blocks the cache lacks (a system prompt): the
    -- first of each runs the shared part alone first, then the others are served it
    local leaders = shared_prefixes(pc, firsts)
    if #leaders > 0 then
      run_batches(dec, leaders, self.logits, true)
      for _, row in ipairs(leaders) do
        pc:insert(dec, row.slot, row.prompt, row.weights)
        row.held, row.upto, row.leader = row.upto, #row.prompt, true
      end
      for _, row in ipairs(firsts) do
        if not row.leader then self:load_cached(pc, row) end
        row.leader = nil
      end
    end
    for _, row in ipairs(firsts) do
      pc.prompt_tokens, pc.cached_tokens = pc.prompt_tokens + #row.prompt, pc.cached_tokens + row.cached_tokens
    end
  end
  run_batches(dec, firsts, self.logits, pc ~= nil)
  local V = self.V
  if pc then
    for _, row in ipairs(firsts) do pc:insert(dec, row.slot, row.prompt, row.weights) end
  end
  for _, row in ipairs(pending) do
    if row.copy_of then
      dec:copy_slot(row.copy_of.slot, row.slot)
      ffi.copy(self.logits + row.slot * V, self.logits + row.copy_of.slot * V, V * 4)
      row.cached_tokens, row.weights = row.copy_of.cached_tokens, row.copy_of.weights
    end
    row.prompt, row.copy_of, row.prefilled = nil, nil, true
    self.active[#self.active + 1] = row
  end
end

-- The prompt and the tokens sampled after it, for the prefix cache (the slot holds all but
-- the last sampled token).
local function row_tokens(row)
  local all = {}
  for i, t in ipairs(row.full_prompt) do all[i] = t end
  local P = #all
  for i, t in ipairs(row.tokens) do all[P + i] = t end
  return all
end

function Engine:finish(row, reason, no_slot)
  row.finish_reason = reason
  local pc = row.prefilled and self:prefix_cache()
  if pc and row.slot and not no_slot then pc:insert(self.dec, row.slot, row_tokens(row), row.weights) end
  row.full_prompt = nil
  if row.slot and not no_slot then
    self.free[#self.free + 1] = row.slot
    row.slot = nil
  end
  if row.o.tokenizer then
    if row.text_cut then
      row.text = row.text:sub(1, row.text_cut)
    else
      row.text = row.o.tokenizer:decode(row.tokens, { skip_special_tokens = true })
    end
  end
  if row.cb.on_done then row.cb.on_done(row) end
end

-- Drop a row early (its client went away). A waiting row whose prompt others share hands
-- the prompt to the first of them.
function Engine:cancel(row)
  for _, list in ipairs({ self.active, self.pending }) do
    for i, r in ipairs(list) do
      if r == row then
        table.remove(list, i)
        local heir
        for _, p in ipairs(self.pending) do
          if p.copy_of == row then
            if not heir then heir, p.prompt, p.copy_of = p, row.prompt, nil else p.copy_of = heir end
          end
        end
        row.prompt = nil
        self:finish(row, "cancelled")
        return
      end
    end
  end
end

-- The temperature-1 log-probability of the sampled token and the most likely tokens.
function Engine:model_logprobs(row, logits, tok)
  local k = row.o.top_logprobs
  if not self.top_ids then
    self.top_ids, self.top_lps, self.chosen_lp = ffi.new("int32_t[64]"), ffi.new("float[64]"), ffi.new("float[1]")
  end
  if C.clrt_top_logprobs(logits, self.V, tok, k, self.top_ids, self.top_lps, self.chosen_lp) ~= 0 then core.fail(3) end
  local top = {}
  for j = 1, k do top[j] = { id = self.top_ids[j - 1], lp = self.top_lps[j - 1] } end
  row.model_logprobs = row.model_logprobs or {}
  row.model_logprobs[#row.model_logprobs + 1] = { lp = self.chosen_lp[0], top = top }
end

-- Prefill the rows added since the last step, then one token for every active row and one
-- batched decode for those that go on; the seconds of each part go into self.times.
function Engine:step()
  local t0 = clock()
  self:prefill()
  local t1 = clock()
  self:decode_step()
  local times = self.times
  if times then
    times.prefill_s = times.prefill_s + (t1 - t0)
    times.decode_s = times.decode_s + (clock() - t1)
  end
end

-- One token for every active row (sampling), then one batched decode for those that go on.
function Engine:decode_step()
  local V = self.V
  local masks = nil
  for _, row in ipairs(self.active) do
    if row.o.mask then masks = true end
  end
  if masks then
    -- a constrained row whose value is complete, with no stop token to sample, ends here
    self.masks = self.masks or ffi.new("uint8_t[?]", self.dec.slots * V)
    masks = self.masks
    local keep = {}
    for _, row in ipairs(self.active) do
      local m = nil
      if row.o.mask then m = row.o.mask(row) end
      if m == false then
        self:finish(row, "stop")
      else
        keep[#keep + 1] = row
        local at = masks + (#keep - 1) * V
        if m then ffi.copy(at, m, V) else ffi.fill(at, V, 1) end
      end
    end
    self.active = keep
  end
  local A = #self.active
  if A == 0 then return end
  -- The sampler takes the active rows' logits side by side: when their slots are 0, 1, ...
  -- in order (a batch that has lost no row) they already are.
  local gathered = self.logits
  for k, row in ipairs(self.active) do
    if row.slot ~= k - 1 then gathered = self.batch break end
  end
  for k, row in ipairs(self.active) do
    local o = row.o
    if gathered == self.batch then ffi.copy(self.batch + (k - 1) * V, self.logits + row.slot * V, V * 4) end
    self.params[k - 1].temperature = o.temperature
    self.params[k - 1].top_k = o.top_k
    self.params[k - 1].top_p = o.top_p
    self.uniforms[k - 1] = C.clrt_rng_uniform(row.rng)
  end
  -- logit_bias, then the penalties, change the row's own logits for sampling only: the
  -- model's log-probabilities (top_logprobs) are read after the saved values are put back
  local saved = nil
  for k, row in ipairs(self.active) do
    local o, lb, counts = row.o, row.o.logit_bias, row.counts
    if lb or counts then
      local at, keep = gathered + (k - 1) * V, {}
      for i, id in ipairs(lb and lb.ids or {}) do
        keep[id] = at[id]
        at[id] = at[id] + lb.vals[i]
      end
      for id, c in pairs(counts or {}) do
        if keep[id] == nil then keep[id] = at[id] end
        at[id] = at[id] - (c * o.frequency_penalty + o.presence_penalty)
      end
      saved = saved or {}
      saved[k] = keep
    end
  end
  -- ids the row's tokenizer cannot decode are never sampled (nor listed in top_logprobs)
  for k, row in ipairs(self.active) do
    local lack = row.undecodable
    if lack then
      local at = gathered + (k - 1) * V
      for i = 0, lack.n - 1 do at[lack.ids[i]] = -math.huge end
    end
  end
  if C.clrt_sample(gathered, A, V, self.params, self.uniforms, masks, self.out_tok, self.out_lp) ~= 0 then
    core.fail(2)
  end
  for k, keep in pairs(saved or {}) do
    local at = gathered + (k - 1) * V
    for id, v in pairs(keep) do at[id] = v end
  end
  local still = {}
  for k, row in ipairs(self.active) do
    local o, tok = row.o, self.out_tok[k - 1]
    row.tokens[#row.tokens + 1] = tok
    if row.counts then row.counts[tok] = (row.counts[tok] or 0) + 1 end
    row.logprobs[#row.logprobs + 1] = self.out_lp[k - 1]
    if o.top_logprobs then self:model_logprobs(row, gathered + (k - 1) * V, tok) end
    local piece, done = nil, nil
    if o.stop_ids[tok] then
      done = "stop"
    elseif row.stream then
      piece = row.stream:push(tok)
      if piece ~= "" then
        local before = #row.text
        row.text = row.text .. piece
        if #o.stop_strings > 0 then
          local at = find_stop(row.text, before + 1, o.stop_strings)
          if at then
            row.text_cut = at - 1
            piece = at - 1 > before and row.text:sub(before + 1, at - 1) or ""
            done = "stop"
          end
        end
      end
    end
    if row.cb.on_token then row.cb.on_token(row, tok, piece) end
    if row.cancelled then done = "cancelled" end   -- a callback may cancel (client went away)
    if not done and #row.tokens >= o.max_new_tokens then done = "length" end
    if done then self:finish(row, done) else still[#still + 1] = row end
  end
  self.active = still
  if #still > 0 then
    for k, row in ipairs(still) do
      self.slot_ids[k - 1] = row.slot
      self.feed[k - 1] = row.tokens[#row.tokens]
    end
    self.dec:decode(#still, self.slot_ids, self.feed, self.logits)
  end
end

return M
