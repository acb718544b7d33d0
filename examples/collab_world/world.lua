-- The built-in CollabLLM world: short requests that need one personal fact only the user
-- knows (a friend's name, a city, a day, a dish). A fully specified request contains the
-- fact and should be answered at once; an under-specified one leaves it out, and the right
-- move is to ask for it, then answer with the user's reply. A guess picks a plausible
-- value and is wrong (1 - 1/|values|) of the time. Answers follow fixed templates, so the
-- final answer is checked by exact match.
--
--   local world = require("collab_world.world")     -- examples/ is on package.path (clrt.init)
--   world.rl_prompts(n, seed)           -- RL samples, half under-specified
--   world.eval_prompts(n, seed)         -- held-out samples (phrasing x value pairs never in train)
--   world.sft_conversations(n, seed)    -- SFT chats mixing asking and guessing
--   world.corpus()                      -- text for training the tokenizer
--   world.classify(reply)               -- "ask" | "answer"
--   world.summarize(results)            -- the before/after numbers of the issue
--   world.sharded_tasks(n, seed)        -- held-out under-specified requests as Lost in Conversation's two-shard tasks
--   world.strategy(conversation, sample) -- "clarification" | "answer_attempt" of the last reply (no judge)
--   world.config_path(["config_dpo"])   -- this world's settings file (config.lua beside it)
--
-- A sample is a plain table the recipe, metrics and the scripted user share:
--   {id, task, slot, value, underspecified, prompt = {[system,] user}, ground_truth,
--    single_turn_prompt, task_desc, ask, slot_keywords, split}
local M = {}

M.TERMINATE = "[[TERMINATE CHAT]]"
-- Bumped whenever the world's text changes, so cached warm starts of an older world are not reused.
M.version = 2
M.task_desc = "short personal writing task"
M.system_prompt = "You are a helpful assistant. If a detail is missing, ask for it."

-- Weights that make asking pay only when it is needed: exact match is worth 1; every word
-- after the prompt costs 0.02 (an unneeded question adds about 6 words: -0.12).
M.default_weights = { exact_match = 1, token_amount = -0.02 }

-- The path of one of this world's settings files (collab_world/<name>.lua; "config" by default).
function M.config_path(name)
  local p = package.searchpath("collab_world." .. (name or "config"), package.path)
  if not p then error(("collab_world: %s.lua is not on package.path"):format(name or "config"), 0) end
  return p
end

-- Many values per slot (24 to 30), so that a model cannot memorise (request, answer) pairs and has to
-- learn to copy the value from the conversation -- the held-out prompts need exactly that.
local names = { "Alice", "Bob", "Carol", "Dave", "Emma", "Frank", "Grace", "Henry", "Ivy", "Jack",
  "Kate", "Leo", "Mia", "Nina", "Oscar", "Paul", "Quinn", "Rosa", "Sam", "Tina", "Uma", "Victor",
  "Wendy", "Xavier", "Yara", "Zoe", "Adam", "Bella", "Chris", "Diana" }
local cities = { "Paris", "Rome", "Tokyo", "Cairo", "Lima", "Oslo", "Delhi", "Sydney", "Berlin", "Madrid",
  "Vienna", "Prague", "Dublin", "Lisbon", "Athens", "Seoul", "Bangkok", "Nairobi", "Toronto", "Chicago",
  "Boston", "Denver", "Havana", "Quito", "Santiago", "Warsaw", "Munich", "Milan", "Zurich", "Geneva" }
-- Meeting dates rather than weekdays: seven values were few enough for a small model to
-- memorise every (request, date) pair instead of copying, which the held-out pairs expose.
local months = { "January", "February", "March", "April", "May", "June", "July", "August", "September",
  "October", "November", "December" }
local dates = {}
for i = 1, 28 do dates[i] = months[(i * 5) % 12 + 1] .. " " .. ((i * 11) % 28 + 1) end
local foods = { "pizza", "sushi", "tacos", "pasta", "curry", "salad", "soup", "noodles", "burgers",
  "dumplings", "ramen", "pho", "paella", "risotto", "falafel", "kebab", "lasagna", "burritos", "waffles",
  "pancakes", "steak", "chili", "gumbo", "tofu" }

-- Each task: phrasings with the slot ({v}) and without, the clarifying question, the
-- answer template, and the words that make a question about this slot relevant.
M.tasks = {
  { id = "birthday", slot = "name", values = names,
    full = { "Write a birthday card for my friend {v}.", "Please write a birthday card for {v}." },
    under = { "Write a birthday card for my friend.", "Please write a birthday card." },
    ask = "What is your friend's name?", answer = "Happy birthday, {v}!",
    keywords = { "name", "who" } },
  { id = "thanks", slot = "name", values = names,
    full = { "Write a thank-you note to my teacher {v}.", "Please thank my teacher {v}." },
    under = { "Write a thank-you note to my teacher.", "Please thank my teacher." },
    ask = "What is your teacher's name?", answer = "Thank you, {v}!",
    keywords = { "name", "who" } },
  { id = "trip", slot = "city", values = cities,
    full = { "Plan a trip to {v} for me.", "Please plan my trip to {v}." },
    under = { "Plan a trip for me.", "Please plan my trip." },
    ask = "Which city do you want to visit?", answer = "Trip plan: fly to {v}.",
    keywords = { "city", "where", "place" } },
  { id = "meeting", slot = "date", values = dates,
    full = { "Book a meeting for {v}.", "Please book my meeting on {v}." },
    under = { "Book a meeting for me.", "Please book my meeting." },
    ask = "Which date works for you?", answer = "Meeting booked for {v}.",
    keywords = { "date", "day", "when" } },
  { id = "dinner", slot = "food", values = foods,
    full = { "Order {v} for dinner.", "Please order {v} for my dinner." },
    under = { "Order dinner for me.", "Please order my dinner." },
    ask = "What food would you like?", answer = "Order placed: {v}.",
    keywords = { "food", "dish", "eat" } },
}
local by_id = {}
for _, t in ipairs(M.tasks) do by_id[t.id] = t end
M.task_by_id = by_id

local function fill(template, v) return (template:gsub("{v}", v)) end

-- Held-out split over (task, phrasing, value): a pair is held out when its index sum is
-- divisible by 4, so every value still appears in training under another phrasing and
-- every phrasing with other values. Eval prompts are thus new strings, not new words.
local function held_out(ti, pi, vi) return (ti + pi + vi) % 4 == 0 end

local function rng_of(seed)
  local rng = require("clrt.rng")
  if type(seed) == "table" and seed.next32 then return seed end
  return rng.new(seed or 0)
end

-- One sample. opts: underspecified (bool), split ("train" | "eval"), system (bool,
-- default true: put M.system_prompt first), task (id) to force one.
function M.sample(r, opts)
  opts = opts or {}
  local split = opts.split or "train"
  while true do
    local ti
    if opts.task then
      for i, t in ipairs(M.tasks) do if t.id == opts.task then ti = i end end
      if not ti then error("world.sample: unknown task " .. tostring(opts.task), 2) end
    else
      ti = r:int(#M.tasks)
    end
    local t = M.tasks[ti]
    local pi = r:int(#t.full)
    local vi = r:int(#t.values)
    if held_out(ti, pi, vi) == (split == "eval") then
      local v = t.values[vi]
      local under = opts.underspecified and true or false
      local text = under and t.under[pi] or fill(t.full[pi], v)
      local prompt = {}
      if opts.system ~= false then prompt[1] = { role = "system", content = M.system_prompt } end
      prompt[#prompt + 1] = { role = "user", content = text }
      return {
        id = ("%s/%d/%s/%s"):format(t.id, pi, v, under and "under" or "full"),
        task = t.id, slot = t.slot, value = v, underspecified = under, split = split,
        prompt = prompt, ground_truth = fill(t.answer, v),
        single_turn_prompt = fill(t.full[pi], v), task_desc = M.task_desc,
        ask = t.ask, slot_keywords = t.keywords,
      }
    end
  end
end

local function balanced(n, seed, split, opts)
  local r = rng_of(seed)
  local out = {}
  for i = 1, n do
    local o = { underspecified = (i % 2 == 1), split = split, system = opts and opts.system }
    out[i] = M.sample(r, o)
  end
  return r:shuffle(out)
end

-- RL prompts: half under-specified, shuffled, from the training split.
function M.rl_prompts(n, seed, opts) return balanced(n, seed, "train", opts) end

-- Held-out evaluation prompts: half under-specified, from the eval split.
function M.eval_prompts(n, seed, opts) return balanced(n, seed, "eval", opts) end

-- The simulated user of this world is lua/interactions/scripted_user.lua; SFT data uses
-- its replies so the two agree word for word.
M.user = require("interactions.scripted_user")
M.user_reply_to_question = M.user.reply_to_question
M.relevant = M.user.relevant

function M.classify(reply)
  if type(reply) == "string" and reply:find("?", 1, true) then return "ask" end
  return "answer"
end

-- SFT conversations that mix asking and guessing, so the starting policy does both.
-- opts: p_ask_under (0.5): share of under-specified prompts where the assistant asks (else
-- it guesses a random value); p_ask_spec (0.3): share of specified prompts with an
-- unneeded question first; p_under (0.5): share of under-specified prompts; system (true).
-- Each item: {messages = {...}, sample = sample}; the loss goes on every assistant message.
function M.sft_conversations(n, seed, opts)
  opts = opts or {}
  local p_ask_under = opts.p_ask_under or 0.5
  local p_ask_spec = opts.p_ask_spec or 0.3
  local p_under = opts.p_under or 0.5
  local r = rng_of(seed)
  local out = {}
  for i = 1, n do
    local under = r:random() < p_under
    local s = M.sample(r, { underspecified = under, split = "train", system = opts.system })
    local msgs = {}
    for j, m in ipairs(s.prompt) do msgs[j] = { role = m.role, content = m.content } end
    local ask = r:random() < (under and p_ask_under or p_ask_spec)
    if ask then
      msgs[#msgs + 1] = { role = "assistant", content = s.ask }
      msgs[#msgs + 1] = { role = "user", content = M.user_reply_to_question(s, s.ask) }
      msgs[#msgs + 1] = { role = "assistant", content = s.ground_truth }
    elseif under then
      local t = by_id[s.task]
      msgs[#msgs + 1] = { role = "assistant", content = fill(t.answer, t.values[r:int(#t.values)]) }
    else
      msgs[#msgs + 1] = { role = "assistant", content = s.ground_truth }
    end
    out[i] = { messages = msgs, sample = s, asked = ask }
  end
  return out
end

-- Text for training the world's tokenizer: every string the world can produce, one per
-- line, then the messages of `opts.conversations` (default 500) SFT conversations (seed
-- `opts.seed`, 0) so that pair frequencies follow how often strings are actually used.
function M.corpus(opts)
  opts = opts or {}
  local lines = { M.system_prompt, M.TERMINATE, M.user.IRRELEVANT, M.user.ALREADY_SAID }
  for _, t in ipairs(M.tasks) do
    lines[#lines + 1] = t.ask
    for _, u in ipairs(t.under) do lines[#lines + 1] = u end
    for _, v in ipairs(t.values) do
      lines[#lines + 1] = fill(t.answer, v)
      lines[#lines + 1] = v .. "."
      for _, f in ipairs(t.full) do lines[#lines + 1] = fill(f, v) end
    end
  end
  for _, c in ipairs(M.sft_conversations(opts.conversations or 500, opts.seed or 0)) do
    for _, m in ipairs(c.messages) do lines[#lines + 1] = m.content end
  end
  return table.concat(lines, "\n") .. "\n"
end

-- Held-out under-specified requests as sharded tasks in Lost in Conversation's schema
-- (clrt.train.sharded_tasks; collabllm_eval.lua protocol=sharded): the request without its
-- fact is the first shard (the intent), the fact as this world's user gives it ("Paul.")
-- the second, the fully specified request is the FULL instruction; exact match scores an
-- answer, and the user is scripted (it reveals the next shard as it is). n distinct tasks.
function M.sharded_tasks(n, seed)
  local out, seen = {}, {}
  local r = rng_of(seed)
  local tries = 0
  while #out < n do
    tries = tries + 1
    if tries > 100 * n then error(("collab_world: only %d distinct held-out requests, %d asked"):format(#out, n), 0) end
    local s = M.sample(r, { underspecified = true, split = "eval", system = false })
    if not seen[s.id] then
      seen[s.id] = true
      out[#out + 1] = { task_id = "sharded-" .. s.id, task = "world/" .. s.task,
        shards = { { shard_id = 1, shard = s.prompt[1].content }, { shard_id = 2, shard = M.user_reply_to_question(s, s.ask) } },
        single_turn_prompt = s.single_turn_prompt, ground_truth = s.ground_truth, task_metric = "exact_match",
        task_desc = M.task_desc, user_voice = "scripted" }
    end
  end
  return out
end

-- The world's strategy judge: a reply with a question asks (clarification), any other is
-- an answer attempt (M.classify, the rule the world's scripted user follows).
function M.strategy(conversation)
  local last = conversation[#conversation]
  return M.classify(last and last.content) == "ask" and "clarification" or "answer_attempt"
end

-- The numbers the issue asks for, from finished evaluation conversations.
-- results: list of {sample = ..., conversation = full message list}. The final answer is
-- the last assistant message (exact match after trimming); a first reply that asks is an
-- "ask"; tokens are whitespace-split words after the prompt (token_amount's rule), or
-- opts.count(text) per message when given (e.g. the tokenizer's token count).
function M.summarize(results, opts)
  local count = opts and opts.count
  local conv = require("clrt.conversation")
  local acc = { under = { 0, 0 }, spec = { 0, 0 } }
  local ask = { under = { 0, 0 }, spec = { 0, 0 } }
  local words, nconv = 0, 0
  for _, res in ipairs(results) do
    local s, c = res.sample, res.conversation
    local k = s.underspecified and "under" or "spec"
    local final = conv.last_reply(c, s)
    local correct = final ~= nil and M.classify(final) == "answer" and conv.trim(final) == s.ground_truth
    acc[k][1] = acc[k][1] + (correct and 1 or 0); acc[k][2] = acc[k][2] + 1
    local first = conv.first_reply(c, s)
    ask[k][1] = ask[k][1] + ((first and M.classify(first) == "ask") and 1 or 0); ask[k][2] = ask[k][2] + 1
    for _, m in ipairs(conv.after_prompt(c, s)) do
      words = words + (count and count(m.content) or conv.word_count(m.content))
    end
    nconv = nconv + 1
  end
  local function rate(p) return p[2] > 0 and p[1] / p[2] or 0 end
  return {
    accuracy_underspecified = rate(acc.under), accuracy_specified = rate(acc.spec),
    ask_rate_underspecified = rate(ask.under), ask_rate_specified = rate(ask.spec),
    tokens_per_conversation = nconv > 0 and words / nconv or 0,
    n_underspecified = acc.under[2], n_specified = acc.spec[2],
  }
end

return M
