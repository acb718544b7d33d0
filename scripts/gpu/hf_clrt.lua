-- hf_clrt.lua — clrt's side of scripts/gpu/hf_checks.py: each command does one thing with
-- clrt and writes JSON for the Python side to compare with Hugging Face's libraries.
--   clrt hf_clrt.lua new CONFIG_JSON SEED DIR          random model from a config, saved to DIR
--   clrt hf_clrt.lua logits DIR TOKENS_JSON OUT [device] [adapter_dir]
--        OUT: {"logits": [[V floats] per position], "logprobs": [T-1 floats]}: the logits of
--        every position through the KV-cache decoder (one prefill per prefix), and the
--        training forward's log-probabilities of the next tokens
--   clrt hf_clrt.lua lora BASE_DIR ADAPTER_DIR TOKENS_JSON r=8 targets=a,b [head=1]
--        LoRA adapters trained 3 AdamW steps on TOKENS (so B is not zero), saved as PEFT's folder
--   clrt hf_clrt.lua train_tokenizer TEXT_FILE VOCAB DIR
--   clrt hf_clrt.lua encode TOK_DIR TEXTS_JSON OUT     {"ids": [[...] per text]}
--   clrt hf_clrt.lua tensorboard DIR OUT               an event file written as a run writes it;
--        OUT: {"scalars": [[step, tag, value]], "texts": [[step, tag, text]]} what was written
-- clrt.json, not lua-cjson: Debian's lua-cjson 2.1.0 writes an empty list as {} (it has no array_mt)
local json = require("clrt.json")
local ffi = require("ffi")

local function read(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end
local function write_json(path, v)
  local f = assert(io.open(path, "wb"))
  f:write(json.encode(v))
  f:close()
end
local function floats(x)
  local out = {}
  for i = 0, x - 1 do out[#out + 1] = 0 end
  return out
end

local cmd = arg[1]
if cmd == "new" then
  local cfg = json.decode(read(arg[2]))
  local m = clrt.model.new(cfg, { seed = tonumber(arg[3]) })
  m:save(arg[4])

elseif cmd == "logits" then
  local dir, toks, out, device, adapter = arg[2], json.decode(read(arg[3])), arg[4], arg[5] or "cpu", arg[6]
  local m = clrt.model.load(dir, { device = device, adapter = adapter ~= "" and adapter or nil })
  local T, V = #toks, m.config.vocab_size
  local d = m:decoder(1, T)
  local buf = ffi.new("int32_t[?]", T)
  for i = 1, T do buf[i - 1] = toks[i] end
  local lg = ffi.new("float[?]", V)
  local logits = {}
  for t = 1, T do
    d:prefill(0, buf, t, lg)
    local row = floats(V)
    for v = 1, V do row[v] = lg[v - 1] end
    logits[t] = row
  end
  local x = clrt.tensor.zeros({ 1, T }, { dtype = "i32" })
  for i = 1, T do x:set(1, i, toks[i]) end
  local lp = m:logprobs(x)
  if lp:device() ~= "cpu" then lp = lp:cpu() end
  local lps = {}
  for t = 1, T - 1 do lps[t] = lp:get(1, t) end
  write_json(out, { logits = logits, logprobs = lps, device = m:device() })

elseif cmd == "lora" then
  local base, adir, toks = arg[2], arg[3], json.decode(read(arg[4]))
  local opts = {}
  for i = 5, #arg do
    local k, v = arg[i]:match("^([%w_]+)=(.*)$")
    opts[k] = v
  end
  local m = clrt.model.load(base)
  local targets = {}
  for t in (opts.targets or "q_proj,v_proj"):gmatch("[^,]+") do targets[#targets + 1] = t end
  local r = tonumber(opts.r or 8)
  m:add_lora({ r = r, alpha = 2 * r, seed = 3, targets = targets })
  local T = #toks
  local x = clrt.tensor.zeros({ 1, T }, { dtype = "i32" })
  for i = 1, T do x:set(1, i, toks[i]) end
  local opt = clrt.optim.adamw(m, { lr = 0.05, weight_decay = 0 })
  for _ = 1, 3 do
    m:zero_grad()
    m:logprobs(x)
    m:backward(clrt.tensor.full({ 1, T - 1 }, -1))
    opt:step()
  end
  m:save_adapter(adir, { base = base })

elseif cmd == "train_tokenizer" then
  local texts = {}
  for line in io.lines(arg[2]) do if #line > 0 then texts[#texts + 1] = line end end
  local tj = clrt.tokenizer.train(texts, { vocab_size = tonumber(arg[3]),
    special_tokens = { "<|endoftext|>", "<|im_start|>", "<|im_end|>" } })
  require("clrt.files").mkdir_p(arg[4])
  clrt.tokenizer.write_file(arg[4] .. "/tokenizer.json", clrt.tokenizer.to_json(tj))

elseif cmd == "encode" then
  local tok = clrt.tokenizer.load(arg[2])
  local ids = {}
  for i, s in ipairs(json.decode(read(arg[3]))) do
    ids[i] = tok:encode(s, { add_special_tokens = false })
    json.array(ids[i])
  end
  write_json(arg[4], { ids = json.array(ids) })

elseif cmd == "tensorboard" then
  local tb = require("clrt.util.tensorboard")
  local w = tb.create(arg[2])
  local scalars, texts = {}, {}
  for step = 1, 5 do
    local row = { reward = 0.25 * step - 1 / 3, ["metric/accuracy"] = step / 7, kl = 1e-3 * step ^ 2,
      grad_norm = 10 ^ (step - 3) }
    w:scalars(step, row)
    for k, v in pairs(row) do scalars[#scalars + 1] = { step, k, v } end
  end
  local md = "**user**: plan a trip\n\n**assistant**: where to? ✈️ — «café»"
  w:text(3, "samples", md)
  texts[1] = { 3, "samples", md }
  w:close()
  write_json(arg[3], { scalars = scalars, texts = texts })

else
  io.stderr:write("hf_clrt.lua: unknown command " .. tostring(cmd) .. "\n")
  os.exit(2)
end
