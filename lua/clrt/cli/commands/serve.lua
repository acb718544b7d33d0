-- clrt serve MODEL_DIR [--host 127.0.0.1] [--port 8000] [--api-key KEY] [--slots 32]
--                      [--max-len 2048] [--max-tokens 4096] [--max-body BYTES] [--max-messages N]
--                      [--max-schema-bytes N] [--max-connections N] [--max-connections-per-client N]
--                      [--header-timeout S] [--idle-timeout S] [--served-model-name NAME]
--                      [--adapter DIR] [--prefix-cache-mb MB] [--deterministic] [--quant int8]
-- An OpenAI-compatible server for one model folder (see lua/clrt/net/openai_server.lua).
local args = { ... }
local usage = [[
usage: clrt serve MODEL_DIR [options]
  --host ADDR        address to bind (default 127.0.0.1; 0.0.0.0 exposes it to the network)
  --port N           port (default 8000; 0 picks a free one and prints it)
  --api-key KEY      require "Authorization: Bearer KEY" (or set CLRT_API_KEY)
  --slots N          rows decoded together at most (default 32)
  --max-len N        context length of each row (default: the model's, at most 4096)
  --max-tokens N     largest max_tokens a request may ask for (default 4096)
  --max-body BYTES   largest request body (default 4 MiB)
  --max-messages N   most messages in one chat request (default 2048)
  --max-schema-bytes N
                     largest tools or response_format, as JSON (default 65536)
  --max-connections N
                     open connections at once; a request beyond them gets a 503 (default 256)
  --max-connections-per-client N
                     open connections from one IP address; more are refused (default 32)
  --header-timeout S a connection must send its first request head within S seconds (default 10)
  --idle-timeout S   a connection silent for S seconds is closed (default 60)
  --adapter DIR      a PEFT LoRA folder applied over MODEL_DIR
  --prefix-cache-mb MB
                     memory for prompt caching: requests that start like an earlier one
                     prefill only the rest (default 1024; 0 turns it off; docs/prefix_cache.md)
  --deterministic    batch-invariant kernels: a request with a seed gets the same tokens and
                     log-probabilities whatever other requests share its steps (CPU; slower
                     prefill, see docs/reproducibility.md)
  --quant int8       generate from int8 weights (per-output-channel scales; docs/quantization.md)
  --served-model-name NAME
                     the model's name in /v1/models; requests naming another model get a
                     404 model_not_found (default: the folder's name; --name is the same)]]

local opts, dir = {}, nil
local i = 1
local function value(flag)
  i = i + 1
  if args[i] == nil then error(("clrt serve: %s needs a value\n%s"):format(flag, usage), 0) end
  return args[i]
end
local function number(flag)
  local v = value(flag)
  local n = tonumber(v)
  if not n then error(("clrt serve: %s expects a number, got '%s'"):format(flag, v), 0) end
  return n
end
while i <= #args do
  local a = args[i]
  if a == "--help" or a == "-h" then print(usage) return
  elseif a == "--host" then opts.host = value(a)
  elseif a == "--port" then opts.port = number(a)
  elseif a == "--api-key" then opts.api_key = value(a)
  elseif a == "--slots" then opts.slots = number(a)
  elseif a == "--max-len" then opts.max_len = number(a)
  elseif a == "--max-tokens" then opts.max_tokens = number(a)
  elseif a == "--max-body" then opts.max_body = number(a)
  elseif a == "--max-messages" then opts.max_messages = number(a)
  elseif a == "--max-schema-bytes" then opts.max_schema_bytes = number(a)
  elseif a == "--max-connections" then opts.max_connections = number(a)
  elseif a == "--max-connections-per-client" then opts.max_connections_per_client = number(a)
  elseif a == "--header-timeout" then opts.header_timeout = number(a)
  elseif a == "--idle-timeout" then opts.idle_timeout = number(a)
  elseif a == "--prefix-cache-mb" then opts.prefix_cache_mb = number(a)
  elseif a == "--adapter" then opts.adapter = value(a)
  elseif a == "--deterministic" then opts.deterministic = true
  elseif a == "--quant" then opts.quant = value(a)
  elseif a == "--served-model-name" or a == "--name" then opts.name = value(a)
  elseif a:sub(1, 2) == "--" then error(("clrt serve: unknown option %s\n%s"):format(a, usage), 0)
  elseif not dir then dir = a
  else error(("clrt serve: unexpected argument '%s'\n%s"):format(a, usage), 0) end
  i = i + 1
end
if not dir then error("clrt serve: which model folder?\n" .. usage, 0) end
for _, k in ipairs({ "max_messages", "max_schema_bytes", "max_connections", "max_connections_per_client", "header_timeout", "idle_timeout" }) do
  local v = opts[k]
  if v ~= nil and (v < 1 or v ~= math.floor(v) or v > 2 ^ 31 - 1) then
    error(("clrt serve: --%s must be a positive integer (got %s)"):format(k:gsub("_", "-"), tostring(v)), 0)
  end
end
if opts.quant and opts.quant ~= "int8" and opts.quant ~= "none" then
  error(("clrt serve: --quant %s: int8 or none\n%s"):format(opts.quant, usage), 0)
end
opts.api_key = opts.api_key or os.getenv("CLRT_API_KEY")

local where = require("clrt.model_path").resolve(dir, { who = "clrt serve", adapter = opts.adapter })
local m = require("clrt.model").load(where.model, { adapter = where.adapter, quant = opts.quant })
local tok = require("clrt.tokenizer").load(where.tokenizer)
-- a chat template that cannot render within its budget fails here, not on every request
local template_ok, template_err = pcall(require("clrt.chat").check_template, tok)
if not template_ok then
  io.stderr:write("clrt serve: ", (tostring(template_err):gsub("^chat: ", "")), "\n")
  os.exit(1)
end
if opts.deterministic then m:set_batch_invariant(true) end
opts.model, opts.tokenizer, opts.adapter, opts.deterministic, opts.quant = m, tok, nil, nil, nil
opts.name = opts.name or dir:gsub("/+$", ""):match("([^/]+)$")
opts.max_len = opts.max_len or math.min(m.config.max_position_embeddings or 4096, 4096)
opts.log = function(line) io.stderr:write(os.date("%H:%M:%S "), line, "\n") end
local started, srv = pcall(require("clrt.net.openai_server").new, opts)
if not started then   -- a busy port or a bad address: one line, no traceback
  io.stderr:write("clrt serve: ", (tostring(srv):gsub("^[^\n]-%.lua:%d+: ", ""):gsub("^serve: ", "")), "\n")
  os.exit(1)
end
io.stdout:write(("clrt serve: %s on http://%s:%d/v1 (%d slots x %d tokens%s)\n")
  :format(opts.name, opts.host or "127.0.0.1", srv:port(), opts.slots or 32, opts.max_len,
    m:quant() == "int8" and ", int8 weights" or ""))
io.stdout:flush()
local ok, err = pcall(srv.run, srv)
srv:stop()
if not ok and not tostring(err):find("interrupted", 1, true) then error(err, 0) end
