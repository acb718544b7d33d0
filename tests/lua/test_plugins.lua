-- Plug-ins from the user's own folder (clrt.plugins): CLRT_PATH's metrics/, interactions/
-- and prompts/ are searched before the shipped ones (a user's metrics/accuracy.lua replaces
-- clrt's), a simulated user or a metric may be a file given by path, and an unknown name
-- says which folders were searched and what they hold. Run in a child clrt, whose module
-- path is set from CLRT_PATH at start.
local T = require("clrt.test")
local files = require("clrt.files")

local bin = os.getenv("CLRT_BIN") or arg[-1]
if bin:sub(1, 1) ~= "/" then bin = os.getenv("PWD") .. "/" .. bin end

local function child(env, code)
  local script = T.tmpdir() .. "/child.lua"
  files.write_atomic(script, code)
  local f = assert(io.popen(("%s %q %q 2>&1; echo \"exit=$?\""):format(env, bin, script)))
  local out = f:read("*a")
  f:close()
  return out:gsub("exit=%d+\n?$", ""), tonumber(out:match("exit=(%d+)\n?$"))
end

local mine = T.tmpdir() .. "/my_plugins"
files.mkdir_p(mine .. "/metrics")
files.mkdir_p(mine .. "/interactions")
files.mkdir_p(mine .. "/prompts")
files.write_atomic(mine .. "/metrics/brevity.lua",
  'return { name = "brevity", compute = function(c) return -#c[#c].content end }\n')
files.write_atomic(mine .. "/metrics/accuracy.lua",
  'return { name = "accuracy", mine = true, compute = function() return 0.5 end }\n')
files.write_atomic(mine .. "/interactions/echo_user.lua",
  'return { name = "echo_user", respond = function(c) return "you said: " .. c[#c].content end }\n')
files.write_atomic(mine .. "/prompts/my_user.txt", "You are a terse user.\n")
local by_path = T.tmpdir() .. "/loose_user.lua"
files.write_atomic(by_path, 'return { name = "loose_user", respond = function() return "ok" end }\n')
local metric_path = T.tmpdir() .. "/length.lua"
files.write_atomic(metric_path, 'return { name = "length", compute = function(c) return #c end }\n')

T.case("CLRT_PATH's metrics, users and prompts come first; files by path; what was searched", function()
  local out, rc = child("CLRT_PATH=" .. mine, ([[
local reward = require("clrt.train.reward")
local users = require("clrt.train.users")
local ms = reward.load_metrics({ brevity = 1, accuracy = 1, [%q] = 1 })
local by = {}
for _, m in ipairs(ms) do by[m.name] = m end
print("brevity", by.brevity.compute({ { role = "assistant", content = "abc" } }))
print("accuracy mine", by.accuracy.metric.mine == true)
print("length", by[%q].compute({ 1, 2, 3 }))
print("echo", users.load("echo_user").respond({ { content = "hi" } }))
print("loose", users.load(%q).respond({}))
print("prompt", require("clrt.prompt_file").read("my_user"))
print("shipped prompt", #require("clrt.prompt_file").read("proactive_system") > 0)
local rl = require("recipes.collabllm_rl")
local config = require("clrt.config")
rl.check_config(config.parse(rl.defaults, { "sim=" .. %q, 'reward.metric_weights={"brevity":1}' }))
print("config ok")
local ok, err = pcall(reward.check_config, { metric_weights = { nope = 1 } }, "w")
print("unknown", err)
ok, err = pcall(users.load, "nobody", "w")
print("unknown user", err)
]]):format(metric_path, metric_path, by_path, by_path))
  T.eq(rc, 0, out)
  T.ok(out:find("brevity\t-3", 1, true), out)
  T.ok(out:find("accuracy mine\ttrue", 1, true), "the user's accuracy replaces the shipped one: " .. out)
  T.ok(out:find("length\t3", 1, true), "a metric by path: " .. out)
  T.ok(out:find("echo\tyou said: hi", 1, true), out)
  T.ok(out:find("loose\tok", 1, true), "a simulated user by path: " .. out)
  T.ok(out:find("prompt\tYou are a terse user.", 1, true), "a prompt by name from CLRT_PATH: " .. out)
  T.ok(out:find("shipped prompt\ttrue", 1, true), out)
  T.ok(out:find("config ok", 1, true), out)
  T.ok(out:find("unknown metric 'nope' (no metrics/nope.lua in " .. mine .. "/metrics, ", 1, true), out)
  T.ok(out:find("known: accuracy, answer_attempt, asks_question, bleu_score, brevity", 1, true), "the names found, the user's among them: " .. out)
  T.ok(out:find("no interactions/nobody.lua in " .. mine .. "/interactions, ", 1, true), out)
  T.ok(out:find("echo_user", 1, true))
end)

T.case("without CLRT_PATH the shipped plug-ins alone", function()
  local out, rc = child("env -u CLRT_PATH", [[
local ms = require("clrt.train.reward").load_metrics({ accuracy = 1 })
print("accuracy mine", ms[1].metric.mine == true)
print("brevity", pcall(require("clrt.train.reward").load_metrics, { brevity = 1 }))
]])
  T.eq(rc, 0, out)
  T.ok(out:find("accuracy mine\tfalse", 1, true), out)
  T.ok(out:find("brevity\tfalse", 1, true), out)
end)

T.run()
