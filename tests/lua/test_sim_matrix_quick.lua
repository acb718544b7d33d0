-- examples/collab_world/sim_matrix.lua quick=true end to end (one seed, toy sizes): a user
-- model trained by collabllm_user_sft.lua, served by `clrt serve --deterministic`, is the
-- simulated user of one RL run, the scripted user of another, and both final policies are
-- evaluated with both: matrix.json has the four cells (trained-with x evaluated-with) of
-- every figure, each finite, a step time per simulator, and the user-model runs really
-- talked to the served model (their HTTP calls in metrics.jsonl, priced at $0).
local T = require("clrt.test")
local cjson = require("cjson")
if os.execute("command -v curl > /dev/null 2>&1") ~= 0 then io.write("skip: curl is not installed\n"); os.exit(77) end

local KEYS = { "accuracy_underspecified", "accuracy_specified", "ask_rate_underspecified",
  "ask_rate_specified", "tokens_per_conversation" }
local function finite(x) return type(x) == "number" and x == x and x ~= math.huge and x ~= -math.huge end
local out = T.tmpdir() .. "/m"
local bin = os.getenv("CLRT_BIN") or "build/dev/clrt"

T.case("sim_matrix.lua quick=true trains a user model, serves it, and fills the matrix", function()
  local rc = os.execute(("%s examples/collab_world/sim_matrix.lua quick=true out=%s > %s.log 2>&1"):format(bin, out, out))
  T.eq(rc, 0, "sim_matrix.lua failed; its output:\n" .. tostring(T.read(out .. ".log")):sub(-3000))
  local rep = cjson.decode(T.read(out .. "/matrix.json"))
  for _, t in ipairs({ "start", "scripted", "user_lm" }) do
    for _, e in ipairs({ "scripted", "user_lm" }) do
      for _, k in ipairs(KEYS) do
        local c = rep.cells[t .. "/" .. e .. "/" .. k]
        T.ok(c and finite(c.mean) and finite(c.sd), ("%s/%s/%s"):format(t, e, k))
      end
    end
    if t ~= "start" then T.ok(finite(rep.step_s[t].mean) and rep.step_s[t].mean > 0, t .. ": step time") end
  end
  T.ok(T.read(out .. "/user_model/model/model.safetensors"), "the user model was trained")
  local calls, usd = 0, 0
  for line in T.read(out .. "/seed1/user_lm/metrics.jsonl"):gmatch("[^\n]+") do
    local r = cjson.decode(line)
    calls, usd = calls + (r["api/user/calls"] or 0), usd + (r["api/user/usd"] or 0)
  end
  T.ok(calls > 0, "sim=user_lm called the served user model")
  T.eq(usd, 0, "a local simulator costs nothing")
  T.ok(not (T.read(out .. "/seed1/scripted/metrics.jsonl") or ""):find("api/user/calls", 1, true), "the scripted run made no calls")
  T.ok(T.read(out .. "/matrix.md"):find("| trained with \\ evaluated with |", 1, true))
end)

T.run(...)
