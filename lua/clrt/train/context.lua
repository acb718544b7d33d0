-- clrt.train.context — the ONE place the `ctx` table is built that every metric
-- (lua/metrics/*.lua: compute(conversation, sample, ctx)) and simulated user
-- (lua/interactions/*.lua: respond(conversation, sample, ctx)) receives.
--   local ctx, user = clrt.train.context{config = cfg, tokenizer = tok, who = "collabllm_rl"}
-- (clients = {user =, judge =} replaces the HTTP clients: clrt.train.estimate's recorders)
-- config has the shared settings (clrt.train.defaults: sim, sim_cfg, judge, reward); user is
-- the simulated-user plug-in that config.sim names (clrt.train.users: lua/interactions/);
-- who, the recipe's name, starts every error about them. Fields of ctx:
--   who                the recipe's name (library errors about this run start with it)
--   tokenizer          the policy's tokenizer (token_amount counts with it)
--   extract_json       text -> table, the lenient JSON parser (clrt.llm.extract_json); may raise
--   sleep              seconds -> (), clrt.sched.sleep (yields inside a scheduler task)
--   user               (sim=llm) OpenAI-compatible client, :chat(messages, opts) -> {content =}
--   user_options       (sim=llm) sim_cfg's request options: temperature (1.0), max_tokens
--                      (512), top_p (nil: not sent), parse_retries (1), response_format,
--                      max_chars (bounds every field of the user's JSON reply),
--                      prompt_file (sim_cfg.prompt_file: another text than lua/prompts/);
--                      (sim=user_lm) end_marker, intent_field, flip_roles (its header)
--   judge              (judge.base_url set) client for the LLM judges, as `user`
--   assistant          (not for plug-ins; assistant.base_url set: recipes/build_dataset.lua)
--                      the client that proposes the assistant's turns, as `user`
--   judge_options      judge.*: temperature (0), max_tokens (2048), top_p (nil: not sent),
--                      extract_max_tokens (4096: an extraction carries a whole document),
--                      parse_retries (1), response_format, max_chars (the "thought" only)
--   metric_options     reward.metric_options: {metric_name = {...}} (see each metric)
--   seed               the run's seed (user_lm seeds its requests from it and the turn's key)
--   terminate_marker   sim_cfg.terminate_marker, the text with which the user ends the chat
--                      (clrt.conversation.marker; sample.terminate_marker wins)
--   counters           requests counted by clrt.llm_reply: judge_calls (one per LLM-judged
--                      score or extraction), judge_attempts (requests sent for them),
--                      judge_failures, user_calls, user_attempts, user_failures. Attempts per
--                      score = judge_attempts / judge_calls; transport retries are in
--                      clrt.llm's records. Read and reset by the caller (once per step).
--   spend              (not for plug-ins) the run's clrt.api.usage ledger: tokens and dollars
--                      per role, per step and in total (RUN_DIR/api_usage.json)
-- Spend (docs/api_cost.md): each client carries its role ("user"; the judges' calls name
-- their metric, "judge/<metric>", and extractions "extractor"), its price (sim_cfg.price /
-- judge.price over clrt.api.prices), its rate limits (rpm, tpm) and the reply cache
-- (judge.cache_dir, default RUN_DIR/llm_cache; temperature-0 requests, or every request of a
-- role with cache=true; cache=false: none).
-- Retries (DESIGN.md): transport in the HTTP client (max_retries, backoff, max_backoff);
-- a reply that does not parse is asked again parse_retries times in clrt.llm_reply.
-- The rules that check sim_cfg and judge are clrt.train.defaults.client_rules.
local llm = require("clrt.llm")
local sched = require("clrt.sched")
local users = require("clrt.train.users")
local M = {}

local function client(c, role, cache)
  local ranks = require("clrt.dist").world_size()
  -- one endpoint serves every data-parallel rank: each takes its part of the limits
  local function share(v) return v and math.max(1, math.floor(v / ranks)) end
  local setting = ({ user = "sim_cfg", judge = "judge", assistant = "assistant" })[role] or role
  if c.price ~= nil then require("clrt.api.prices").check(c.price, setting .. ".price") end
  return llm.client({ base_url = c.base_url, model = c.model, api_key_env = c.api_key_env,
    timeout = c.timeout, max_retries = c.max_retries, backoff = c.backoff, max_backoff = c.max_backoff,
    max_concurrency = share(c.max_concurrency), rpm = share(c.rpm), tpm = share(c.tpm), role = role, price = c.price,
    cache = c.cache ~= false and cache or nil, cache_all = c.cache == true })
end

-- A simulator on this machine (a loopback base_url: clrt serve, a local vLLM) costs no API
-- money: priced at 0 unless sim_cfg.price says otherwise; its tokens are still counted
-- (clrt.api.usage). A local endpoint that answers as a model with a list price (a stand-in
-- for gpt-4o-mini, as the API bill's own measurements use) keeps that price.
function M.local_priced(s)
  local prices = require("clrt.api.prices")
  if s.price ~= nil or prices.lookup(s.model) or not prices.is_local(s.base_url) then return s end
  local c = {}
  for k, v in pairs(s) do c[k] = v end
  c.price = { input = 0, cached_input = 0, output = 0 }
  return c
end

-- The reply cache of a config: judge.cache_dir, else RUN_DIR/llm_cache, else none.
local function reply_cache(cfg)
  local dir = (cfg.judge or {}).cache_dir or (cfg.run_dir and cfg.run_dir .. "/llm_cache")
  return dir and require("clrt.api.reply_cache").open(dir) or nil
end

function M.build(a)
  local cfg, tok = a.config or {}, a.tokenizer
  local user
  local who = a.who or "clrt.train.context"
  local ctx = { who = who, tokenizer = tok, extract_json = llm.extract_json, sleep = sched.sleep,
    metric_options = (cfg.reward and cfg.reward.metric_options) or {}, counters = {} }
  local s, j = cfg.sim_cfg or {}, cfg.judge or {}
  ctx.terminate_marker = s.terminate_marker
  ctx.seed = cfg.seed
  local cache = reply_cache(cfg)
  ctx.spend = require("clrt.api.usage").ledger{ path = cfg.run_dir and cfg.run_dir .. "/api_usage.json",
    resume = cfg.resume ~= nil, warn = function(msg) io.stderr:write(msg, "\n") end }
  user = users.load(cfg.sim, who)
  if user.uses_llm then
    ctx.user = a.clients and a.clients.user or client(M.local_priced(s), "user", cache)
    ctx.user_options = { temperature = s.temperature, max_tokens = s.max_tokens, top_p = s.top_p,
      parse_retries = s.parse_retries, response_format = s.response_format, max_chars = s.max_chars,
      prompt_file = s.prompt_file, end_marker = s.end_marker, intent_field = s.intent_field,
      flip_roles = s.flip_roles }
    if s.prompt_file then require("clrt.prompt_file").read(s.prompt_file) end   -- a bad path fails now, not mid-run
  end
  if a.clients then ctx.judge = a.clients.judge elseif j.base_url then ctx.judge = client(j, "judge", cache) end
  local asst = cfg.assistant
  if a.clients then ctx.assistant = a.clients.assistant
  elseif type(asst) == "table" and asst.base_url then ctx.assistant = client(M.local_priced(asst), "assistant", cache) end
  ctx.judge_options = { temperature = j.temperature, max_tokens = j.max_tokens, top_p = j.top_p,
    extract_max_tokens = j.extract_max_tokens, parse_retries = j.parse_retries,
    response_format = j.response_format, max_chars = j.max_chars }
  return ctx, user
end

return setmetatable(M, { __call = function(_, a) return M.build(a) end })
