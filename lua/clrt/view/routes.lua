-- clrt.view.routes — what `clrt view` answers: the page, and read-only JSON over one or two
-- run folders. route(runs, method, path) -> status, body, content type; no I/O but reading
-- the runs' own files, so it is tested without a socket.
--   GET /                         the page (lua/clrt/view/page.html)
--   GET /api/runs                 [{index, name, files = {name = bytes}}]
--   GET /api/run/I/metrics        metrics.jsonl's rows, as one JSON array
--   GET /api/run/I/summary        summary.json (the before/after evaluation), null if none
--   GET /api/run/I/config         config.json
--   GET /api/run/I/api_usage      api_usage.json (the API bill: the run's tokens and dollars)
--   GET /api/run/I/steps          rollouts.jsonl's step records and system prompts
--   GET /api/run/I/rollouts/S     rollouts.jsonl's prompt records of step S
-- Why it is safe to point at: a request names a run by its index and a file by a fixed word,
-- never by a path, so nothing outside the run folders' known files can be read (no "..",
-- no percent-decoding tricks: the request path only ever selects from the table below);
-- every file is read only up to a size cap (a 413 names the file past it); only GET.
local json = require("clrt.json")
local M = {}

-- Largest file served whole, and largest rollouts.jsonl scanned for one step (bytes).
M.MAX_FILE = 64 * 1024 * 1024
M.MAX_ROLLOUTS = 512 * 1024 * 1024

M.FILES = { metrics = "metrics.jsonl", summary = "summary.json", config = "config.json",
  api_usage = "api_usage.json", rollouts = "rollouts.jsonl" }

local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
M.PAGE = here .. "/page.html"

-- The page's text, read once.
local page
local function page_text()
  if not page then
    local f = io.open(M.PAGE, "rb")
    if not f then error("clrt view: the page is missing: " .. M.PAGE, 0) end
    page = f:read("*a")
    f:close()
  end
  return page
end

local size_of = require("clrt.files").size

local function err(status, msg) return status, json.encode({ error = msg }), "application/json" end

-- A run's file read whole, or nil when absent; raises {status, message} past the cap.
local function read_capped(run, word, cap)
  local path = run.dir .. "/" .. M.FILES[word]
  local n = size_of(path)
  if not n then return nil end
  if n > cap then error({ 413, ("%s is %d bytes, more than clrt view reads (%d)"):format(M.FILES[word], n, cap) }, 0) end
  local f = io.open(path, "rb")
  local text = f:read("*a")
  f:close()
  return text
end

-- Each non-empty line of a JSON-lines file decoded; a line that does not parse (a run still
-- writing it) is skipped. keep(row) -> true keeps a row (nil: all).
local function jsonl(run, word, cap, keep)
  local text = read_capped(run, word, cap)
  local out = json.array()
  if not text then return out end
  for line in text:gmatch("[^\n]+") do
    local ok, row = pcall(json.decode, line)
    if ok and type(row) == "table" and (not keep or keep(row)) then out[#out + 1] = row end
  end
  return out
end

-- A JSON file's text as it is (validated), or "null" when absent.
local function json_file(run, word)
  local text = read_capped(run, word, M.MAX_FILE)
  if not text then return "null" end
  local ok = pcall(json.decode, text)
  if not ok then error({ 500, M.FILES[word] .. " is not valid JSON" }, 0) end
  return text
end

local function runs_list(runs)
  local out = json.array()
  for i, r in ipairs(runs) do
    local files = json.object()
    for _, name in pairs(M.FILES) do files[name] = size_of(r.dir .. "/" .. name) end
    out[i] = { index = i, name = r.name, files = files }
  end
  return out
end

local function run_route(run, what, arg)
  if what == "metrics" and not arg then
    return json.encode(jsonl(run, "metrics", M.MAX_FILE))
  elseif (what == "summary" or what == "config" or what == "api_usage") and not arg then
    return json_file(run, what)
  elseif what == "steps" and not arg then
    local rows = jsonl(run, "rollouts", M.MAX_ROLLOUTS, function(r) return r.type == "step" or r.type == "system_prompt" end)
    local steps, prompts = json.array(), json.object()
    for _, r in ipairs(rows) do
      if r.type == "step" then steps[#steps + 1] = r else prompts[tostring(r.hash)] = r.text end
    end
    return json.encode({ steps = steps, system_prompts = prompts })
  elseif what == "rollouts" and arg then
    local step = tonumber(arg)
    return json.encode(jsonl(run, "rollouts", M.MAX_ROLLOUTS, function(r) return r.type == "prompt" and r.step == step end))
  end
  return nil
end

-- runs: {{dir =, name =}}. Returns status, body, content type.
function M.route(runs, method, path)
  if method ~= "GET" and method ~= "HEAD" then return err(405, "clrt view is read-only: use GET") end
  if path == "/" or path == "/index.html" then return 200, page_text(), "text/html; charset=utf-8" end
  if path == "/favicon.ico" then return 204, "", "image/x-icon" end   -- browsers ask; there is none
  if path == "/api/runs" then return 200, json.encode(runs_list(runs)), "application/json" end
  -- /api/run/<index>/<word>[/<step>]: digits and fixed words only
  local i, what, arg = path:match("^/api/run/(%d+)/(%a[%a_]*)/?(%d*)$")
  if not i then return err(404, "no such page: " .. path:sub(1, 200)) end
  local run = runs[tonumber(i)]
  if not run then return err(404, ("no run %s (this view has %d)"):format(i, #runs)) end
  local ok, body = pcall(run_route, run, what, arg ~= "" and arg or nil)
  if not ok then
    if type(body) == "table" then return err(body[1], body[2]) end
    return err(500, tostring(body))
  end
  if body == nil then return err(404, "no such page: " .. path:sub(1, 200)) end
  return 200, body, "application/json"
end

-- A folder `clrt view` can show: it exists and holds a run's config.json or metrics.jsonl.
-- Returns {dir, name} or nil and one line saying what is wrong.
function M.open_run(dir)
  local files = require("clrt.files")
  dir = dir:gsub("/+$", "")
  if dir == "" then dir = "/" end
  if not files.exists(dir) then return nil, ("clrt view: %s does not exist"):format(dir) end
  if not files.is_dir(dir) then return nil, ("clrt view: %s is not a folder (give a run folder: runs/NAME-...)"):format(dir) end
  if not size_of(dir .. "/metrics.jsonl") and not size_of(dir .. "/config.json") then
    return nil, ("clrt view: %s is not a run folder (no metrics.jsonl or config.json in it)"):format(dir)
  end
  return { dir = dir, name = dir:match("([^/]+)$") or dir }
end

return M
