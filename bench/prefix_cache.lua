-- bench/prefix_cache.lua — an RL step's generation pattern with the prefix cache off and on, in
-- the same run over the same random model: `prompts` prompts of `prompt` tokens, `n` first
-- responses each, then `futures` futures per response of `turns` more turns (a user turn of
-- `user` tokens, a reply), every reply `reply` tokens (no early stop: the model is random). It
-- prints the wall time of each, their ratio, the share of prompt tokens the cache served, and
-- checks that both runs sampled the same tokens (the cache must not change a single bit).
--   clrt bench/prefix_cache.lua [size=110m|0.5b] [prompts=2] [n=4] [futures=3] [turns=2]
--                               [prompt=400] [user=40] [reply=64] [block=16]
-- Timing needs a quiet machine: run it alone.
local dir = arg[0]:match("^(.*)/[^/]*$") or "."
local opts = dofile(dir .. "/args.lua").parse({ size = "110m", prompts = 2, n = 4, futures = 3, turns = 2,
  prompt = 400, user = 40, reply = 64, block = 16 }, arg)
local PC = require("clrt.gen.prefix_cache")

local shapes = {
  ["110m"] = { architectures = { "LlamaForCausalLM" }, hidden_size = 768, intermediate_size = 2048,
    num_hidden_layers = 12, num_attention_heads = 12, num_key_value_heads = 12, vocab_size = 32000,
    rms_norm_eps = 1e-5, rope_theta = 10000.0 },
  -- Qwen2.5-0.5B's shape (QKV bias, GQA 14/2, 151,936 tokens)
  ["0.5b"] = { architectures = { "Qwen2ForCausalLM" }, hidden_size = 896, intermediate_size = 4864,
    num_hidden_layers = 24, num_attention_heads = 14, num_key_value_heads = 2, vocab_size = 151936,
    rms_norm_eps = 1e-6, rope_theta = 1000000.0 },
}
local cfg = shapes[opts.size] or error("size must be one of 110m, 0.5b", 0)
cfg.max_position_embeddings = 4096
local m = clrt.model.new(cfg, { seed = 1 })
local V = cfg.vocab_size

local function tokens(n, salt)
  local t = {}
  for i = 1, n do t[i] = (i * 7919 + salt * 104729) % V end
  return t
end
local function cat(a, b)
  local out = { unpack(a) }
  for _, x in ipairs(b) do out[#out + 1] = x end
  return out
end

local function step()
  local gen = { max_new_tokens = opts.reply, temperature = 1, seed = 5, stop = {} }
  local fns = {}
  for p = 1, opts.prompts do
    fns[p] = function()
      local prompt = tokens(opts.prompt, p)
      return { prompt = prompt, outs = clrt.sched.generate(m, prompt, { n = opts.n, max_new_tokens = opts.reply,
        temperature = 1, seed = 5 }) }
    end
  end
  local t0 = clrt.log.now()
  local firsts = clrt.sched.run(fns, { raise = true })
  local jobs, sampled = {}, {}
  for p, f in ipairs(firsts) do
    for r, o in ipairs(f.outs) do
      sampled[#sampled + 1] = table.concat(o.tokens, ",")
      for k = 1, opts.futures do
        jobs[#jobs + 1] = function()
          local ctx, out = cat(f.prompt, o.tokens), {}
          for turn = 1, opts.turns do
            ctx = cat(ctx, tokens(opts.user, 1000 * p + 100 * r + 10 * k + turn))
            local reply = clrt.sched.generate(m, ctx, gen)[1]
            out[#out + 1] = table.concat(reply.tokens, ",")
            ctx = cat(ctx, reply.tokens)
          end
          return table.concat(out, "|")
        end
      end
    end
  end
  local later = clrt.sched.run(jobs, { raise = true })
  for _, s in ipairs(later) do sampled[#sampled + 1] = s end
  return clrt.log.now() - t0, table.concat(sampled, ";")
end

PC.configure(m, { mb = 0 })
step()   -- warm-up: packed weights, decoder sized
local t_off, out_off = step()
PC.configure(m, { block_tokens = opts.block })
local on = PC.of(m)
if not on then
  print("the prefix cache is off on this machine (clrt_model_kv_reusable: needs the CPU f32 path with AVX-512)")
  os.exit(0)
end
local t_on, out_on = step()
local st = on:stats()
print(("prefix cache, %s, %d prompts x %d responses x %d futures x %d turns, prompt %d, user %d, reply %d tokens")
  :format(opts.size, opts.prompts, opts.n, opts.futures, opts.turns, opts.prompt, opts.user, opts.reply))
print(("  off %.2f s   on %.2f s   speed-up %.2fx   prompt tokens served from the cache %.1f%% (%d of %d)")
  :format(t_off, t_on, t_off / t_on, 100 * st.cached_tokens / math.max(1, st.prompt_tokens), st.cached_tokens,
    st.prompt_tokens))
print(("  same tokens with and without the cache: %s"):format(out_on == out_off and "yes" or "NO"))
if out_on ~= out_off then os.exit(1) end
