-- clrt.log — the run logger every recipe uses.
--   local lg = clrt.log.run{root = "runs", name = "collabllm_rl", config = cfg, total_steps = 100,
--                           plot = {"reward", "kl"}, sample_every = 10}
--   lg:log(step, {reward = 0.4, kl = 0.001, ...})  -- metrics.jsonl + progress line (+ ETA)
--   if lg:sample_due(step) then lg:samples(step, items) end  -- samples.jsonl + samples.txt
--   lg:plot()                                      -- plot.svg (also every plot_every steps)
--   lg:close()                                     -- final plot, ends the progress line
-- A run folder holds config.json (the resolved config), metrics.jsonl (one JSON object per
-- step with every metric), samples.jsonl / samples.txt (conversations with their scores),
-- plot.svg (self-contained; opens in any browser), tb/events.out.tfevents.* (TensorBoard:
-- every numeric metric as a scalar, samples as markdown text; `tensorboard = false` turns
-- it off). `resume_step = s` reopens an existing folder and drops metric rows after step s,
-- so a resumed run rewrites them identically; TensorBoard gets a new events file that tells
-- it to drop the points after s.
local json = require("clrt.json")
local data = require("clrt.data")
local svg = require("clrt.plot")
local tensorboard = require("clrt.util.tensorboard")
local files = require("clrt.files")

local M = {}
local L = {}
L.__index = L

---------------------------------------------------------------- wall clock
local now
do
  -- libc's clock_gettime through a pointer of our own type: a script may have declared the
  -- function first with a timespec struct of its own (the FFI keeps the first declaration),
  -- and a call with ours would then fail, whichever of the two came first.
  local ok, ffi = pcall(require, "ffi")
  local ok2, clock_gettime = false, nil
  if ok and pcall(ffi.cdef, "typedef struct { long tv_sec; long tv_nsec; } clrt_log_timespec;") then
    pcall(ffi.cdef, "int clock_gettime(int clk, clrt_log_timespec *tp);")
    ok2, clock_gettime = pcall(function()
      return ffi.cast("int (*)(int, clrt_log_timespec *)", ffi.C.clock_gettime)
    end)
  end
  if ok2 then
    local ts = ffi.new("clrt_log_timespec")
    now = function()
      clock_gettime(1, ts) -- CLOCK_MONOTONIC
      return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
    end
    -- seconds since the epoch, for TensorBoard's wall_time
    M.wall_time = function()
      clock_gettime(0, ts) -- CLOCK_REALTIME
      return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
    end
  else
    now = os.time
  end
end
M.now = now
M.wall_time = M.wall_time or os.time

-- the terminal test and the duration format are clrt.progress's (one declaration of
-- isatty: a second ffi.cdef of it fails, and its pcall would leave the test always false)
local progress = require("clrt.progress")
local isatty = progress.isatty

---------------------------------------------------------------- helpers
M.format_duration = progress.format_duration

local function fmt(v)
  if type(v) ~= "number" then return tostring(v) end
  if v == math.floor(v) and math.abs(v) < 1e6 then return ("%d"):format(v) end
  local a = math.abs(v)
  if a ~= 0 and (a < 1e-3 or a >= 1e5) then return ("%.2e"):format(v) end
  return ("%.4g"):format(v)
end
M.fmt = fmt

---------------------------------------------------------------- the logger
-- opts: dir (exact folder) or root + name (folder root/name-YYYYmmdd-HHMMSS, made unique);
--   config (saved as config.json); total_steps (for the ETA); plot (keys to draw; default
--   every numeric key seen, up to 12); plot_every (steps between plot rewrites, 10);
--   sample_every (k: samples at step 1, every k steps and the last, 0 = never); progress_keys (keys on the
--   progress line; default the first 4 plot keys); quiet; out (stream, default io.stderr);
--   resume_step (reopen `dir`, keep metric rows with step <= resume_step); tensorboard
--   (false: no tb/ event files).
-- With several data-parallel ranks only rank 0 writes the run's files and prints; the others
-- get a logger whose methods do nothing (sample_due still answers, so control flow agrees).
local function rank_logger(opts)
  local quiet = { dir = opts.dir, sample_every = opts.sample_every or 0, total = opts.total_steps, rows = {} }
  return setmetatable(quiet, { __index = function(_, k)
    if k == "sample_due" then return L.sample_due end
    return function() end
  end })
end

function M.run(opts)
  opts = opts or {}
  if not require("clrt.dist").is_main() then return rank_logger(opts) end
  local self = setmetatable({}, L)
  local dir = opts.dir
  if not dir then
    local base = ("%s/%s-%s"):format(opts.root or "runs", opts.name or "run", os.date("%Y%m%d-%H%M%S"))
    dir = base
    local i = 2
    while files.exists(dir) do dir = base .. "-" .. i; i = i + 1 end
  end
  local ok, err = pcall(files.mkdir_p, dir)
  if not ok then error("log: " .. tostring(err), 2) end
  self.dir = dir
  self.total = opts.total_steps
  self.plot_keys = opts.plot
  self.plot_every = opts.plot_every or 10
  self.sample_every = opts.sample_every or 0
  self.progress_keys = opts.progress_keys
  self.quiet = opts.quiet
  self.out = opts.out or io.stderr
  self.tty = opts.tty
  if self.tty == nil then self.tty = (self.out == io.stderr) and isatty(2) or false end
  self.rows = {}
  self.t0 = now()
  self.steps_timed = 0
  self.metrics_path = dir .. "/metrics.jsonl"
  -- config.json first: a folder with anything else in it can be resumed
  if opts.config then self:save_config(opts.config) end
  if opts.resume_step ~= nil then
    self.rows = M.truncate_run(dir, opts.resume_step, function(msg) self.out:write("log: ", msg, "\n") end)
    -- time already spent, so the logged `time` keeps increasing
    self.time_offset = (#self.rows > 0 and self.rows[#self.rows].time) or 0
  else
    files.write_atomic(self.metrics_path, "")
    self.time_offset = 0
  end
  if opts.tensorboard ~= false then
    self.tb = tensorboard.create(dir .. "/tb", { clock = M.wall_time })
    if opts.resume_step ~= nil then self.tb:session_start(opts.resume_step + 1) end
  end
  -- one line per finished phase (rollouts, scoring, the update, validation) in phases.log
  local phases = dir .. "/phases.log"
  progress.set_log(function(line)
    pcall(files.append, phases, os.date("%H:%M:%S ") .. line .. "\n")
  end)
  self.phases_path = phases
  -- said at the start, so TensorBoard (or clrt view) can be pointed at a run still going
  if not self.quiet and opts.announce ~= false then
    self.out:write(("run folder: %s%s\n"):format(dir, self.tb and (" (tensorboard --logdir " .. dir .. "/tb)") or ""))
  end
  return self
end

function L:path(name) return self.dir .. "/" .. name end

-- Append to a run file; a failed write (a full disk) stops the run naming the file.
function L:append(name, text)
  local ok, err = pcall(files.append, self:path(name), text)
  if not ok then error("log: " .. tostring(err), 0) end
end

-- Reopen a run folder at step s: metrics.jsonl, samples.jsonl and rollouts.jsonl keep their rows with
-- step <= s, samples.txt its blocks up to step s, so a resumed run writes each step once.
-- A last line of metrics.jsonl cut off mid-write (a kill, a full disk) is dropped with a
-- warning; a bad line before it is an error naming file and line. Returns the kept rows.
function M.truncate_run(dir, s, warn)
  local function keep_jsonl(path, what)
    local f = io.open(path, "rb")
    if not f then return {} end
    local text = f:read("*a")
    f:close()
    local kept, out, n, lines = {}, {}, 0, {}
    for line in text:gmatch("([^\n]*)\n?") do lines[#lines + 1] = line end
    if lines[#lines] == "" then lines[#lines] = nil end
    for i, line in ipairs(lines) do
      if line:find("%S") then
        local ok, row = pcall(json.decode, line)
        if not ok or type(row) ~= "table" then
          if i == #lines then
            warn(("%s:%d: the last line is cut off; dropped"):format(path, i))
          else
            error(("log: %s:%d: not a JSON line (%s); the run folder is damaged"):format(path, i, tostring(row)), 0)
          end
        elseif type(row.step) == "number" and row.step <= s then
          n = n + 1
          kept[n], out[n] = row, line .. "\n"
        end
      end
    end
    if #kept ~= #lines then files.write_atomic(path, table.concat(out)) end
    return kept
  end
  local rows = keep_jsonl(dir .. "/metrics.jsonl")
  keep_jsonl(dir .. "/samples.jsonl")
  keep_jsonl(dir .. "/rollouts.jsonl")   -- clrt.train.rollouts_log: every record has its step
  local f = io.open(dir .. "/samples.txt", "rb")
  if f then
    local text = f:read("*a")
    f:close()
    local cut
    local pos = 1
    while true do
      local a, b, step = text:find("=== step (%d+) ", pos)
      if not a then break end
      if (a == 1 or text:sub(a - 1, a - 1) == "\n") and tonumber(step) > s then cut = a; break end
      pos = b + 1
    end
    if cut then files.write_atomic(dir .. "/samples.txt", text:sub(1, cut - 1)) end
  end
  return rows
end

function L:save_config(cfg)
  files.write_atomic(self:path("config.json"), require("clrt.config").dump(cfg))
end

function L:elapsed() return now() - self.t0 end

-- Append one step's metrics. Non-finite numbers are written as null and reported, so a
-- NaN loss shows up in the log instead of breaking the JSON.
function L:log(step, metrics)
  local row = { step = step, time = self.time_offset + self:elapsed() }
  for k, v in pairs(metrics) do
    if type(v) == "number" and (v ~= v or v == math.huge or v == -math.huge) then
      row[k] = json.null
      row.nonfinite = (row.nonfinite and (row.nonfinite .. ",") or "") .. k
    else
      row[k] = v
    end
  end
  self:append("metrics.jsonl", json.encode(row) .. "\n")
  self.rows[#self.rows + 1] = row
  if self.tb then
    local scalars = { time = row.time }
    for k, v in pairs(metrics) do if type(v) == "number" then scalars[k] = v end end
    self.tb:scalars(step, scalars)
  end
  self.first_step = self.first_step or step
  self.last_step = step
  self.steps_timed = self.steps_timed + 1
  if not self.quiet then self:progress(step, row) end
  if self.plot_every > 0 and self.steps_timed % self.plot_every == 0 then self:plot() end
  return row
end

-- The progress line: step, percent, chosen metrics, time per step and ETA.
function L:progress_line(step, row)
  local parts = {}
  if self.total then
    parts[#parts + 1] = ("step %d/%d %3d%%"):format(step, self.total, math.floor(100 * step / self.total + 0.5))
  else
    parts[#parts + 1] = ("step %d"):format(step)
  end
  local keys = self.progress_keys
  if not keys then
    keys = {}
    for i, k in ipairs(self.plot_keys or {}) do if i <= 4 then keys[#keys + 1] = k end end
  end
  for _, k in ipairs(keys) do
    if row[k] ~= nil then parts[#parts + 1] = ("%s %s"):format(k, fmt(row[k])) end
  end
  -- the API's bill (clrt.api.usage): this step's dollars and tokens, and the run's dollars
  if type(row["api/usd"]) == "number" then
    local tokens = (row["api/prompt_tokens"] or 0) + (row["api/completion_tokens"] or 0)
    parts[#parts + 1] = ("api $%.4f %s tok (run $%.4f)"):format(row["api/usd"], fmt(tokens), row["api/usd_total"] or 0)
  end
  local el = self:elapsed()
  local per = el / math.max(1, self.steps_timed)
  parts[#parts + 1] = ("%.2fs/step"):format(per)
  if self.total then
    parts[#parts + 1] = "ETA " .. M.format_duration(per * math.max(0, self.total - step))
  end
  parts[#parts + 1] = "elapsed " .. M.format_duration(el)
  return table.concat(parts, " | ")
end

function L:progress(step, row)
  local line = self:progress_line(step, row or self.rows[#self.rows] or {})
  if self.tty then
    self.out:write("\r\27[K", line)
    self.open_line = true
  else
    self.out:write(line, "\n")
  end
  self.out:flush()
end

-- Print a message without tearing the progress line.
function L:print(...)
  if self.open_line then self.out:write("\r\27[K") end
  local parts = {}
  for i = 1, select("#", ...) do parts[i] = tostring((select(i, ...))) end
  io.stdout:write(table.concat(parts, "\t"), "\n")
  io.stdout:flush()
  if self.open_line and self.rows[#self.rows] then self:progress(self.last_step, self.rows[#self.rows]) end
end

-- Steps 1, every sample_every-th and the last (`last`, else total_steps) are sampled, so
-- every run shows its first and last steps whatever its length; sample_every=0: none.
function L:sample_due(step, last)
  if self.sample_every <= 0 then return false end
  last = last or self.total
  return step == 1 or step % self.sample_every == 0 or step == last
end

-- items: list of {id =, conversation = {messages}, scores = {metric = value}, reward =,
-- advantage =, ...}. Written to samples.jsonl (every field) and samples.txt (readable).
function L:samples(step, items)
  local rows = {}
  local txt = {}
  for i, it in ipairs(items) do
    local row = { step = step }
    for k, v in pairs(it) do
      if type(v) == "table" and getmetatable(v) and getmetatable(v).__tostring and not json.is_array(v) then
        row[k] = tostring(v)
      else
        row[k] = v
      end
    end
    -- failed metric values (rl.failed) become strings
    if type(it.scores) == "table" then
      local sc = {}
      for k, v in pairs(it.scores) do sc[k] = type(v) == "number" and v or tostring(v) end
      row.scores = sc
    end
    rows[i] = row
    local head = { ("=== step %d · %s"):format(step, tostring(it.id or i)) }
    if it.reward ~= nil then head[#head + 1] = "reward " .. fmt(it.reward) end
    if it.advantage ~= nil then head[#head + 1] = "advantage " .. fmt(it.advantage) end
    if type(row.scores) == "table" then
      local ks = {}
      for k in pairs(row.scores) do ks[#ks + 1] = k end
      table.sort(ks)
      for _, k in ipairs(ks) do head[#head + 1] = k .. "=" .. fmt(row.scores[k]) end
    end
    txt[#txt + 1] = table.concat(head, " · ")
    for _, m in ipairs(it.conversation or {}) do
      txt[#txt + 1] = ("[%s] %s"):format(m.role, tostring(m.content))
    end
    txt[#txt + 1] = ""
  end
  local lines = {}
  for i, row in ipairs(rows) do lines[i] = json.encode(row) .. "\n" end
  self:append("samples.jsonl", table.concat(lines))
  if self.tb then
    for i, it in ipairs(items) do self.tb:text(step, "samples/" .. i, M.sample_markdown(step, it, rows[i], i)) end
  end
  self:append("samples.txt", table.concat(txt, "\n") .. "\n")
end

-- One sample as markdown for TensorBoard's text tab: a heading line with the reward and
-- advantage, a table of scores (failed ones as their text), then each message quoted under
-- its role. row: the sample as written to samples.jsonl (scores already made printable).
local function cell(s) return (tostring(s):gsub("|", "\\|"):gsub("\n", " ")) end
function M.sample_markdown(step, it, row, i)
  local head = { ("**step %d · %s**"):format(step, cell(it.id or i)) }
  if it.reward ~= nil then head[#head + 1] = "reward " .. fmt(it.reward) end
  if it.advantage ~= nil then head[#head + 1] = "advantage " .. fmt(it.advantage) end
  local out = { table.concat(head, " · "), "" }
  local scores = row and row.scores or it.scores
  if type(scores) == "table" then
    local ks = {}
    for k in pairs(scores) do ks[#ks + 1] = k end
    table.sort(ks)
    if #ks > 0 then
      out[#out + 1] = "| metric | score |"
      out[#out + 1] = "|---|---|"
      for _, k in ipairs(ks) do out[#out + 1] = ("| %s | %s |"):format(cell(k), cell(fmt(scores[k]))) end
      out[#out + 1] = ""
    end
  end
  for _, m in ipairs(it.conversation or {}) do
    out[#out + 1] = ("**%s**"):format(cell(m.role))
    out[#out + 1] = ""
    for line in (tostring(m.content) .. "\n"):gmatch("(.-)\n") do
      out[#out + 1] = line == "" and ">" or ("> " .. line)
    end
    out[#out + 1] = ""
  end
  return table.concat(out, "\n")
end

-- Write plot.svg from the rows logged so far.
function L:plot(keys, path)
  keys = keys or self.plot_keys
  if not keys then
    local seen, list = {}, {}
    for _, r in ipairs(self.rows) do
      for k, v in pairs(r) do
        if type(v) == "number" and k ~= "step" and k ~= "time" and not seen[k] then
          seen[k] = true
          list[#list + 1] = k
        end
      end
    end
    table.sort(list)
    keys = {}
    for i = 1, math.min(12, #list) do keys[i] = list[i] end
  end
  -- the validation series join whatever keys were asked for (val/*: logged every eval.every)
  local listed, with_val = {}, {}
  for _, k in ipairs(keys) do listed[k] = true; with_val[#with_val + 1] = k end
  local vals = {}
  for _, r in ipairs(self.rows) do
    for k, v in pairs(r) do
      if type(v) == "number" and not listed[k] and (k:match("^val/") or k == "val_loss") then listed[k] = true; vals[#vals + 1] = k end
    end
  end
  table.sort(vals)
  for _, k in ipairs(vals) do with_val[#with_val + 1] = k end
  keys = with_val
  local series = {}
  for _, k in ipairs(keys) do
    local xs, ys = {}, {}
    for _, r in ipairs(self.rows) do
      if type(r[k]) == "number" and type(r.step) == "number" then xs[#xs + 1] = r.step; ys[#ys + 1] = r[k] end
    end
    series[#series + 1] = { name = k, x = xs, y = ys, smooth = not (k == "lr" or k:match("_lr$")) }
  end
  local text = svg.panels(series, { title = self.title or self.dir:match("[^/]+$") })
  files.write_atomic(path or self:path("plot.svg"), text)
  return path or self:path("plot.svg")
end

function L:close()
  if self.phases_path then progress.set_log(nil) end
  if #self.rows > 0 then self:plot() end
  if self.tb then self.tb:close(); self.tb = nil end
  if self.open_line then self.out:write("\n"); self.out:flush(); self.open_line = false end
end

-- A plain-text table (for before/after summaries): header = {"metric", "before", "after"},
-- rows = {{"accuracy", 0.5, 0.9}, ...}; numbers go through fmt, columns are padded.
function M.format_table(header, rows)
  local all = { header }
  for _, r in ipairs(rows) do all[#all + 1] = r end
  local width = {}
  local cells = {}
  for i, r in ipairs(all) do
    cells[i] = {}
    for j = 1, #header do
      local v = r[j]
      local c = type(v) == "number" and fmt(v) or tostring(v == nil and "" or v)
      cells[i][j] = c
      width[j] = math.max(width[j] or 0, #c)
    end
  end
  local lines = {}
  for i, r in ipairs(cells) do
    local parts = {}
    for j, c in ipairs(r) do
      parts[j] = (j == 1) and (c .. (" "):rep(width[j] - #c)) or ((" "):rep(width[j] - #c) .. c)
    end
    lines[#lines + 1] = table.concat(parts, "  ")
    if i == 1 then
      local rule = {}
      for j = 1, #header do rule[j] = ("-"):rep(width[j]) end
      lines[#lines + 1] = table.concat(rule, "  ")
    end
  end
  return table.concat(lines, "\n") .. "\n"
end

-- Read a run's metrics back (for reports and tests).
function M.read_metrics(dir) return data.read_jsonl(dir .. "/metrics.jsonl") end

return M
