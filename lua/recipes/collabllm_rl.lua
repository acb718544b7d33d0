-- collabllm_rl.lua — CollabLLM RL training (shared/spec/collabllm.md).
-- Not built yet: this recipe needs the transformer (issue 3), the tokenizer (issue 4),
-- generation (issue 5), the HTTP client and scheduler (issue 6) and the recipe itself
-- (issue 7). Until then it says so instead of pretending to train.
io.stderr:write([[
clrt recipes/collabllm_rl.lua: the CollabLLM RL recipe is not implemented yet.
Missing: the transformer with backward and AdamW, the tokenizer and chat templates,
batched generation, the simulator/judge HTTP client and the rollout scheduler, and the
recipe with its built-in world. The runtime, the REPL and tensors work today: try `clrt`.
]])
os.exit(1)
