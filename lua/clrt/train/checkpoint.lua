-- clrt.train.checkpoint — a run folder's checkpoints, the one implementation both recipes use.
--   checkpoint.save(run_dir, {step =, model =, tokenizer_dir =, optimizer =, state = {...}, base =,
--                             value_head = (PPO's, optional), keep = 2})
--   local dir, state = checkpoint.find(run_dir)   -- the latest checkpoint that verifies, or nil
--   local ok, why = checkpoint.verify(dir)
-- Layout: RUN_DIR/checkpoint-<step>/ (config.json, model.safetensors, the tokenizer files,
-- optimizer.safetensors, value_head.safetensors under PPO, trainer_state.json, manifest.json)
-- and RUN_DIR/latest, a one-line file naming the current one. A model with LoRA adapters saves
-- its adapter instead (adapter_config.json + adapter_model.safetensors, PEFT's format,
-- base_model_name_or_path = c.base). A save writes checkpoint-<step>/ file by file, each
-- fsynced, trainer_state.json, then manifest.json last (every file's size); reads the folder
-- back (verify: every file present at its size and parseable); then replaces `latest` by
-- rename(2); only then removes checkpoints beyond the newest `keep` (save_keep, default 2) that
-- verify. So a kill part-way leaves at most a half-written folder that find() skips, and a file
-- damaged later in the newest checkpoint still leaves the one before it to resume from.
local files = require("clrt.files")
local json = require("clrt.json")
local M = {}

M.TOKENIZER_FILES = { "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
  "chat_template.jinja", "generation_config.json" }
M.MANIFEST = "manifest.json"
M.FORMAT = 2   -- trainer_state.format: a checkpoint of this format is complete only with its manifest

local function name_of(step) return ("checkpoint-%d"):format(step) end

local read = files.read

-- The folder name `latest` points to, or nil.
local function latest_name(run_dir)
  local s = read(run_dir .. "/latest")
  return s and s:match("^%s*(checkpoint%-%d+)%s*$") or nil
end

-- trainer_state.json decoded, or nil and why not.
local function state_of(dir)
  local s = read(dir .. "/trainer_state.json")
  if not s then return nil, "trainer_state.json is missing" end
  local ok, st = pcall(json.decode, s)
  if not ok then return nil, "trainer_state.json is not JSON (" .. (#s == 0 and "empty" or tostring(st):gsub("^[^\n]-%.lua:%d+: ", "")) .. ")" end
  if type(st) ~= "table" or type(st.step) ~= "number" then return nil, "trainer_state.json has no step" end
  return st
end

-- Whether a file of a checkpoint parses as what its name says: JSON files decode, safetensors
-- files open (header, offsets and sizes checked). Returns true or nil, why.
local function parses(dir, name)
  local path = dir .. "/" .. name
  if name:match("%.json$") then
    local ok, err = pcall(json.decode, read(path) or "")
    if not ok then return nil, name .. " is not JSON (" .. tostring(err):gsub("^[^\n]-%.lua:%d+: ", "") .. ")" end
  elseif name:match("%.safetensors$") then
    local ok, err = pcall(require("clrt.safetensors").info, path)
    if not ok then return nil, name .. ": " .. tostring(err):gsub("^[^\n]-%.lua:%d+: ", "") end
  end
  return true
end

-- A checkpoint folder verifies when its trainer state parses and, for one written with a
-- manifest, every file the manifest lists is there at its recorded size and parses. One from
-- an older clrt (no manifest, no format) verifies when every file in it parses. Returns the
-- trainer state or nil, why.
function M.verify(dir)
  if not files.is_dir(dir) then return nil, "not a folder" end
  local st, why = state_of(dir)
  if not st then return nil, why end
  local text = read(dir .. "/" .. M.MANIFEST)
  local names = {}
  if text then
    local ok, man = pcall(json.decode, text)
    if not ok or type(man) ~= "table" or type(man.files) ~= "table" then return nil, M.MANIFEST .. " is not a manifest" end
    for name, size in pairs(man.files) do
      local have = files.size(dir .. "/" .. name)
      if not have then return nil, name .. " is missing" end
      if have ~= size then return nil, ("%s is %d bytes, the manifest says %d"):format(name, have, size) end
      names[#names + 1] = name
    end
  elseif (st.format or 0) >= M.FORMAT then
    return nil, M.MANIFEST .. " is missing (the save did not finish)"
  else
    for _, n in ipairs(files.list(dir)) do names[#names + 1] = n end
  end
  table.sort(names)
  for _, name in ipairs(names) do
    local ok, bad = parses(dir, name)
    if not ok then return nil, bad end
  end
  return st
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
  if not ok then error("checkpoint: " .. tostring(err):gsub("^[^:\n]*%.lua:%d+: ", ""):gsub("^checkpoint: ", ""), 0) end
  return err
end

-- The step of every checkpoint folder in run_dir, newest first: {{name =, step =}}.
local function checkpoints(run_dir)
  local out = {}
  if not files.is_dir(run_dir) then return out end
  for _, n in ipairs(files.list(run_dir)) do
    local step = n:match("^checkpoint%-(%d+)$")
    if step then out[#out + 1] = { name = n, step = tonumber(step) }
    elseif n == "checkpoint" then out[#out + 1] = { name = n, step = -1 } end   -- an older clrt's single one
  end
  table.sort(out, function(a, b) return a.step > b.step end)
  return out
end

function M._save(run_dir, c)
  assert(type(c.step) == "number", "checkpoint.save: step")
  local keep = c.keep or 2
  if type(keep) ~= "number" or keep < 1 or keep ~= math.floor(keep) then
    error(("save_keep must be a positive integer (got %s)"):format(tostring(keep)), 2)
  end
  local name = name_of(c.step)
  local dir = run_dir .. "/" .. name
  if latest_name(run_dir) == name and M.verify(dir) then
    error(("checkpoint: %s is the latest checkpoint; it is not overwritten"):format(dir), 2)
  end
  files.remove_tree(dir)   -- a half-written or damaged one of this step
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
  state.step, state.format = c.step, M.FORMAT
  files.write_atomic(dir .. "/trainer_state.json", json.encode(state) .. "\n")
  -- the manifest last: its presence says every file before it was written whole
  local sizes = {}
  for _, n in ipairs(files.list(dir)) do
    if n ~= M.MANIFEST and not n:match("%.tmp%.%d+$") then sizes[n] = files.size(dir .. "/" .. n) end
  end
  files.write_atomic(dir .. "/" .. M.MANIFEST, json.encode({ files = sizes }) .. "\n")
  files.fsync(dir)
  local verified, why = M.verify(dir)
  if not verified then error(("checkpoint: %s does not verify after saving: %s"):format(dir, why), 2) end
  files.write_atomic(run_dir .. "/latest", name .. "\n")
  files.fsync(run_dir)
  -- the new one is complete, verified and current: keep the newest `keep` that verify, drop
  -- the rest (and any half-written or damaged one)
  local kept = 0
  for _, ck in ipairs(checkpoints(run_dir)) do
    local good = ck.name == name or (kept < keep and M.verify(run_dir .. "/" .. ck.name))
    if good and kept < keep then kept = kept + 1 else files.remove_tree(run_dir .. "/" .. ck.name) end
  end
  return dir
end

-- Temporary files of atomic writes (NAME.tmp.PID) that a killed process left in run_dir and
-- its checkpoint folders; this process's own are being written and stay.
local function remove_stale_temporaries(run_dir)
  local ffi = require("ffi")
  pcall(ffi.cdef, "int getpid(void);")   -- another module may have declared it already
  local mine = ".tmp." .. tostring(ffi.C.getpid())
  local function sweep(dir)
    for _, n in ipairs(files.list(dir)) do
      if n:match("%.tmp%.%d+$") and n:sub(-#mine) ~= mine then pcall(files.remove_tree, dir .. "/" .. n) end
    end
  end
  sweep(run_dir)
  for _, ck in ipairs(checkpoints(run_dir)) do
    if files.is_dir(run_dir .. "/" .. ck.name) then sweep(run_dir .. "/" .. ck.name) end
  end
end

-- The latest checkpoint of a run folder that verifies: its folder and trainer state, or nil
-- when the folder has none at all. Newer ones that do not verify are named on stderr with the
-- reason; when some exist and none verifies, that is an error (never a silent restart).
function M.find(run_dir, opts)
  local dir, st = M._find(run_dir, opts)
  -- data-parallel ranks must all resume from the same step; one that sees another folder
  -- (no shared file system) would otherwise wait forever in a collective the others skip
  require("clrt.dist").agree(st and st.step or -1, "the step to resume " .. run_dir .. " from (is the run folder on a file system every rank shares?)")
  return dir, st
end

function M._find(run_dir, opts)
  opts = opts or {}
  local warn = opts.warn or function(line) io.stderr:write(line, "\n") end
  if not files.is_dir(run_dir) then return nil, nil end
  if require("clrt.dist").is_main() then remove_stale_temporaries(run_dir) end
  local skipped = {}
  for _, ck in ipairs(checkpoints(run_dir)) do
    local dir = run_dir .. "/" .. ck.name
    local st, why = M.verify(dir)
    if st then
      for _, s in ipairs(skipped) do
        warn(("checkpoint: skipped %s (%s); resuming from %s"):format(s.dir, s.why, dir))
      end
      return dir, st
    end
    skipped[#skipped + 1] = { dir = dir, why = why }
  end
  if #skipped > 0 then
    local parts = {}
    for _, s in ipairs(skipped) do parts[#parts + 1] = s.dir .. ": " .. s.why end
    error("checkpoint: no checkpoint in " .. run_dir .. " verifies, so the run cannot resume: " .. table.concat(parts, "; "), 0)
  end
  return nil, nil
end

return M
