-- clrt.train.checkpoint — a run folder's checkpoints, the one implementation both recipes use.
--   checkpoint.save(run_dir, {step =, model =, tokenizer_dir =, optimizer =, state = {...}, base =,
--                             value_head = (PPO's, optional)})
--   local dir, state = checkpoint.find(run_dir)   -- the latest complete one, or nil
-- Layout: RUN_DIR/checkpoint-<step>/ (config.json, model.safetensors, the tokenizer files,
-- optimizer.safetensors, value_head.safetensors under PPO, trainer_state.json) and RUN_DIR/latest, a one-line file naming the
-- current one. A model with LoRA adapters saves its adapter instead (adapter_config.json +
-- adapter_model.safetensors, PEFT's format, base_model_name_or_path = c.base). A save writes checkpoint-<step>/ file by file, each fsynced, trainer_state.json
-- last; then replaces `latest` by rename(2); only then removes the older checkpoints. So at
-- every moment `latest` names a complete checkpoint (or there is none yet), and a kill or
-- Ctrl-C part-way leaves at most a half-written folder that find() ignores and the next save
-- of that step replaces.
local files = require("clrt.files")
local json = require("clrt.json")
local M = {}

M.TOKENIZER_FILES = { "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
  "chat_template.jinja", "generation_config.json" }

local function name_of(step) return ("checkpoint-%d"):format(step) end

local read = files.read

-- The folder name `latest` points to, or nil.
local function latest_name(run_dir)
  local s = read(run_dir .. "/latest")
  return s and s:match("^%s*(checkpoint%-%d+)%s*$") or nil
end

local function state_of(dir)
  local s = read(dir .. "/trainer_state.json")
  if not s then return nil end
  local ok, st = pcall(json.decode, s)
  if ok and type(st) == "table" and type(st.step) == "number" then return st end
  return nil
end

-- A failed step (a full disk) is one line naming the file, without a Lua position.
function M.save(run_dir, c)
  -- every rank holds the same parameters, and, once gathered, the same optimizer state:
  -- rank 0 writes them
  local opt = c.optimizer
  if opt and opt.gather_state then opt:gather_state() end
  local ok, err = true, nil
  if require("clrt.dist").is_main() then ok, err = pcall(M._save, run_dir, c) end
  if opt and opt.release_gathered then opt:release_gathered() end   -- each rank back to its slice
  if not ok then error("checkpoint: " .. tostring(err):gsub("^[^:\n]*%.lua:%d+: ", ""), 0) end
  return err
end

function M._save(run_dir, c)
  assert(type(c.step) == "number", "checkpoint.save: step")
  local name = name_of(c.step)
  local dir = run_dir .. "/" .. name
  if latest_name(run_dir) == name then
    error(("checkpoint: %s is the latest checkpoint; it is not overwritten"):format(dir), 2)
  end
  files.remove_tree(dir)   -- a half-written one from an interrupted save of this step
  files.mkdir_p(dir)
  if c.model.lora then c.model:save_adapter(dir, { base = c.base }) else c.model:save(dir) end
  if c.tokenizer_dir then
    for _, f in ipairs(M.TOKENIZER_FILES) do
      local src = c.tokenizer_dir .. "/" .. f
      if files.exists(src) then files.copy(src, dir .. "/" .. f) end
    end
  end
  if c.optimizer then c.optimizer:save(dir .. "/optimizer.safetensors") end
  if c.value_head then c.value_head:save(dir .. "/value_head.safetensors") end   -- train.algorithm=ppo
  local state = {}
  for k, v in pairs(c.state or {}) do state[k] = v end
  state.step = c.step
  files.write_atomic(dir .. "/trainer_state.json", require("clrt.json").encode(state) .. "\n")
  files.fsync(dir)
  files.write_atomic(run_dir .. "/latest", name .. "\n")
  files.fsync(run_dir)
  -- the new one is complete and current: the older ones (and any half-written) can go
  for _, n in ipairs(files.list(run_dir)) do
    if n ~= name and (n:match("^checkpoint%-%d+$") or n == "checkpoint") then files.remove_tree(run_dir .. "/" .. n) end
  end
  return dir
end

-- The latest complete checkpoint of a run folder: its folder and trainer state, or nil when
-- there is none. `latest` decides; without it (a run stopped before its first save, or a
-- folder from an older clrt with a single checkpoint/) the complete one with the highest step.
function M.find(run_dir)
  local dir, st = M._find(run_dir)
  -- data-parallel ranks must all resume from the same step; one that sees another folder
  -- (no shared file system) would otherwise wait forever in a collective the others skip
  require("clrt.dist").agree(st and st.step or -1, "the step to resume " .. run_dir .. " from (is the run folder on a file system every rank shares?)")
  return dir, st
end

function M._find(run_dir)
  local name = latest_name(run_dir)
  if name then
    local st = state_of(run_dir .. "/" .. name)
    if st then return run_dir .. "/" .. name, st end
  end
  local best, best_state
  if files.is_dir(run_dir) then
    for _, n in ipairs(files.list(run_dir)) do
      if n:match("^checkpoint%-%d+$") or n == "checkpoint" then
        local st = state_of(run_dir .. "/" .. n)
        if st and (not best_state or st.step > best_state.step) then best, best_state = run_dir .. "/" .. n, st end
      end
    end
  end
  return best, best_state
end

return M
