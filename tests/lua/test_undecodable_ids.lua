-- Ids the tokenizer cannot decode are never sampled (issue 32): a model's embedding may have
-- rows beyond its tokenizer's ids (Qwen2.5: 151,936 rows for 151,665 ids), and one sampled at
-- temperature 1 used to end the RL step with "tokenizer: id ... is not in the vocabulary".
-- A tiny random model with 300 such rows over a trained byte-level BPE: the same seeds that
-- pick those ids when nothing decodes (no tokenizer given) never pick them through
-- m:generate, clrt.sched.generate (the RL rollouts' path) or `clrt serve`.
local T = require("clrt.test")
package.path = T.source_dir() .. "/tests/?.lua;" .. package.path
local cjson = require("cjson")

local root = T.tmpdir()
local dir = require("support.tiny_model")(root .. "/model", { seed = 3, extra_rows = 300 })
local tok, m = clrt.tokenizer.load(dir), clrt.model.load(dir)
local N, V = tok:vocab_size(), m.config.vocab_size
local prompt = tok:encode("hello there, how are you")

local function undecodable(outs)
  local n = 0
  for _, o in ipairs(outs) do
    for _, id in ipairs(o.tokens) do if id >= N then n = n + 1 end end
  end
  return n
end

T.case("the seeds used below do pick undecodable ids when nothing masks them", function()
  T.eq(V, N + 300)
  local outs = m:generate({ prompt }, { temperature = 1, max_new_tokens = 24, seed = 7, n = 4 })
  T.ok(undecodable(outs) > 10, ("%d of 96 sampled ids are beyond the tokenizer"):format(undecodable(outs)))
  T.raises(function() tok:decode(outs[1].tokens) end, "not in the vocabulary")
end)

T.case("m:generate and clrt.sched.generate with the tokenizer sample only ids it has", function()
  local opts = { temperature = 1, max_new_tokens = 24, seed = 7, n = 4, tokenizer = tok, top_logprobs = 5 }
  local outs = m:generate({ prompt }, opts)
  T.eq(undecodable(outs), 0)
  for _, o in ipairs(outs) do
    T.eq(#o.tokens, 24)
    T.eq(o.text, tok:decode(o.tokens, { skip_special_tokens = true }))
  end
  -- greedy too: the untrained rows may hold the largest logit
  T.eq(undecodable(m:generate({ prompt }, { temperature = 0, max_new_tokens = 24, tokenizer = tok })), 0)
  local results, errors = clrt.sched.run({
    function() return clrt.sched.generate(m, prompt, { temperature = 1, max_new_tokens = 24, seed = 7, n = 4, tokenizer = tok,
      seed_key = "rl/step 1/prompt 1" }) end,
    function() return clrt.sched.generate(m, prompt, { temperature = 1.5, max_new_tokens = 24, seed = 8, n = 4, tokenizer = tok }) end,
  })
  T.eq(errors, {})
  T.eq(undecodable(results[1]) + undecodable(results[2]), 0)
end)

T.case("clrt serve samples only ids the tokenizer has, top_logprobs included", function()
  if os.execute("command -v curl > /dev/null 2>&1") ~= 0 then T.skip("curl is not installed") end
  local srv = require("support.serve")(dir, "--slots 8 --max-len 256 --served-model-name m")
  for seed = 1, 4 do
    local body = cjson.encode({ model = "m", messages = { { role = "user", content = "hello there" } }, temperature = 1,
      seed = seed, max_tokens = 24, logprobs = true, top_logprobs = 5 })
    local f = assert(io.open(root .. "/body.json", "w"))
    f:write(body)
    f:close()
    local p = assert(io.popen(("curl -s -m 60 --data-binary @%s/body.json -H 'Content-Type: application/json' %s/chat/completions")
      :format(root, srv.url)))
    local reply = p:read("*a")
    p:close()
    local ok, r = pcall(cjson.decode, reply)
    T.ok(ok and r.choices, "seed " .. seed .. ": a reply, not an error: " .. reply)
    local content = r.choices[1].logprobs.content
    T.ok(#content >= 1, "seed " .. seed .. ": tokens with their log-probabilities")
    if r.choices[1].finish_reason == "length" then T.eq(#content, 24) end
    for _, e in ipairs(content) do
      T.eq(type(e.token), "string")
      T.eq(#e.top_logprobs, 5)
    end
  end
end)

T.run()
