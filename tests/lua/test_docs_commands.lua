-- Every command block in README.md and docs/*.md runs as written, or says why not: the line
-- before a block (or the paragraph's last line before its blank line) carries
-- `<!-- doc-test: run -->` or `<!-- doc-test: skip: WHY -->`, and a command block without one
-- fails this test. A run block is a bash script run in a fresh working folder that holds
-- what the docs name: `Qwen2.5-0.5B-Instruct/` and `models/Qwen3-0.6B/` (tiny model folders),
-- `collabllm-multiturn-math-hard.jsonl` (rows in the published schema), a local endpoint
-- playing the simulated user and the judges where the docs say 127.0.0.1:8001, HOME there.
-- What the test changes, and only this: `clrt` is the built binary with tiny sizes appended
-- to a recipe's command line (TINY below: the command's own settings come first and stay,
-- the sizes only make it short); the docs' ports become free ones; `runs/NAME-...` is the
-- newest such folder an earlier command made and `RUN` the newest run; `clrt serve` runs in
-- the background until it answers /health; `$ cmd` lines of a transcript are the commands.
-- Every command must exit 0.
local T = require("clrt.test")
local files = require("clrt.files")
package.path = T.source_dir() .. "/tests/?.lua;" .. package.path

local src = T.source_dir()
local bin = os.getenv("CLRT_BIN") or arg[-1]
if bin:sub(1, 1) ~= "/" then bin = os.getenv("PWD") .. "/" .. bin end

local COMMANDS = { clrt = true, bash = true, cmake = true, ctest = true, curl = true, mpirun = true, srun = true,
  python3 = true, mkdir = true, jq = true, ["$"] = true, [">"] = true, ["./build/release/clrt"] = true }

-- A line's first word after VAR=value prefixes.
local function first_word(line)
  local rest = line:gsub("^%s+", "")
  while rest:match("^[%u_][%u%d_]*=%S*%s+") do rest = rest:gsub("^[%u_][%u%d_]*=%S*%s+", "") end
  return rest:match("^(%S+)")
end

local function is_command_block(lines)
  for _, l in ipairs(lines) do
    local w = first_word(l)
    if w and COMMANDS[w] and not l:match("^%s*clrt GPU kit") then return true end
  end
  return false
end

-- The code blocks of a Markdown file: indented (after a blank line) or fenced; each with its
-- first line number, its lines and the doc-test marker above it (nil when none).
local function blocks_of(path)
  local lines = {}
  for l in (T.read(path) .. "\n"):gmatch("([^\n]*)\n") do lines[#lines + 1] = l end
  local out, i = {}, 1
  local function marker_above(at)
    for j = at - 1, math.max(1, at - 3), -1 do
      local m = lines[j]:match("<!%-%- doc%-test: (.-) %-%->")
      if m then return m end
      if lines[j]:match("%S") and j < at - 1 then break end
    end
    return nil
  end
  while i <= #lines do
    local l = lines[i]
    if l:match("^```") then
      local b = { line = i + 1, lines = {}, marker = marker_above(i) }
      i = i + 1
      while i <= #lines and not lines[i]:match("^```") do b.lines[#b.lines + 1] = lines[i]; i = i + 1 end
      out[#out + 1] = b
      i = i + 1
    elseif l:match("^    %S") and (i == 1 or not lines[i - 1]:match("%S")) then
      local b = { line = i, lines = {}, marker = marker_above(i) }
      while i <= #lines and (lines[i]:match("^    ") or (not lines[i]:match("%S") and (lines[i + 1] or ""):match("^    "))) do
        b.lines[#b.lines + 1] = lines[i]:sub(5)
        i = i + 1
      end
      out[#out + 1] = b
    else
      i = i + 1
    end
  end
  return out
end

local function doc_files()
  local out = { src .. "/README.md" }
  for _, n in ipairs(files.list(src .. "/docs")) do
    if n:match("%.md$") then out[#out + 1] = src .. "/docs/" .. n end
  end
  return out
end

local function command_blocks()
  local out = {}
  for _, path in ipairs(doc_files()) do
    for _, b in ipairs(blocks_of(path)) do
      if is_command_block(b.lines) then
        b.file = path:sub(#src + 2)
        out[#out + 1] = b
      end
    end
  end
  return out
end

T.case("every command block in README.md and docs/ says whether it runs", function()
  local bad = {}
  for _, b in ipairs(command_blocks()) do
    if not b.marker or not (b.marker == "run" or b.marker:match("^skip: %S")) then
      bad[#bad + 1] = ("%s:%d (%s)"):format(b.file, b.line, b.lines[1])
    end
  end
  T.eq(bad, {}, "command blocks without <!-- doc-test: run --> or <!-- doc-test: skip: why -->")
end)

-- Tiny sizes per recipe, appended after the command's own settings.
local WORLD_SFT = "sft.train.steps=2 sft.train.batch_size=4 sft.world.conversations=40 sft.arch.hidden_size=32 "
  .. "sft.arch.intermediate_size=64 sft.arch.num_hidden_layers=2"
local TINY = {
  collabllm_rl = "steps=1 prompts_per_step=2 rollout.n=2 rollout.num_repeat_rollouts=1 rollout.max_new_tokens=8 "
    .. "rollout.max_user_turns=1 rollout.max_assistant_turns=1 eval.before=false eval.after=false eval.prompts=2 "
    .. "eval.every=1 save_every=1 " .. WORLD_SFT,
  collabllm_sft = "train.steps=2 train.batch_size=2 train.val_every=1 world.conversations=40 arch.hidden_size=32 "
    .. "arch.intermediate_size=64 arch.num_hidden_layers=2",
  collabllm_user_sft = "train.steps=2 train.batch_size=2 train.val_every=1 world.conversations=40 arch.hidden_size=32 "
    .. "arch.intermediate_size=64 arch.num_hidden_layers=2",
  collabllm_dpo = "steps=1 train.batch_size=2 eval.every=1 eval.prompts=2 eval.before=false eval.after=false " .. WORLD_SFT,
  collabllm_eval = "prompts=2 rollout.max_new_tokens=8 max_messages=4",
}

local function sh_quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

local function free_port()
  local p = assert(io.popen([[/usr/bin/python3 -c "import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); print(s.getsockname()[1])"]]))
  local port = tonumber(p:read("*l"))
  p:close()
  return port
end

-- The working folder the run blocks share, the endpoint's port and the server's.
local function workspace()
  local work = T.tmpdir() .. "/work"
  files.mkdir_p(work .. "/bin")
  files.mkdir_p(work .. "/models")
  local tiny = require("support.tiny_model")
  tiny(work .. "/Qwen2.5-0.5B-Instruct", { seed = 3, max_position = 4096 })
  tiny(work .. "/models/Qwen3-0.6B", { seed = 4 })
  require("support.published_rows").write(work, "math", 10)
  -- clrt: the built binary, a recipe's tiny sizes after its own settings
  local lines = { "#!/bin/sh", "recipe=$(basename \"$1\" .lua)", "case \"$recipe\" in" }
  for r, extra in pairs(TINY) do lines[#lines + 1] = ("  %s) exec %s \"$@\" %s ;;"):format(r, sh_quote(bin), extra) end
  lines[#lines + 1] = ("  *) exec %s \"$@\" ;;"):format(sh_quote(bin))
  lines[#lines + 1] = "esac"
  files.write_atomic(work .. "/bin/clrt", table.concat(lines, "\n") .. "\n")
  os.execute("chmod 755 " .. sh_quote(work .. "/bin/clrt"))
  local log = work .. "/endpoint_requests.jsonl"
  local p = assert(io.popen(("/usr/bin/python3 %s/tests/support/fake_collab_endpoint.py %s --lifetime 900"):format(src, sh_quote(log))))
  local port, pid = (p:read("*l") or ""):match("^(%d+) (%d+)$")
  T.cleanup(function() if pid then os.execute("kill " .. pid .. " 2>/dev/null") end p:close() end)
  assert(port, "the fake endpoint did not start")
  return work, tonumber(port), free_port()
end

-- A block as the script the test runs.
local function script_of(b, endpoint_port, serve_port)
  local cmds, transcript = {}, false
  for _, l in ipairs(b.lines) do if l:match("^%$ ") then transcript = true end end
  local joined, pending = {}, nil
  for _, l in ipairs(b.lines) do
    if transcript then
      if l:match("^%$ ") then joined[#joined + 1] = l:sub(3) end
    elseif pending then
      pending = pending .. "\n" .. l
      if not l:match("\\$") then joined[#joined + 1] = pending; pending = nil end
    elseif l:match("\\$") then
      pending = l
    else
      joined[#joined + 1] = l
    end
  end
  for _, c in ipairs(joined) do
    c = c:gsub("127%.0%.0%.1:8001", "127.0.0.1:" .. endpoint_port)
    c = c:gsub("127%.0%.0%.1:8000", "127.0.0.1:" .. serve_port):gsub("%-%-port 8000", "--port " .. serve_port)
    c = c:gsub("runs/([%w_]+)%-%.%.%.", "$(ls -d runs/%1-* | sort | tail -1)")
    c = c:gsub("(%f[%w/])RUN/", "$(ls -td runs/collabllm_*/ | head -1)")
    if c:match("^%s*clrt serve") then
      cmds[#cmds + 1] = (c:gsub("%s+#.*$", "")) .. " &"
      cmds[#cmds + 1] = ("for i in $(seq 300); do curl -sf http://127.0.0.1:%d/health >/dev/null && break; sleep 0.2; done")
        :format(serve_port)
    else
      cmds[#cmds + 1] = c
    end
  end
  return "set -e\ntrap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n" .. table.concat(cmds, "\n") .. "\n"
end

T.case("the runnable command blocks run as written on tiny fixtures", function()
  if io.open("/usr/bin/python3") == nil then T.skip("no /usr/bin/python3 for the local endpoint") end
  local work, endpoint_port, serve_port = workspace()
  local ran, failed = 0, {}
  for _, b in ipairs(command_blocks()) do
    if b.marker == "run" then
      local script = work .. ("/block_%d.sh"):format(ran + 1)
      files.write_atomic(script, script_of(b, endpoint_port, serve_port))
      local cmd = ("cd %s && env HOME=%s PATH=%s:$PATH bash %s > %s.log 2>&1; echo $?"):format(sh_quote(work),
        sh_quote(work), sh_quote(work .. "/bin"), sh_quote(script), sh_quote(script))
      local p = assert(io.popen(cmd))
      local rc = tonumber(p:read("*l"))
      p:close()
      ran = ran + 1
      if rc ~= 0 then
        local log = T.read(script .. ".log") or ""
        failed[#failed + 1] = ("%s:%d exit %s:\n%s"):format(b.file, b.line, tostring(rc), log:sub(-1500))
      end
    end
  end
  T.ok(ran >= 8, ("%d blocks ran"):format(ran))
  T.eq(failed, {}, "blocks that failed")
end)

T.run()
