-- clrt.train.tasks — single-turn tasks for recipes/build_dataset.lua (the authors' data
-- engine): a JSONL file, one task a line, read into the samples the simulated user and the
-- metrics understand. Four formats, told apart per row by their fields (format=auto) or
-- named (format=tasks|math|bigcodebench|document):
--   tasks         {"task": the whole request, "reference": its answer, "metadata": {...}
--                  (optional), "task_type": a key of task_types or its task_desc (optional
--                  when the run gives task_type=)}
--   math          MATH as `datasets` exports it: {"problem", "solution", "level", "type"}
--                  (level and type go into the metadata); question answering
--   bigcodebench  BigCodeBench: {"task_id", "instruct_prompt", "canonical_solution",
--                  "code_prompt" (optional), "test", "entry_point", "libs"}; the reference is
--                  code_prompt .. canonical_solution (the authors' single_turn_ds does the
--                  same), the metadata {task_id, entry_point, test, libs,
--                  extraction_requirement} (what pass_rate reads); code generation
--   document      a document-editing set: {"request", "target", "metadata" (optional)};
--                  document editing
-- A row that is not JSON, lacks its task or reference, or names an unknown task type is one
-- line naming the file, line and field, counted and skipped; more than max_bad_rows of them
-- stop the read with one line.
--   local samples, bad = tasks.read(path, {format =, task_type =, types =, max_bad_rows =, warn =})
-- types: {name = {task_desc =}} (the recipe's task_types). Each sample: {id = the line
-- number (the conversation's conv_id), task_type, task_desc, prompt = {} (the chat starts
-- empty: the user opens it), single_turn_prompt, ground_truth, single_turn_metadata}.
local data = require("clrt.data")
local json = require("clrt.json")
local M = {}

M.FORMATS = { "auto", "tasks", "math", "bigcodebench", "document" }

-- The field that tells each format apart (format=auto), in the order they are tried.
local MARK = { { "task", "tasks" }, { "problem", "math" }, { "instruct_prompt", "bigcodebench" }, { "request", "document" } }
-- The task type each published format belongs to.
local FORMAT_TYPE = { math = "qa", bigcodebench = "code", document = "document" }

local function nonempty(v) return type(v) == "string" and v:find("%S") ~= nil end

-- The task type a row's value names: a key of types, or the task_desc of one.
local function type_of(value, types)
  if types[value] then return value end
  for name, t in pairs(types) do if t.task_desc == value then return name end end
  return nil
end

local function known_types(types)
  local names = {}
  for name in pairs(types) do names[#names + 1] = name end
  table.sort(names)
  return table.concat(names, ", ")
end

-- One row -> (task, reference, metadata, type name) or nil, the field at fault, why.
local function fields(row, format, o)
  if type(row) ~= "table" or row[1] ~= nil then return nil, "(row)", "not a JSON object" end
  if format == "auto" then
    for _, m in ipairs(MARK) do if row[m[1]] ~= nil then format = m[2] break end end
    if format == "auto" then return nil, "task", "no task (a task, problem, instruct_prompt or request field)" end
  end
  local meta = row.metadata
  if meta == json.null then meta = nil end
  if meta ~= nil and (type(meta) ~= "table" or meta[1] ~= nil) then return nil, "metadata", "must be an object" end
  local task, ref, kind
  if format == "tasks" then
    task, ref = row.task, row.reference
    if not nonempty(task) then return nil, "task", "must be a non-empty string" end
    if not nonempty(ref) then return nil, "reference", "missing or empty (the reference answer the metrics compare with)" end
    local named = row.task_type
    if named == nil or named == json.null then named = o.task_type end
    if named == nil then return nil, "task_type", "missing (or give task_type= for every row; known: " .. known_types(o.types) .. ")" end
    kind = type_of(named, o.types)
    if not kind then
      return nil, "task_type", ("unknown task type %s (known: %s)"):format(json.encode(named), known_types(o.types))
    end
    return task, ref, meta or {}, kind
  elseif format == "math" then
    if not nonempty(row.problem) then return nil, "problem", "must be a non-empty string" end
    if not nonempty(row.solution) then return nil, "solution", "missing or empty (the reference solution)" end
    meta = meta or {}
    meta.level, meta.type = row.level, row.type
    return row.problem, row.solution, meta, FORMAT_TYPE.math
  elseif format == "bigcodebench" then
    for _, k in ipairs({ "instruct_prompt", "canonical_solution", "test", "entry_point" }) do
      if not nonempty(row[k]) then return nil, k, "must be a non-empty string" end
    end
    local code_prompt = nonempty(row.code_prompt) and row.code_prompt or ""
    meta = meta or {}
    meta.task_id, meta.entry_point, meta.test, meta.libs = row.task_id, row.entry_point, row.test, row.libs
    if code_prompt ~= "" then
      meta.extraction_requirement = "The extracted code must run as it is, with no further processing, and start "
        .. "with this code:\n\n" .. code_prompt
    end
    return row.instruct_prompt, code_prompt .. row.canonical_solution, meta, FORMAT_TYPE.bigcodebench
  elseif format == "document" then
    if not nonempty(row.request) then return nil, "request", "must be a non-empty string" end
    if not nonempty(row.target) then return nil, "target", "missing or empty (the reference document)" end
    return row.request, row.target, meta or {}, FORMAT_TYPE.document
  end
  error("clrt.train.tasks: format must be one of " .. table.concat(M.FORMATS, ", ") .. ", got " .. tostring(format), 0)
end

function M.read(path, o)
  o = o or {}
  local who = o.who or "clrt.train.tasks"
  local format = o.format or "auto"
  local warn = o.warn or function(line) io.stderr:write(line, "\n") end
  local ok_fmt = false
  for _, f in ipairs(M.FORMATS) do ok_fmt = ok_fmt or f == format end
  if not ok_fmt then error(("%s: format must be one of %s, got %s"):format(who, table.concat(M.FORMATS, ", "), tostring(format)), 0) end
  local f, err = io.open(path, "rb")
  if not f then error(("%s: cannot read input=%s: %s"):format(who, path, tostring(err)), 0) end
  local samples, bad, n = {}, 0, 0
  local max_bad = o.max_bad_rows or 0
  for line in f:lines() do
    n = n + 1
    if n == 1 and line:sub(1, 3) == "\239\187\191" then line = line:sub(4) end
    if line:sub(-1) == "\r" then line = line:sub(1, -2) end
    if line:find("%S") then
      local ok, row = pcall(json.decode, (data.fix_utf8(line)))
      local task, ref, meta, kind
      if ok then task, ref, meta, kind = fields(row, format, o) else task, ref, meta = nil, "(line)", "not JSON" end
      if task == nil then
        bad = bad + 1
        warn(("%s: %s:%d: %s: %s, skipped"):format(who, path, n, ref, meta))
        if bad > max_bad then
          f:close()
          error(("%s: %s: more than max_bad_rows=%d bad rows (the last at line %d); fix them or raise max_bad_rows")
            :format(who, path, max_bad, n), 0)
        end
      else
        samples[#samples + 1] = { id = n, task_type = kind, task_desc = o.types[kind].task_desc, prompt = {},
          single_turn_prompt = task, ground_truth = ref, single_turn_metadata = meta }
      end
    end
  end
  f:close()
  if #samples == 0 then error(("%s: %s has no task to build from (%d bad rows)"):format(who, path, bad), 0) end
  return samples, bad
end

-- The built-in world's single-turn tasks (examples/collab_world, passed in by the recipe):
-- its training requests, half under-specified; the scripted user opens with the world's
-- phrasing and knows the hidden fact, which single_turn_metadata carries (so process_dataset's
-- rows keep it for the scripted user of a later run).
function M.world(world, n, seed)
  local out = {}
  for i, s in ipairs(world.rl_prompts(n, seed, { system = false })) do
    local meta = { task = s.task, slot = s.slot, value = s.value, ask = s.ask, slot_keywords = s.slot_keywords,
      underspecified = s.underspecified, opening = s.prompt[#s.prompt].content }
    out[i] = { id = i, task_type = "world", task_desc = s.task_desc, prompt = {}, single_turn_prompt = s.single_turn_prompt,
      ground_truth = s.ground_truth, single_turn_metadata = meta }
  end
  return out
end

return M
