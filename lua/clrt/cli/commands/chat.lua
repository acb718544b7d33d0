-- clrt chat MODEL_DIR [--temp X] [--max-tokens N] [--system TEXT] [--seed N] [--adapter DIR] [--quant int8]
-- Talk to a model in the terminal with its chat template; tokens stream as they are made.
-- Commands: /system TEXT, /reset, /temp X, /save FILE, /help, /quit. Ctrl-C stops a reply.
local ffi = require("ffi")
local json = require("clrt.json")
local core = require("clrt.core.ffi")
local options = require("clrt.gen.options")
local G = require("clrt.gen.scheduler")

local args = { ... }
local usage = "usage: clrt chat MODEL_DIR [--temp X] [--max-tokens N] [--system TEXT] [--seed N] [--adapter DIR] [--quant int8]"
local dir, temp, max_tokens, system, seed, adapter, quant = nil, nil, 512, nil, os.time(), nil, nil
local i = 1
while i <= #args do
  local a = args[i]
  if a == "--temp" then i = i + 1; temp = tonumber(args[i]) or error("clrt chat: --temp expects a number", 0)
  elseif a == "--max-tokens" then i = i + 1; max_tokens = tonumber(args[i]) or error("clrt chat: --max-tokens expects a number", 0)
  elseif a == "--system" then i = i + 1; system = args[i] or error("clrt chat: --system expects text", 0)
  elseif a == "--seed" then i = i + 1; seed = tonumber(args[i]) or error("clrt chat: --seed expects a number", 0)
  elseif a == "--adapter" then i = i + 1; adapter = args[i] or error("clrt chat: --adapter expects a PEFT LoRA folder", 0)
  elseif a == "--quant" then
    i = i + 1; quant = args[i]
    if quant ~= "int8" and quant ~= "none" then error("clrt chat: --quant expects int8 or none", 0) end
  elseif a == "--help" or a == "-h" then print(usage) return
  elseif not dir then dir = a
  else error("clrt chat: unexpected argument '" .. a .. "'\n" .. usage, 0) end
  i = i + 1
end
if not dir then error("clrt chat: which model folder?\n" .. usage, 0) end

local chat = require("clrt.chat")
local where = require("clrt.model_path").resolve(dir, { who = "clrt chat", adapter = adapter })
local m = require("clrt.model").load(where.model, { adapter = where.adapter, quant = quant })
local tok = require("clrt.tokenizer").load(where.tokenizer)
-- a chat template that cannot render within its budget fails here, not on every request
local template_ok, template_err = pcall(require("clrt.chat").check_template, tok)
if not template_ok then
  io.stderr:write("clrt chat: ", (tostring(template_err):gsub("^chat: ", "")), "\n")
  os.exit(1)
end
local max_len = math.min(m.config.max_position_embeddings or 2048, 4096)
local stop_ids = chat.stop_ids(tok)
-- without --temp: generation_config.json's sampling (transformers' generate defaults), else 0.7
local sampling = (tok.generation_config or m.generation_config or {}).defaults or { temperature = 0.7 }
temp = temp or sampling.temperature
local history_file = (os.getenv("HOME") or ".") .. "/.clrt_chat_history"
core.C.clrt_history_load(history_file)

local messages = {}
local function reset()
  messages = {}
  if system then messages[1] = { role = "system", content = system } end
end
reset()

local function readline(prompt)
  local p = core.C.clrt_readline(prompt)
  if p == nil then return nil end
  local s = ffi.string(p)
  core.C.clrt_free(p)
  return s
end

local help = [[
/system TEXT  set the system message (and start over)
/reset        forget the conversation
/temp X       sampling temperature (0 = greedy)
/save FILE    write the conversation as JSON
/quit         leave (Ctrl-D too)]]

print(("clrt chat: %s — /help for commands, Ctrl-C stops a reply, Ctrl-D leaves"):format(dir))
local turn = 0
while true do
  local line = readline("you> ")
  if not line then print() break end
  local cmd, rest = line:match("^/(%a+)%s*(.*)$")
  if cmd == "quit" or cmd == "exit" then break
  elseif cmd == "help" then print(help)
  elseif cmd == "reset" then reset(); print("(conversation cleared)")
  elseif cmd == "system" then system = rest ~= "" and rest or nil; reset(); print("(system message set; conversation cleared)")
  elseif cmd == "temp" then
    local t = tonumber(rest)
    if t and t >= 0 then temp = t; print(("(temperature %g)"):format(t)) else print("(usage: /temp X with X >= 0)") end
  elseif cmd == "save" then
    if rest == "" then print("(usage: /save FILE)")
    else
      local saved, err = pcall(require("clrt.files").write_atomic, rest, json.encode({ model = dir, messages = messages }) .. "\n")
      print(saved and ("(saved " .. rest .. ")") or ("(cannot write: " .. tostring(err) .. ")"))
    end
  elseif cmd then print("(unknown command /" .. cmd .. "; /help lists them)")
  elseif line:match("%S") then
    messages[#messages + 1] = { role = "user", content = line }
    local ids = chat.render(tok, messages, { add_generation_prompt = true })
    local room = max_len - #ids
    if room < 1 then
      print("(the conversation no longer fits the context; /reset)")
      table.remove(messages)
    else
      turn = turn + 1
      local o = options.check({ temperature = temp, top_p = sampling.top_p, top_k = sampling.top_k,
        max_new_tokens = math.min(max_tokens, room), stop = stop_ids,
        tokenizer = tok, seed = seed + turn }, m.config.vocab_size)
      io.write("assistant> ")
      -- the model's one engine (clrt.gen.scheduler) sizes and keeps the cache across turns
      local E, row, failed = G.of(m), nil, nil
      local req = G.submit(E, ids, o, { on_start = function(rows) row = rows[1] end,
        on_token = function(_, _, piece) if piece and piece ~= "" then io.write(piece); io.flush() end end,
        on_fail = function(e) failed = e end })
      local ok, err = pcall(G.drain, E, { req })
      if ok then err = failed end
      if err then
        if not tostring(err):find("interrupted", 1, true) then error(err, 0) end
        io.write(" [stopped]")   -- drain cancelled the row
      end
      io.write("\n")
      messages[#messages + 1] = { role = "assistant", content = row.text or tok:decode(row.tokens, { skip_special_tokens = true }) }
    end
  end
end
core.C.clrt_history_save(history_file)
