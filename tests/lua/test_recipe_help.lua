-- `clrt recipes/X.lua --help` lists every setting with its default (unset ones too) and the
-- comment it is declared with; `print_config=true` prints the resolved config as JSON; both
-- exit 0 without running anything or making a folder (clrt.recipe_help).
local T = require("clrt.test")
local json = require("clrt.json")
local files = require("clrt.files")
local help = require("clrt.recipe_help")

local bin = os.getenv("CLRT_BIN") or arg[-1]
if bin:sub(1, 1) ~= "/" then bin = os.getenv("PWD") .. "/" .. bin end
local RECIPES = { "collabllm_rl", "collabllm_sft", "collabllm_dpo", "collabllm_eval", "process_dataset", "build_dataset",
  "shard_dataset" }

local function run(dir, args)
  local f = assert(io.popen(("cd %q && %q %q %s 2>&1; echo \"exit=$?\""):format(dir, bin,
    T.source_dir() .. "/lua/recipes/" .. args[1] .. ".lua", table.concat(args, " ", 2))))
  local out = f:read("*a")
  f:close()
  return out:gsub("exit=%d+\n?$", ""), tonumber(out:match("exit=(%d+)\n?$"))
end

T.case("comments are read from declarations, nested by their tables, presets left out", function()
  local c = help.comments([[
M.defaults = {
  seed = 1,                 -- the run's seed
  rollout = { n = 8,        -- responses per prompt
    temperature = 1.0 },
}
M.PRESETS = { authors = { rollout = { n = 1,   -- the authors' one response
} } }
]])
  T.eq(c.path["defaults.rollout.n"], "responses per prompt")
  T.eq(c.path["rollout.n"], "responses per prompt")
  T.eq(c.leaf.seed, "the run's seed")
  T.eq(c.leaf.n, nil, "a nested name alone is no key")
  -- a line that closes its table after a key: the next key is back at the outer level
  c = help.comments([[
M.defaults = {
  rollout = { n = 8,
    top_k = 50 },           -- the response's top k
  estimate = false,         -- print the cost and exit
  note = "{ not a table",   -- braces in a string
  after = 1,                -- still at the first level
}
]])
  T.eq(c.path["rollout.top_k"], "the response's top k")
  T.eq(c.leaf.estimate, "print the cost and exit")
  T.eq(c.path["rollout.estimate"], nil, "not inside rollout")
  T.eq(c.leaf.after, "still at the first level")
end)

T.case("a setting another module declares (key = require(M).config()) takes its comment there", function()
  local out = run(T.tmpdir(), { "collabllm_rl", "--help" })
  T.ok(out:find("\n  train.async.max_off_policy_steps = 0%s+%-%- K; 0: every step's rollouts"), out)
  T.ok(out:find("\n  train.lora.r = 0%s+%-%- the adapters' rank"), out)
end)

T.case("--help: every setting, its default, unset ones, and their comments; exit 0, nothing made", function()
  local dir = T.tmpdir()
  for _, r in ipairs(RECIPES) do
    local out, rc = run(dir, { r, "--help" })
    T.eq(rc, 0, r .. ": " .. out)
    T.ok(out:find("usage: clrt recipes/" .. r .. ".lua", 1, true), out)
    T.ok(not out:find("traceback", 1, true), out)
    -- every key of the resolved defaults is listed
    local cfg = require("recipes." .. r).parse_args and require("recipes." .. r).parse_args({})
      or require("clrt.config").parse(require("recipes." .. r).defaults, {})
    local function walk(t, prefix)
      for k, v in pairs(t) do
        local p = prefix .. k
        if type(v) == "table" and next(v) ~= nil and #v == 0 then walk(v, p .. ".")
        elseif not (type(v) == "table" and next(v) == nil) then
          T.ok(out:find("\n  " .. p .. " = ", 1, true), r .. " lists " .. p)
        end
      end
    end
    walk(cfg, "")
  end
  local out = run(dir, { "collabllm_rl", "--help" })
  T.ok(out:find("\n  model = %(unset: string%)%s+%-%- the starting policy"), "model=, unset, with its comment")
  T.ok(out:find("\n  rollout.n = 8%s+%-%- verl rollout.n"), "a default and its comment")
  T.ok(not out:find("rollout.temperature = 1%s+%-%- %-%-assistant"), "the preset's comment is not the default's")
  T.eq(files.list(dir), {}, "no folder made")
end)

T.case("print_config=true: the resolved config as JSON, the command line applied; exit 0", function()
  local dir = T.tmpdir()
  local out, rc = run(dir, { "collabllm_rl", "rollout.n=3", "print_config=true" })
  T.eq(rc, 0, out)
  local cfg = json.decode(out)
  T.eq(cfg.rollout.n, 3)
  T.eq(cfg.name, "collabllm_rl")
  T.eq(files.list(dir), {}, "nothing run")
  out, rc = run(dir, { "collabllm_eval", "print_config=true", "model=m", "protocol=prefix" })
  T.eq(rc, 0, out)
  T.eq(json.decode(out).protocol, "prefix")
  out, rc = run(dir, { "collabllm_rl", "rollout.nn=3", "print_config=true" })
  T.eq(rc, 1, "a bad key is still refused: " .. out)
end)

T.run()
