-- clrt.rng — a small seeded random generator in pure Lua: xoshiro128** (Blackman & Vigna)
-- on LuaJIT's 32-bit `bit` operations. Deterministic on every platform, and its whole
-- state is four integers, so a trainer checkpoint saves it and a resumed run continues
-- the same stream.
--   local r = clrt.rng.new(42)
--   r:random()        -- double in [0, 1), 53 random bits
--   r:int(n)          -- integer in [1, n], unbiased (rejection sampling)
--   r:int(a, b)       -- integer in [a, b]
--   r:normal()        -- standard normal (Box-Muller)
--   r:state() / clrt.rng.from_state(s) / r:set_state(s)
--   clrt.rng.seed_of(seed, key) -- a request's 31-bit seed from a run seed and who asks
local bit = require("bit")
local band, bor, bxor, lshift, rshift, tobit = bit.band, bit.bor, bit.bxor, bit.lshift, bit.rshift, bit.tobit

local M = {}
local R = {}
R.__index = R

-- A 31-bit seed from a run seed and a text key (FNV-1a over both): the `seed` an API request
-- carries, so the same run seed and key (clrt.sched's seed_key) ask the same sample.
function M.seed_of(seed, key)
  local h = 2166136261
  local s = tostring(seed or 0) .. "\0" .. tostring(key or "")
  for i = 1, #s do h = tobit(bxor(h, s:byte(i)) * 16777619 % 4294967296) end
  return band(h, 0x7fffffff)
end

local function u32(x) -- signed 32-bit (bit ops) -> [0, 2^32)
  x = tobit(x)
  if x < 0 then x = x + 4294967296 end
  return x
end

local function rotl(x, k) return bor(lshift(x, k), rshift(x, 32 - k)) end

-- x * m mod 2^32 for small m without losing bits in a double.
local function mul(x, m) return tobit(u32(x) * m % 4294967296) end

-- splitmix32-style mixing to spread a user seed over the four state words.
local function mix(z)
  z = tobit(z + 0x9E3779B9)
  local h = bxor(z, rshift(z, 16))
  h = tobit((u32(h) * 0x85EB % 65536 * 65536 + u32(h) * 0xCA6B) % 4294967296)
  h = bxor(h, rshift(h, 13))
  h = tobit((u32(h) * 0xC2B2 % 65536 * 65536 + u32(h) * 0xAE35) % 4294967296)
  h = bxor(h, rshift(h, 16))
  return z, h
end

function M.new(seed)
  seed = seed or 0
  if type(seed) ~= "number" or seed ~= math.floor(seed) then
    error("rng.new: seed must be an integer, got " .. tostring(seed), 2)
  end
  local self = setmetatable({}, R)
  -- fold seeds beyond 32 bits in, so 1 and 2^32+1 differ
  local z = tobit(seed % 4294967296)
  z = bxor(z, tobit(math.floor(seed / 4294967296) % 4294967296))
  local s = {}
  for i = 1, 4 do z, s[i] = mix(z) end
  if s[1] == 0 and s[2] == 0 and s[3] == 0 and s[4] == 0 then s[1] = 1 end
  self.s0, self.s1, self.s2, self.s3 = s[1], s[2], s[3], s[4]
  return self
end

-- Next 32 random bits as a number in [0, 2^32).
function R:next32()
  local s0, s1, s2, s3 = self.s0, self.s1, self.s2, self.s3
  local result = mul(rotl(mul(s1, 5), 7), 9)
  local t = lshift(s1, 9)
  s2 = bxor(s2, s0)
  s3 = bxor(s3, s1)
  s1 = bxor(s1, s2)
  s0 = bxor(s0, s3)
  s2 = bxor(s2, t)
  s3 = rotl(s3, 11)
  self.s0, self.s1, self.s2, self.s3 = s0, s1, s2, s3
  return u32(result)
end

function R:random()
  local a = rshift(self:next32(), 5)       -- 27 bits (logical shift of a u32 fits)
  local b = rshift(self:next32(), 6)       -- 26 bits
  if a < 0 then a = a + 4294967296 end
  return (a * 67108864 + b) / 9007199254740992
end

function R:int(a, b)
  if b == nil then a, b = 1, a end
  local n = b - a + 1
  if n < 1 or n ~= math.floor(n) or n > 4294967296 then
    error(("rng:int: bad range [%s, %s]"):format(tostring(a), tostring(b)), 2)
  end
  -- reject the top sliver so every value is equally likely
  local limit = 4294967296 - 4294967296 % n
  while true do
    local x = self:next32()
    if x < limit then return a + x % n end
  end
end

function R:normal()
  local u = self:random()
  while u <= 0 do u = self:random() end
  local v = self:random()
  return math.sqrt(-2 * math.log(u)) * math.cos(2 * math.pi * v)
end

-- Fisher-Yates in place; returns the list.
function R:shuffle(list)
  for i = #list, 2, -1 do
    local j = self:int(i)
    list[i], list[j] = list[j], list[i]
  end
  return list
end

-- One element at random (nil for an empty list).
function R:choice(list)
  if #list == 0 then return nil end
  return list[self:int(#list)]
end

function R:state() return { u32(self.s0), u32(self.s1), u32(self.s2), u32(self.s3) } end

function R:set_state(s)
  if type(s) ~= "table" or #s ~= 4 then error("rng:set_state: expected 4 integers", 2) end
  for i = 1, 4 do
    if type(s[i]) ~= "number" or s[i] < 0 or s[i] >= 4294967296 or s[i] ~= math.floor(s[i]) then
      error("rng:set_state: word " .. i .. " is not an unsigned 32-bit integer", 2)
    end
  end
  self.s0, self.s1, self.s2, self.s3 = tobit(s[1]), tobit(s[2]), tobit(s[3]), tobit(s[4])
  return self
end

function M.from_state(s) return setmetatable({}, R):set_state(s) end

-- An independent stream derived from this one (for per-sample generators).
function R:fork() return M.new(self:next32() * 4294967296 + self:next32()) end

M.Rng = R
return M
