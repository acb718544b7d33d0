-- clrt.model_path — what a model= argument (or clrt chat/serve/merge's MODEL_DIR) names, as
-- the folders to load: a model folder (config.json), a checkpoint folder of a run (a full
-- model, or a LoRA adapter over the base its adapter_config.json names), or a run folder
-- (its latest complete checkpoint). Every place that reads a model takes it through here, so
-- `model=runs/collabllm_rl-.../` works wherever a model folder does.
--
--   local r = model_path.resolve("runs/collabllm_rl-20261202-1", { who = "collabllm_eval" })
--   -- (a finished SFT run: its model/ folder)
--   -- r.model: the folder with config.json; r.adapter: a PEFT folder over it, or nil;
--   -- r.tokenizer: the folder with the tokenizer; r.checkpoint: the checkpoint used, or nil
local files = require("clrt.files")
local json = require("clrt.json")

local M = {}

local function has(dir, name) return files.exists(dir .. "/" .. name) end

local TOKENIZER_MARKS = { "tokenizer.json", "tokenizer.model", "tokenizer_config.json" }

local function tokenizer_dir(first, second)
  for _, n in ipairs(TOKENIZER_MARKS) do
    if has(first, n) then return first end
  end
  return second or first
end

-- A LoRA checkpoint: the base it names, which must still be there.
local function adapter_base(dir, who, base_override)
  if base_override then return base_override end
  local text = files.read(dir .. "/adapter_config.json")
  local ok, cfg = pcall(json.decode, text or "")
  if not ok or type(cfg) ~= "table" then
    error(("%s: %s/adapter_config.json is not valid JSON"):format(who, dir), 0)
  end
  local base = cfg.base_model_name_or_path
  if type(base) ~= "string" or base == "" then
    error(("%s: %s is a LoRA adapter that names no base (base_model_name_or_path): pass the base as model= and this folder as adapter="):format(who, dir), 0)
  end
  if not files.is_dir(base) or not has(base, "config.json") then
    error(("%s: %s is a LoRA adapter over %s, which is not a model folder here (no %s/config.json): pass the base as model= and this folder as adapter="):format(who, dir, base, base), 0)
  end
  return base
end

-- resolve(path, opts): opts.who names the caller in errors; opts.adapter: an adapter given
-- apart (adapter=), kept as it is. Errors are one line naming the path and what it lacks.
function M.resolve(path, opts)
  opts = opts or {}
  local who = opts.who or "model"
  if type(path) ~= "string" or path == "" then error(("%s: model= needs a folder"):format(who), 0) end
  if not files.is_dir(path) then
    error(("%s: model=%s: no such folder"):format(who, path), 0)
  end
  local dir, checkpoint = path, nil
  -- a run folder holds its training config as config.json too: its marks decide first
  local is_run = not has(path, "trainer_state.json") and (has(path, "latest") or has(path, "metrics.jsonl"))
  if is_run and has(path, "model/config.json") then
    -- a finished SFT run: its final model (the adapter already merged)
    dir = path .. "/model"
  elseif is_run or (not has(path, "config.json") and not has(path, "adapter_config.json")) then
    -- a run folder: its latest complete checkpoint
    local ckpt = require("clrt.train.checkpoint")._find(path)
    if not ckpt then
      if is_run then
        error(("%s: model=%s is a run folder with no complete checkpoint yet"):format(who, path), 0)
      end
      -- a folder of runs or models (runs/collab_world_sft, the warm starts by settings and
      -- seed): the one inside, or one line naming them
      local inside = M.models_inside(path)
      if #inside == 1 then return M.resolve(inside[1], opts) end
      if #inside > 1 then
        local shown = {}
        for i = 1, math.min(#inside, 4) do shown[i] = inside[i] end
        error(("%s: model=%s holds %d models or runs; name one: %s%s"):format(who, path, #inside,
          table.concat(shown, ", "), #inside > 4 and ", ..." or ""), 0)
      end
      error(("%s: model=%s is not a model folder (no config.json), a LoRA checkpoint (no adapter_config.json) or a run folder (no latest, no checkpoint-N/)"):format(who, path), 0)
    end
    dir, checkpoint = ckpt, ckpt
  elseif has(path, "trainer_state.json") then
    checkpoint = path
  end
  if has(dir, "config.json") then
    return { model = dir, adapter = opts.adapter, tokenizer = tokenizer_dir(dir), checkpoint = checkpoint }
  end
  if not has(dir, "adapter_config.json") then
    error(("%s: %s has neither config.json nor adapter_config.json"):format(who, dir), 0)
  end
  if opts.adapter then
    error(("%s: model=%s is itself a LoRA adapter; adapter=%s would be a second one"):format(who, path, opts.adapter), 0)
  end
  local base = adapter_base(dir, who, opts.base)
  return { model = base, adapter = dir, tokenizer = tokenizer_dir(dir, base), checkpoint = checkpoint }
end

-- The folders directly inside dir that model= could name (a model folder, a finished run with
-- model/, a run with a latest checkpoint), sorted.
function M.models_inside(dir)
  local out = {}
  for _, n in ipairs(files.list(dir)) do
    local sub = dir .. "/" .. n
    local model_folder = has(sub, "config.json") and not has(sub, "metrics.jsonl")   -- a run's config.json is its training config
    if files.is_dir(sub) and (model_folder or has(sub, "model/config.json") or has(sub, "latest")) then
      out[#out + 1] = sub
    end
  end
  table.sort(out)
  return out
end

-- A recipe's config: model= resolved in place (model= the folder with config.json, adapter=
-- the LoRA checkpoint it named, if any), so the run's config.json records what was loaded.
function M.apply(cfg, who)
  if cfg.model == nil then return cfg end
  local r = M.resolve(cfg.model, { who = who, adapter = cfg.adapter })
  cfg.model, cfg.adapter = r.model, r.adapter
  return cfg
end

return M
