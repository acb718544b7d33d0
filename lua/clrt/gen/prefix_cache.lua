-- clrt.gen.prefix_cache — keys and values already computed, kept for the next prompt that
-- starts with the same tokens (docs/prefix_cache.md).
--
--   local PC = require("clrt.gen.prefix_cache")
--   PC.configure(model, {mb = 1024, block_tokens = 16})   -- mb = 0 turns it off
--   local pc = PC.of(model)          -- the model's cache, or nil (off, or the model cannot
--                                     -- promise bit-identical reuse: clrt_model_kv_reusable)
--
-- A prompt is cut into blocks of block_tokens tokens; the tree's node for block i is keyed by
-- its parent (blocks 1..i-1) and its own tokens, so a node stands for a whole prefix. Each node
-- owns one block of the C storage (clrt_kv_blocks) holding that block's keys and values in every
-- layer. The engine (clrt.gen.engine) loads the longest cached prefix into a slot before a
-- prefill and prefills only the rest, and puts the blocks of every prompt and finished row back.
-- A node's refs count its children and the prefills reading it; when the storage is full the
-- least recently used node with refs 0 (a leaf nobody reads) gives its block up. The storage
-- holds floor(mb MiB / block bytes) blocks, allocated on first use.
--
-- Blocks are only ever served for the weights that computed them: every lookup compares the
-- model's weights stamp (arenas, write counts, adapters and whether they are on, precision,
-- device) with the one the blocks were made under and empties the tree when it changed (an
-- optimizer step, a load, an adapter change). Only positions the decoder marks exact
-- (clrt_decoder_exact_length) are stored, so a served prefix equals a fresh prefill bit for bit.
local ffi = require("ffi")
local core = require("clrt.core.ffi")
local C = core.C

local M = {}
M.DEFAULT_MB = 1024
M.DEFAULT_BLOCK_TOKENS = 16

local Cache = {}
Cache.__index = Cache

local function check_opts(o, who)
  if o.mb ~= nil and (type(o.mb) ~= "number" or o.mb < 0 or o.mb ~= o.mb) then
    error(("%s: prefix cache mb must be a number >= 0 (0 turns it off), got %s"):format(who, tostring(o.mb)), 3)
  end
  local bt = o.block_tokens
  if bt ~= nil and (type(bt) ~= "number" or bt < 1 or bt ~= math.floor(bt) or bt > 4096) then
    error(("%s: prefix cache block_tokens must be an integer in [1, 4096], got %s"):format(who, tostring(bt)), 3)
  end
end

-- model -> its settings and its cache, kept here rather than on the model. Weak keys: a cache
-- holds its model's C handle, not its table (LuaJIT's weak keys are not ephemerons).
local settings = setmetatable({}, { __mode = "k" })
local caches = setmetatable({}, { __mode = "k" })

-- Free the model's cache now (its blocks go back at once; the next lookup starts empty).
-- clrt.gen.scheduler calls it when it drops the model's engine.
function M.release(model)
  local pc = caches[model]
  caches[model] = nil
  if pc then pc:free_storage() end
end

-- Set the model's bound (MiB) and block size; an existing cache is freed.
function M.configure(model, opts)
  opts = opts or {}
  check_opts(opts, "prefix_cache.configure")
  settings[model] = { mb = opts.mb, block_tokens = opts.block_tokens }
  M.release(model)
end

function M.new(model, opts)
  opts = opts or {}
  check_opts(opts, "prefix_cache.new")
  local bt = opts.block_tokens or M.DEFAULT_BLOCK_TOKENS
  local mb = opts.mb or M.DEFAULT_MB
  local block_bytes = tonumber(C.clrt_kv_block_bytes(model.ptr, bt))
  local blocks = math.floor(mb * 1048576 / block_bytes)
  return setmetatable({
    mptr = model.ptr, bt = bt, mb = mb, capacity = blocks, block_bytes = block_bytes,
    root = { children = {}, refs = 0 }, nodes = 0, free = {}, next_id = 0, tick = 0,
    stamp = ffi.new("uint64_t[8]"), stamp_key = nil,
    -- totals over the cache's life: what the engine asked for and what it was served
    prompt_tokens = 0, cached_tokens = 0, invalidations = 0, evictions = 0,
  }, Cache)
end

-- The model's cache (made on first use), or nil when it is off or the model cannot reuse.
function M.of(model)
  if type(model) ~= "table" or model.ptr == nil then return nil end
  local o = settings[model] or {}
  if (o.mb or M.DEFAULT_MB) <= 0 or C.clrt_model_kv_reusable(model.ptr) == 0 then return nil end
  local pc = caches[model]
  if not pc then
    pc = M.new(model, o)
    if pc.capacity < 1 then return nil end
    caches[model] = pc
  end
  return pc
end

-- Drop every block (the weights changed, or the caller asks).
function Cache:clear()
  self.root = { children = {}, refs = 0 }
  self.nodes, self.free, self.next_id = 0, {}, 0
end

-- Drop every block and give the storage back now (a later insert allocates it again).
function Cache:free_storage()
  self:clear()
  local b = self.blocks
  self.blocks = nil
  if b then C.clrt_kv_blocks_free(ffi.gc(b, nil)) end
end

-- Empty the tree when the weights are not the ones its blocks were computed with.
function Cache:check_weights()
  C.clrt_model_weights_stamp(self.mptr, self.stamp)
  local key = ffi.string(self.stamp, 64)
  if key ~= self.stamp_key then
    if self.nodes > 0 then self.invalidations = self.invalidations + 1 end
    self:clear()
    self.stamp_key = key
  end
end

local function block_key(tokens, first, bt)
  return table.concat(tokens, ",", first, first + bt - 1)
end

-- The least recently used node nobody reads and nothing hangs from gives its block up.
function Cache:evict_one()
  local best
  local function walk(n)
    for _, c in pairs(n.children) do
      if c.refs == 0 and (not best or c.used < best.used) then best = c end
      if c.refs > 0 then walk(c) end
    end
  end
  walk(self.root)
  if not best then return nil end
  best.parent.children[best.key] = nil
  best.parent.refs = best.parent.refs - 1
  self.nodes = self.nodes - 1
  self.evictions = self.evictions + 1
  return best.id
end

function Cache:allocate()
  local id = table.remove(self.free)
  if id then return id end
  if self.next_id < self.capacity then
    if not self.blocks then
      local b = C.clrt_kv_blocks_new(self.mptr, self.bt, self.capacity)
      if b == nil then core.fail(3) end
      self.blocks = ffi.gc(b, C.clrt_kv_blocks_free)
    end
    self.next_id = self.next_id + 1
    return self.next_id - 1
  end
  return self:evict_one()
end

-- The cached nodes of the longest prefix of tokens[1..limit] in whole blocks, pinned (refs)
-- until release(nodes).
function Cache:lookup(tokens, limit)
  self:check_weights()
  local bt, n, nodes = self.bt, self.root, {}
  self.tick = self.tick + 1
  for first = 1, (limit or #tokens) - bt + 1, bt do
    local c = n.children[block_key(tokens, first, bt)]
    if not c then break end
    c.used, c.refs = self.tick, c.refs + 1
    nodes[#nodes + 1] = c
    n = c
  end
  return nodes
end

function Cache:release(nodes)
  for _, c in ipairs(nodes) do c.refs = c.refs - 1 end
end

-- Load the nodes' blocks into the decoder's slot (its length becomes #nodes * bt).
function Cache:load(dec, slot, nodes)
  local ids = ffi.new("int32_t[?]", math.max(1, #nodes))
  for i, c in ipairs(nodes) do ids[i - 1] = c.id end
  dec:load_blocks(slot, #nodes, ids, self.blocks)
end

-- Put the slot's whole blocks that hold tokens[1..] (up to its exact length) into the tree;
-- returns the blocks added. weights (optional): the stamp the slot's prefill ran under; a row
-- whose weights changed while it decoded holds keys and values of both, and adds nothing.
function Cache:insert(dec, slot, tokens, weights)
  self:check_weights()
  if weights and weights ~= self.stamp_key then return 0 end
  local bt = self.bt
  local upto = math.min(dec:exact_length(slot), #tokens)
  local n, path, added = self.root, {}, 0
  self.tick = self.tick + 1
  local id1 = ffi.new("int32_t[1]")
  for first = 1, upto - bt + 1, bt do
    local key = block_key(tokens, first, bt)
    local c = n.children[key]
    if not c then
      local id = self:allocate()
      if not id then break end
      id1[0] = id
      dec:save_blocks(slot, (first - 1) / bt, 1, id1, self.blocks)
      c = { parent = n, key = key, id = id, children = {}, refs = 0 }
      n.children[key] = c
      n.refs = n.refs + 1
      self.nodes = self.nodes + 1
      added = added + 1
    end
    c.used = self.tick
    c.refs = c.refs + 1   -- the path stays while the rest is added below it
    path[#path + 1] = c
    n = c
  end
  self:release(path)
  return added
end

function Cache:stats()
  return { prompt_tokens = self.prompt_tokens, cached_tokens = self.cached_tokens, blocks = self.nodes,
           capacity = self.capacity, block_tokens = self.bt, invalidations = self.invalidations,
           evictions = self.evictions }
end

return M
