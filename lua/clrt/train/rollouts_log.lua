-- clrt.train.rollouts_log — a sampled RL step's whole tree in the run's rollouts.jsonl, for
-- `clrt view` and for jq: every prompt, every first response, every future conversation with
-- its scores and the judges' and the simulated user's reasons, the reward and advantage, the
-- ground truth, and the tokens and dollars. One JSON object a line, each with `type` and `step`:
--   {"type":"system_prompt","step":S,"hash":H,"text":...}   once per distinct system prompt
--   {"type":"step","step":S,"prompts":P,"responses":R,"futures":F,"reward":..,"api":{usd,..}}
--   {"type":"prompt","step":S,"prompt":i,"id":..,"system_prompt":H,"messages":[..],
--    "ground_truth":..,"responses":[{"response":r,"text":..,"reward":..,"advantage":..,
--      "futures":[{"future":k,"messages":[..],"scores":{..},"rationales":{..},"api":{..}}]}]}
-- A prompt's messages leave out its system prompt (named by hash: a 1,500-character system
-- prompt is not repeated per item); a future's messages are those after the first response,
-- each user message with the simulator's "rationale" where it gave one.
--   jq 'select(.type=="prompt") | .responses[] | {reward, advantage}' RUN/rollouts.jsonl
--   local rl = require("clrt.train.rollouts_log"); rl.write(lg, step, entries, row)
local json = require("clrt.json")
local M = {}

M.FILE = "rollouts.jsonl"

-- A short name for a system prompt: the first 16 hex digits of its SHA-256.
function M.hash(text) return require("clrt.util.sha256")(text):sub(1, 16) end

-- The hashes already in the run's file (a resumed run: the kept steps' records).
local function written_hashes(path)
  local seen = {}
  local f = io.open(path, "rb")
  if not f then return seen end
  for line in f:lines() do
    if line:find('"system_prompt"', 1, true) then
      local ok, r = pcall(json.decode, line)
      if ok and type(r) == "table" and r.type == "system_prompt" and type(r.hash) == "string" then seen[r.hash] = true end
    end
  end
  f:close()
  return seen
end

-- A score as JSON: a number, or null with the failure's text beside it.
local function scores_of(scores)
  local out, failed = json.object(), nil
  for name, v in pairs(scores or {}) do
    if type(v) == "number" then out[name] = v
    else
      out[name] = json.null
      failed = failed or json.object()
      failed[name] = type(v) == "table" and tostring(v.error or v) or tostring(v)
    end
  end
  return out, failed
end

local function message(m)
  return { role = m.role, content = m.content, reasoning_content = m.reasoning_content }
end

-- One future: the messages after the first response, the simulator's notes on its turns.
local function future_record(conv, scores, about, prompt_len)
  about = about or {}
  local notes = {}
  for _, n in ipairs(about.user_notes or {}) do notes[n.message] = n end
  local msgs = json.array()
  for i = prompt_len + 2, #conv do
    local m = message(conv[i])
    local n = notes[i]
    if n then m.rationale, m.current_answer = n.thought, n.current_answer end
    msgs[#msgs + 1] = m
  end
  local sc, failed = scores_of(scores)
  local rationales
  for name, note in pairs(about.metric_notes or {}) do
    rationales = rationales or json.object()
    rationales[name] = note
  end
  return { future = about.future, messages = msgs, scores = sc, failed = failed, rationales = rationales,
    ended = about.ended, user_turns = about.user_turns, assistant_turns = about.assistant_turns,
    tokens = about.tokens, api = about.api }
end

local function add_bill(sum, b)
  if not b then return sum end
  sum = sum or { calls = 0, prompt_tokens = 0, cached_tokens = 0, completion_tokens = 0, usd = 0 }
  for k in pairs(sum) do sum[k] = sum[k] + (b[k] or 0) end
  return sum
end

-- One first response and its futures; its mean score per metric over them.
local function response_record(e, prompt_len)
  local futures, bill, sums, counts = json.array(), nil, {}, {}
  for k, conv in ipairs(e.convs or {}) do
    local about = (e.about or {})[k]
    futures[#futures + 1] = future_record(conv, e.scores[k], about, prompt_len)
    bill = add_bill(bill, about and about.api)
    for name, v in pairs(e.scores[k] or {}) do
      if type(v) == "number" then sums[name], counts[name] = (sums[name] or 0) + v, (counts[name] or 0) + 1 end
    end
  end
  local means
  for name, s in pairs(sums) do
    means = means or json.object()
    means[name] = s / counts[name]
  end
  local m = e.message or {}
  return { response = e.response, text = m.content or e.text, reasoning_content = m.reasoning_content,
    tokens = #(e.tokens or {}), truncated = e.truncated or nil, invalid = e.invalid, cutoff_reward = e.cutoff_reward,
    reward = e.reward, advantage = e.advantage, dropped = e.dropped, drop_error = e.drop_error,
    metrics = means, futures = futures, api = bill }
end

-- The records of one step (a list of tables, in file order). seen: hashes of the system
-- prompts already written (updated).
function M.records(step, entries, row, seen)
  local out, prompts, order = {}, {}, {}
  local nresp, nfut = 0, 0
  for _, e in ipairs(entries) do
    local g = e.group
    if not prompts[g] then
      local s = e.sample or {}
      local msgs, sys = json.array(), nil
      for _, m in ipairs(s.prompt or {}) do
        if m.role == "system" and not sys then
          sys = M.hash(tostring(m.content))
          if not seen[sys] then
            seen[sys] = true
            out[#out + 1] = { type = "system_prompt", step = step, hash = sys, text = m.content }
          end
        else
          msgs[#msgs + 1] = message(m)
        end
      end
      prompts[g] = { type = "prompt", step = step, prompt = g, id = s.id, system_prompt = sys, messages = msgs,
        ground_truth = s.ground_truth, single_turn_prompt = s.single_turn_prompt, task_desc = s.task_desc,
        responses = json.array(), prompt_len = #(s.prompt or {}) }
      order[#order + 1] = g
    end
    local p = prompts[g]
    p.responses[#p.responses + 1] = response_record(e, p.prompt_len)
    nresp, nfut = nresp + 1, nfut + #(e.convs or {})
  end
  table.sort(order)
  local api
  for k, v in pairs(row or {}) do
    local name = type(k) == "string" and k:match("^api/(.+)$")
    if name then api = api or json.object(); api[name] = v end
  end
  local rewards, n = 0, 0
  for _, e in ipairs(entries) do if type(e.reward) == "number" then rewards, n = rewards + e.reward, n + 1 end end
  out[#out + 1] = { type = "step", step = step, prompts = #order, responses = nresp, futures = nfut,
    reward = n > 0 and rewards / n or nil, api = api }
  for _, g in ipairs(order) do
    local p = prompts[g]
    local bill
    for _, r in ipairs(p.responses) do bill = add_bill(bill, r.api) end
    p.api, p.prompt_len = bill, nil
    out[#out + 1] = p
  end
  return out
end

-- Append a sampled step's records to lg's run folder (clrt.log's logger: on ranks other than
-- the first its append does nothing). row: the step's metrics.jsonl row (its api/* fields).
function M.write(lg, step, entries, row)
  -- rank 0 writes the run's files; another rank's logger answers every method with a no-op
  if not lg.dir or not require("clrt.dist").is_main() then return end
  lg.rollout_prompts_seen = rawget(lg, "rollout_prompts_seen") or written_hashes(lg.dir .. "/" .. M.FILE)
  local lines = {}
  for i, r in ipairs(M.records(step, entries, row, lg.rollout_prompts_seen)) do lines[i] = json.encode(r) .. "\n" end
  lg:append(M.FILE, table.concat(lines))
end

return M
