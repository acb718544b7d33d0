-- clrt.api.reply_cache — replies to deterministic chat requests on disk, content-addressed.
--   local cache = reply_cache.open(dir)
--   local key = cache:key(base_url, model, body)      -- body: the request table as sent
--   local text = cache:get(key)                        -- the stored response body, or nil
--   cache:put(key, response_body_text)
-- The key is the endpoint's base URL, the model and the full request body (every field but
-- the model, written with sorted keys, so the same request gives the same key in every
-- process); an entry is DIR/<first two hex digits>/<SHA-256 of the key>.json holding the key
-- text itself and the response body. A read compares the stored key text with the request's
-- (a hash collision or a foreign file is a miss), and an entry that is not JSON of that shape
-- (cut off by a crash, edited by hand) is a miss too, never an error; it is counted in
-- cache.corrupt and overwritten by the next put. Writes go through clrt.files.write_atomic
-- (temp file, fsync, rename), so several runs can share one folder: a reader sees a whole
-- entry or none.
local files = require("clrt.files")
local json = require("clrt.json")
local sha256 = require("clrt.util.sha256")
local M = {}
local Cache = {}
Cache.__index = Cache

function M.open(dir)
  if type(dir) ~= "string" or dir == "" then error("reply cache: a folder is needed (judge.cache_dir)", 2) end
  return setmetatable({ dir = dir:gsub("/+$", ""), hits = 0, misses = 0, corrupt = 0, made = false }, Cache)
end

local function key_text(base_url, model, body)
  local rest = {}
  for k, v in pairs(body) do if k ~= "model" then rest[k] = v end end
  return ("clrt reply cache 1\nbase_url %s\nmodel %s\nbody %s"):format(base_url, tostring(model), json.encode(rest))
end

function Cache:key(base_url, model, body)
  local text = key_text(base_url, model, body)
  return { text = text, hash = sha256(text) }
end

function Cache:path(key) return ("%s/%s/%s.json"):format(self.dir, key.hash:sub(1, 2), key.hash) end

function Cache:get(key)
  local raw = files.read(self:path(key))
  if raw == nil then return nil end
  local ok, entry = pcall(json.decode, raw)
  if not ok or type(entry) ~= "table" or type(entry.response) ~= "string" or type(entry.key) ~= "string" then
    self.corrupt = self.corrupt + 1
    return nil
  end
  if entry.key ~= key.text then return nil end
  return entry.response
end

function Cache:put(key, response_text)
  local path = self:path(key)
  files.mkdir_p(path:match("^(.*)/[^/]+$"))
  files.write_atomic(path, json.encode({ key = key.text, response = response_text }) .. "\n")
end

return M
