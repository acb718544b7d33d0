-- The built-in world's settings for collabllm_dpo.lua (offline and online DPO), laid over
-- config.lua (whose RL-only `train` table is left out). The recipe's own defaults are for a
-- real model (TRL's DPO defaults at verl's learning rate); a ~0.9M-parameter model trained
-- from scratch needs a far larger step, as the RL settings do. Not tuned: chosen once so a
-- variant runs in about the time of the GRPO run, and reported as measured.
return {
  steps = 60,                 -- optimizer steps (offline: over the world's pairs; online: sampling steps)
  save_every = 10,
  min_gap = 0.1,
  pairs_prompts = 256,        -- offline: 256 training prompts x rollout.n = 8 scored candidates
  train = { lr = 2e-4, decay = "cosine", min_lr_ratio = 0.1, warmup_steps = 3, weight_decay = 0.0, grad_clip = 1.0,
    beta = 0.1, label_smoothing = 0.0, batch_size = 16, micro_batch_size = 32 },
  -- the world's DPO was measured over the verl-style base (full fine-tuning, LoRA alpha 2r
  -- when r is given), not the authors' preset (LoRA r 32 / alpha 16, ...)
  preset = "verl",
}
