-- clrt.generation_config — a model folder's generation_config.json, read as transformers'
-- generate reads it: every id of eos_token_id ends a sequence (Llama 3.1 Instruct lists
-- <|end_of_text|>, <|eom_id|> and <|eot_id|>; Qwen2.5 Instruct <|im_end|> and <|endoftext|>),
-- and its sampling settings are the defaults of a generation whose caller gives none:
-- do_sample true samples at its temperature, top_p and top_k (transformers' own defaults
-- 1.0, 1.0 and 50 where the file has none), do_sample false or absent decodes greedily.
--   local gc = clrt.generation_config.read(dir)   -- nil when the folder has no such file
--   gc.eos_ids, gc.defaults = {temperature =, top_p =, top_k =}, gc.path
-- clrt.model.load and clrt.tokenizer.load keep it as m.generation_config and
-- tok.generation_config; clrt.chat.stop_ids, m:generate, m:chat, clrt chat and clrt serve read
-- it from there. Keys transformers has and clrt does not run (repetition_penalty, ...) are
-- listed in gc.ignored.
local json = require("clrt.json")
local files = require("clrt.files")

local M = {}

-- What clrt's generation has no counterpart for; a file setting them is told in gc.ignored.
local UNRUN = { "repetition_penalty", "no_repeat_ngram_size", "num_beams", "min_p", "typical_p",
  "length_penalty", "min_new_tokens", "min_length", "diversity_penalty", "epsilon_cutoff", "eta_cutoff" }
local NEUTRAL = { repetition_penalty = 1, num_beams = 1, length_penalty = 1, no_repeat_ngram_size = 0,
  min_new_tokens = 0, min_length = 0, diversity_penalty = 0, typical_p = 1, min_p = 0, epsilon_cutoff = 0, eta_cutoff = 0 }

local function is_null(v) return v == nil or v == json.null end

-- M.parse(t, where) -> gc from a decoded generation_config.json (errors name where and key).
function M.parse(t, where)
  local function bad(key, msg) error(("%s: key '%s' %s"):format(where, key, msg), 0) end
  if type(t) ~= "table" then error(where .. ": expected a JSON object", 0) end
  local gc = { path = where, eos_ids = {}, ignored = {} }
  local eos = t.eos_token_id
  if not is_null(eos) then
    if type(eos) ~= "table" then eos = { eos } end
    for i, id in ipairs(eos) do
      if type(id) ~= "number" or id ~= math.floor(id) or id < 0 then
        bad("eos_token_id", ("entry %d must be a token id (a non-negative integer), got %s"):format(i, tostring(id)))
      end
      gc.eos_ids[#gc.eos_ids + 1] = id
    end
  end
  local function num(key, lo, hi)
    local v = t[key]
    if is_null(v) then return nil end
    if type(v) ~= "number" or v < lo or v > hi then bad(key, ("must be a number in [%g, %g], got %s"):format(lo, hi, tostring(v))) end
    return v
  end
  local ds = t.do_sample
  if not is_null(ds) and type(ds) ~= "boolean" then bad("do_sample", "must be true or false") end
  local temperature, top_p, top_k = num("temperature", 0, 100), num("top_p", 0, 1), num("top_k", 0, 1e9)
  if top_p == 0 then bad("top_p", "must be in (0, 1]") end
  if ds == true then
    gc.defaults = { temperature = temperature or 1.0, top_p = top_p or 1.0, top_k = top_k and math.floor(top_k) or 50 }
  else
    gc.defaults = { temperature = 0 }   -- transformers: greedy unless do_sample
  end
  for _, k in ipairs(UNRUN) do
    if not is_null(t[k]) and t[k] ~= NEUTRAL[k] then gc.ignored[#gc.ignored + 1] = k end
  end
  return gc
end

-- M.read(dir) -> gc, or nil when dir has no generation_config.json.
function M.read(dir)
  local path = dir .. "/generation_config.json"
  local text = files.read(path)
  if not text then return nil end
  local okj, t = pcall(json.decode, text)
  if not okj then error(("%s: not valid JSON: %s"):format(path, tostring(t)), 0) end
  return M.parse(t, path)
end

-- opts with gc's defaults where opts has no temperature, top_p or top_k (a copy; opts as given
-- when there is no gc).
function M.apply_defaults(gc, opts)
  if not gc or not gc.defaults then return opts end
  local o = {}
  for k, v in pairs(opts or {}) do o[k] = v end
  for k, v in pairs(gc.defaults) do
    if o[k] == nil then o[k] = v end
  end
  return o
end

-- The ids that end a generation: gc's eos ids (none without gc).
function M.stop_ids(gc)
  local out = {}
  for i, id in ipairs(gc and gc.eos_ids or {}) do out[i] = id end
  return out
end

return M
