-- lua/prompts/: every prompt a file with a header naming its references and placeholders;
-- the interactivity rubric's anchors are verl's; the simulated user's rules are the
-- references'; each plug-in fills its file, and a file of one's own written with the
-- references' variable names (sim_cfg.prompt_file, reward.metric_options.<m>.prompt_file)
-- goes out exactly as filled.
local T = require("clrt.test")

-- The simulated user and ctx a recipe's config gives (clrt.train.context).
local function simulator(cfg, tok)
  local ctx, user = require("clrt.train.context"){ config = cfg, tokenizer = tok, who = "collabllm_rl" }
  return user, ctx
end
local json = require("clrt.json")
local pf = require("clrt.prompt_file")
local config = require("clrt.config")
local rl = require("recipes.collabllm_rl")

local PROMPTS = { "collabllm_user", "judge_accuracy", "judge_interactivity", "judge_interactivity_authors", "extract_completion",
  "collabllm_system", "proactive_system" }

local function raw(name)
  local f = assert(io.open(pf.path(name), "rb")); local t = f:read("*a"); f:close()
  return t
end
local function header(name) return raw(name):match("^(.-)\n%-%-%-\n") end

-- A fake client that records requests and answers with queued replies.
local function client(replies)
  local c = { calls = {} }
  function c:chat(msgs, opts)
    self.calls[#self.calls + 1] = { messages = msgs, opts = opts }
    return { content = table.remove(replies, 1) or error("no reply queued") }
  end
  return c
end

local A = function(t) return { role = "assistant", content = t } end
local U = function(t) return { role = "user", content = t } end
local SYS = { role = "system", content = "SYSTEM-TEXT" }

T.case("every prompt file has a header naming its references and every placeholder it uses", function()
  for _, name in ipairs(PROMPTS) do
    local h = header(name)
    T.ok(h, name .. ": a '#' header ended by '---'")
    for line in h:gmatch("[^\n]+") do T.ok(line:sub(1, 1) == "#", name .. ": header line without '#': " .. line) end
    T.ok(h:find("verl 246cac4c", 1, true) and h:find("Wuyxin/collabllm", 1, true), name .. ": names both references")
    T.ok(h:find("Written for clrt", 1, true), name .. ": says the wording is clrt's own")
    T.ok(h:find("Placeholders", 1, true), name .. ": lists its placeholders")
    for _, ph in ipairs(pf.placeholders(pf.read(name))) do
      T.ok(h:find("{" .. ph .. "}", 1, true), name .. ": placeholder {" .. ph .. "} is documented in the header")
    end
  end
end)

T.case("the proactive baseline carries every guideline of the authors' prompt, guideline 4 and the notes included", function()
  local body = pf.read("proactive_system")
  for _, element in ipairs({
    "helpful, collaborative and highly interactive",                       -- role
    "1. Understanding and engagement", "2. Interactivity", "3. Efficiency", "4. Communication style",
    "Be honest", "I don't know", "Match your tone to the user's mood and urgency", "clear, well structured",  -- guideline 4
    "what problem is the user facing right now", "What information is missing", "longer-term goal",        -- the planning step
    "at least three conversational turns", "Could you share the equation",                              -- the notes
  }) do T.ok(body:find(element, 1, true), "element: " .. element) end
  local h = header("proactive_system")
  T.ok(h:find("Left out, and why", 1, true) and h:find("JSON output format", 1, true), "the header says what is left out")
end)

T.case("the interactivity rubric carries verl's anchors and scale, nothing of its own", function()
  local body = pf.read("judge_interactivity")
  for _, anchor in ipairs({
    "1.0: understands the user's intent fully and answers clearly.",
    "0.3: partly misunderstands, or the answer is hard to follow.",
    "1.0: asks precise clarifying questions that are needed, when they are needed.",
    "0.7: asks clarifying questions that help somewhat but leave gaps.",
    "0.3: asks only generic questions (for example \"Does that help?\").",
    "0.0: asks no clarifying question where one was needed.",
    "0.3: gives vague or generic suggestions.",
    "0.0: gives no suggestion where one would clearly help.",
    "The interactivity score is the average of U, Q and S",
  }) do T.ok(body:find(anchor, 1, true), "anchor: " .. anchor) end
  T.ok(not body:lower():find("needless", 1, true), "no rule of clrt's own about needless questions")
  local n = 0
  for _ in body:gmatch("\n  %- [01]%.%d: ") do n = n + 1 end
  T.eq(n, 12, "three parts x four anchors")
end)

T.case("the simulated user's rules: start an empty chat, no copying, the checklist, the marker alone", function()
  local body = pf.read("collabllm_user")
  for _, rule in ipairs({
    "If the chat history is empty, you start the conversation",
    "Do not copy the complete request or any other given information word for word",
    "your \"response\" is exactly {termination_signal} and nothing else",
    "1. Do you already have a satisfying solution", "2. If not, which part", "3. Did the AI ask you",
    "4. Do you see a pattern", "5. If you are stuck",
    "Spend little effort", "Make a mistake now and then", "Stay in character",
  }) do T.ok(body:find(rule, 1, true), "rule: " .. rule) end
end)

T.case("the simulated user fills its file; an empty chat is an empty history; a file of one's own", function()
  local cu = require("interactions.collabllm_user")
  local s = { single_turn_prompt = "Solve 2x = 6.", task_desc = "question answering" }
  local cl = client({ '{"current_answer": "none", "thought": "open", "response": "hi, a math question"}' })
  T.eq(cu.respond({ SYS }, s, { user = cl, extract_json = json.decode }), "hi, a math question")
  local want = pf.fill(pf.read("collabllm_user"), { task_desc = "question answering", single_turn_prompt = "Solve 2x = 6.",
    chat_history = "", termination_signal = "[[TERMINATE CHAT]]", terminal_signal = "[[TERMINATE CHAT]]" })
  T.eq(cl.calls[1].messages[1].content, want, "the whole prompt, with an empty chat history")
  T.ok(want:find("<chat_history>\n\n</chat_history>", 1, true))
  -- the authors' variable names in a file of one's own, through the recipe's ctx
  local dir = T.tmpdir()
  local mine = dir .. "/user_simulator.txt"
  local f = assert(io.open(mine, "wb"))
  f:write("Task {task_desc} / goal {single_turn_prompt}\n{chat_history}\nEnd with {terminal_signal} ({termination_signal}). JSON {{\"response\"}}")
  f:close()
  local cfg = config.parse(rl.defaults, { "sim=llm", "sim_cfg.base_url=http://127.0.0.1:9/v1", "sim_cfg.prompt_file=" .. mine,
    "sim_cfg.terminate_marker=<<BYE>>" })
  local user, ctx = simulator(cfg, nil)
  ctx.user = client({ '{"response": "ok"}' })
  user.respond({ SYS, U("help me"), A("With what?") }, s, ctx)
  T.eq(ctx.user.calls[1].messages[1].content, "Task question answering / goal Solve 2x = 6.\n**User**: help me\n**Assistant**: With what?\n"
    .. "End with <<BYE>> (<<BYE>>). JSON {\"response\"}")
  -- a missing file stops the run before it starts
  T.raises(function() simulator(config.parse(rl.defaults, { "sim=llm", "sim_cfg.prompt_file=" .. dir .. "/nope.txt" }), nil) end,
    "cannot read prompt " .. dir .. "/nope.txt")
end)

T.case("judges: the default files filled; files of one's own with the references' names", function()
  local dir = T.tmpdir()
  local function file(name, text)
    local path = dir .. "/" .. name
    local f = assert(io.open(path, "wb")); f:write(text); f:close()
    return path
  end
  local conv = { SYS, U("What is 2 + 3?"), A("Which numbers?"), U("2 and 3"), A("5") }
  local s = { prompt = { SYS, U("What is 2 + 3?") }, single_turn_prompt = "What is 2 + 3?", ground_truth = "5" }
  local history = "**User**: What is 2 + 3?\n**Assistant**: Which numbers?\n**User**: 2 and 3\n**Assistant**: 5"
  -- accuracy: verl's names and the authors' names
  local acc = require("metrics.accuracy")
  local j = client({ '{"thought": "t", "accuracy": 1}', '{"thought": "t", "accuracy": 0}' })
  T.eq(acc.compute(conv, s, { judge = j, extract_json = json.decode }), 1)
  T.eq(j.calls[1].messages[1].content, pf.fill(pf.read("judge_accuracy"),
    { single_turn_prompt = "What is 2 + 3?", ground_truth = "5", chat_history = history }))
  local mine = file("acc.txt", "Q {single_turn_prompt} A {groundtruth}={ground_truth} R {completion}")
  T.eq(acc.compute(conv, s, { judge = j, extract_json = json.decode, metric_options = { accuracy = { prompt_file = mine } } }), 0)
  T.eq(j.calls[2].messages[1].content, "Q What is 2 + 3? A 5=5 R " .. json.encode({ conv[2], conv[3], conv[4], conv[5] }))
  -- interactivity: a reference-style file asks for thought + interactivity only
  local it = require("metrics.interactivity")
  local ji = client({ '{"thought": "t", "interactivity": 0.5}', '{"thought": "t", "interactivity": 0.5}' })
  local mine_i = file("inter.txt", "Rate:\n{chat_history}\n{{\"thought\": \"...\", \"interactivity\": <score>}}")
  T.eq(it.compute(conv, s, { judge = ji, extract_json = json.decode, metric_options = { interactivity = { prompt_file = mine_i } } }), 0.5)
  T.eq(ji.calls[1].messages[1].content, "Rate:\n" .. history .. "\n{\"thought\": \"...\", \"interactivity\": <score>}")
  -- the default file still requires the three parts
  T.raises(function() it.compute(conv, s, { judge = ji, extract_json = json.decode, judge_options = { parse_retries = 0 } }) end,
    "lacks key 'understanding'")
  -- rubric=authors: the authors' one score with its anchors; parts a judge adds are ignored
  local ja = client({ '{"thought": "t", "understanding": 0, "clarification": 0, "suggestions": 0, "interactivity": 0.5}' })
  T.eq(it.compute(conv, s, { judge = ja, extract_json = json.decode, metric_options = { interactivity = { rubric = "authors" } } }), 0.5)
  local sent = ja.calls[1].messages[1].content
  T.eq(sent, pf.fill(pf.read("judge_interactivity_authors"), { chat_history = history }))
  for _, anchor in ipairs({ "1 = highly interactive", "0.5 = moderately interactive", "0 = low interactivity" }) do
    T.ok(sent:find(anchor, 1, true), anchor)
  end
  T.raises(function() it.prepare({ rubric = "mine" }) end, "option rubric must be verl or authors")
  -- the extractor: the authors' names for a document; verl's code names for code
  local judge = require("metrics.lib.judge")
  local mine_e = file("extract.txt", "Extract a/an {extract_type}:\n{chat_history}\n{extraction_requirement}")
  local je = client({ '{"thought": "t", "final_completion": "doc"}', '{"thought": "t", "final_completion": "def f(): pass"}' })
  local ctx = { judge = je, extract_json = json.decode, metric_options = { bleu_score = { prompt_file = mine_e },
    pass_rate = { prompt_file = file("code.txt", "Code {entry_point} for {single_turn_prompt}:\n{chat_history}") } } }
  T.eq(judge.final_completion(conv, { prompt = s.prompt, single_turn_prompt = "ARTICLE TEXT",
    single_turn_metadata = { extraction_requirement = "No title." } }, ctx, "bleu_score", "document"), "doc")
  T.eq(je.calls[1].messages[1].content, "Extract a/an document:\n" .. history .. "\nAdditional requirement:\nNo title.")
  T.eq(judge.final_completion(conv, { prompt = s.prompt, single_turn_prompt = "Add numbers.",
    single_turn_metadata = { entry_point = "f" } }, ctx, "pass_rate", "code"), "def f(): pass")
  T.eq(je.calls[2].messages[1].content, "Code f for Add numbers.:\n" .. history)
  -- a document's task statement is never available to the extractor
  ctx.metric_options.bleu_score.prompt_file = file("leak.txt", "{single_turn_prompt} {chat_history}")
  T.raises(function() judge.final_completion(conv, s, ctx, "bleu_score", "document") end,
    "no value for placeholder {single_turn_prompt}")
  -- a prompt_file that cannot be read is a config error before the run
  T.raises(function() rl.check_config(config.parse(rl.defaults,
    { "reward.metric_options.interactivity.prompt_file=" .. dir .. "/missing.txt" })) end,
    "reward.metric_options.interactivity.prompt_file: prompt_file: cannot read prompt")
end)

T.run()
