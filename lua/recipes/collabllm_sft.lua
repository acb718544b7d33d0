-- collabllm_sft.lua — multi-turn SFT: the loss on every assistant message (clrt.chat.render
-- masks), right-padded batches (never cropped), warm-up + cosine learning rate, validation
-- loss. The defaults are the verl recipe's for a real model (train_sft_collabllm.sh and
-- verl's SFT trainer: lr 1e-6, 64 conversations per step in micro-batches of 2, 8196
-- tokens, 3 epochs, 10% warm-up, cosine, weight decay 0.01). With no model= it loads the
-- built-in world's settings (the `sft` table of examples/collab_world/config.lua) and builds
-- the world's model from scratch: a byte-level BPE trained on the world's text and a small
-- Qwen2-style transformer.
--   clrt recipes/collabllm_sft.lua model=HF_DIR data=sft_train.jsonl [train.epochs=3] ...
-- data= is JSONL with OpenAI-style "messages" (what process_dataset.lua writes for SFT);
-- scored=FILE instead takes the best-scoring conversations of each group of a scored file
-- (MR-selected SFT; its schema in lua/clrt/train/scored.lua);
-- without it the world's generated conversations (mixing asking and guessing) are used.
-- Writes RUN_DIR/model (config.json, model.safetensors, tokenizer files), metrics.jsonl,
-- plot.svg and config.json. As a module (require "recipes.collabllm_sft") it exposes
-- defaults, parse_args and main(cfg) -> the model folder, which the RL and DPO recipes hand
-- to clrt.train.warm_start for the world's warm start.
local config = require("clrt.config")
local files = require("clrt.files")
local M = {}

M.defaults = {
  model = config.optional("string"),
  data = config.optional("string"),
  -- MR-selected SFT: a scored JSONL file (clrt.train.scored: messages, score, group); the
  -- scored_top best conversations of each group (scored_min: and at least that score) are
  -- the training data instead of data=
  scored = config.optional("string"),
  scored_top = 1,
  scored_min = config.optional("number"),
  out = "runs",
  name = "collabllm_sft",
  run_dir = config.optional("string"),
  resume = config.optional("string"),       -- a run folder: continue from its latest checkpoint
  save_every = 100,                         -- steps between checkpoints (0: none; the last step always)
  save_keep = 2,                            -- checkpoints kept (the newest that verify); an older one goes only once a newer one verifies
  stop_after = config.optional("number"),   -- end this run after that step (resume later)
  seed = 1,
  max_len = 8196,                           -- verl data.max_length; longer conversations are left out and counted
  val_fraction = 0.05,                      -- of data= when no data_val= is given
  data_val = config.optional("string"),     -- validation conversations (process_dataset's sft_test.jsonl)
  chat = { enable_thinking = config.optional("boolean") },
  world = config.map({}),                   -- the built-in world's generator settings (its config file)
  arch = config.map({}),                    -- the built-in world's model shape (its config file)
  train = { epochs = 3, steps = config.optional("number"), -- verl trainer.total_epochs
    batch_size = 64, micro_batch_size = 2,  -- verl data.train_batch_size, micro_batch_size_per_gpu
    lr = 1e-6, decay = "cosine", min_lr_ratio = 0.0, -- verl optim.lr (the recipe), lr_scheduler cosine
    warmup_ratio = 0.1, warmup_steps = config.optional("number"), -- verl warmup_steps_ratio
    weight_decay = 0.01, grad_clip = 1.0, val_every = 100,
    base_dtype = "f32",                            -- bf16 (LoRA only): the frozen base's linear weights in bf16
    precision = "f32",                             -- bf16: mixed precision as autocast(bfloat16), on the CPU's matrix unit (docs/runtime.md)
    lora = require("clrt.train.lora").config() },   -- r > 0: train LoRA adapters over model=
  dist = { check_every = 50 },              -- under mpirun: steps between parameter checks across ranks (0: none)
}

-- The built-in world's settings for this recipe (examples/collab_world/config.lua's `sft`).
function M.world_config()
  return config.read_file(M.world().config_path()).sft
end

M.rules = {
  { "seed", "count0" }, { "scored_top", "count" }, { "scored_min", "finite" }, { "max_len", "count" }, { "val_fraction", "prob" }, { "save_every", "count0" }, { "save_keep", "count" },
  { "stop_after", "count" }, { "train.epochs", "count" }, { "train.steps", "count" }, { "train.batch_size", "count" },
  { "train.micro_batch_size", "count" }, { "train.lr", "rate" }, { "train.decay", "one_of", { "constant", "cosine", "linear" } },
  { "train.min_lr_ratio", "prob" }, { "train.warmup_ratio", "prob" }, { "train.warmup_steps", "count0" },
  { "train.weight_decay", "nonneg" }, { "train.grad_clip", "nonneg" }, { "train.val_every", "count0" },
  { "dist.check_every", "count0" },
}
-- Settings a resumed run may not change: they define its data, model and batches.
M.FIXED_ON_RESUME = { "model", "data", "scored", "scored_top", "scored_min", "data_val", "seed", "max_len", "val_fraction", "world", "arch", "train.batch_size",
  "train.lora.r", "train.lora.alpha", "train.lora.targets", "train.base_dtype" }

-- Conversations of a data file, every row checked up front (file and line in the error).
function M.read_conversations(path)
  local rows, line_of = require("clrt.data").read_dataset(path)
  for i, r in ipairs(rows) do
    local where = ("collabllm_sft: %s:%d: "):format(path, line_of[i])
    if type(r) ~= "table" or type(r.messages) ~= "table" or #r.messages == 0 then
      error(where .. "a row needs a \"messages\" list", 0)
    end
    for j, msg in ipairs(r.messages) do
      if type(msg) ~= "table" or type(msg.role) ~= "string" or type(msg.content) ~= "string" then
        error(where .. ("message %d needs a \"role\" and a \"content\" string"):format(j), 0)
      end
    end
  end
  return rows
end

-- The built-in world's files (collab_world.world on the module path).
function M.world() return require("collab_world.world") end

-- A fresh model folder for the world: tokenizer trained on its text + random weights.
function M.build_world_model(dir, cfg)
  local world = M.world()
  local dist = require("clrt.dist")
  if dist.is_main() then M.build_world_tokenizer(dir, cfg, world) end
  dist.barrier()   -- the other ranks read rank 0's tokenizer
  local tok = clrt.tokenizer.load(dir)
  local arch = {
    architectures = { "Qwen2ForCausalLM" }, vocab_size = tok:vocab_size(), max_position_embeddings = cfg.max_len,
    rms_norm_eps = 1e-6, rope_theta = 10000.0, tie_word_embeddings = true,
  }
  for k, v in pairs(cfg.arch) do arch[k] = v end
  local m = clrt.model.new(arch, { seed = cfg.seed })
  return m, tok
end

function M.build_world_tokenizer(dir, cfg, world)
  local train = require("clrt.tokenizer_train")
  local info = train.folder(train.split_text(world.corpus()), {
    vocab_size = cfg.world.vocab_size, min_frequency = 1 }, dir)
  io.stderr:write(("collabllm_sft: the world's tokenizer: %d merges, vocab %d in %.2fs -> %s\n")
    :format(info.merges, info.vocab_size, info.seconds, dir))
end

-- opts (recipes/collabllm_user_sft.lua's): conversations(cfg) -> the training
-- conversations instead of scored= / data= / the world's; script: the recipe's path in
-- the resume command.
function M.main(cfg, opts)
  config.check(cfg, M.rules, "collabllm_sft")
  -- the settings first, then the folders they name
  require("clrt.train.lora").check_base_dtype(cfg.train.base_dtype, cfg.train.lora, nil, "collabllm_sft")
  if not cfg.resume then require("clrt.model_path").apply(cfg, "collabllm_sft") end
  if cfg.adapter then
    error(("collabllm_sft: model= names a LoRA checkpoint (%s over %s); fold it into its base first (clrt merge %s OUT) and pass model=OUT")
      :format(cfg.adapter, cfg.model, cfg.adapter), 0)
  end
  local run = require("clrt.run")
  local run_dir = cfg.resume or run.new_dir(cfg, "collabllm_sft")
  cfg.run_dir = run_dir
  local script = opts and opts.script or "recipes/collabllm_sft.lua"
  return run.guard(opts and opts.who or "collabllm_sft", script, run_dir, function() return M.run(cfg, run_dir, opts) end)
end

-- "loss L, val_loss V" of the run's end: this process's last step, or, when a resume had no
-- step left to run, the last ones metrics.jsonl recorded (never "nan").
function M.final_losses(last, run_dir)
  last = last or {}
  local loss, val = last.loss, last.val_loss
  if loss == nil or val == nil then
    local ok, rows = pcall(require("clrt.data").read_jsonl, run_dir .. "/metrics.jsonl")
    for _, r in ipairs(ok and rows or {}) do   -- the last row that has each
      if type(r.loss) == "number" and last.loss == nil then loss = r.loss end
      if type(r.val_loss) == "number" and last.val_loss == nil then val = r.val_loss end
    end
  end
  local parts = {}
  if loss then parts[#parts + 1] = ("loss %.4f"):format(loss) end
  if val then parts[#parts + 1] = ("val_loss %.4f"):format(val) end
  return #parts > 0 and table.concat(parts, ", ") or "no step recorded"
end

-- One line on what SFT trains on: conversations, tokens, the share of them trained on (the
-- assistant's), the longest.
function M.data_summary(train_items, val_items)
  local tokens, trained, longest = 0, 0, 0
  for _, it in ipairs(train_items) do
    tokens, longest = tokens + #it.ids, math.max(longest, #it.ids)
    for _, x in ipairs(it.mask) do trained = trained + x end
  end
  return ("collabllm_sft: %d training conversations, %d tokens (%d trained on, the assistant's: %.0f%%), longest %d; %d validation")
    :format(#train_items, tokens, trained, tokens > 0 and 100 * trained / tokens or 0, longest, #val_items)
end

function M.run(cfg, run_dir, opts)
  local data = require("clrt.data")
  local sft = require("clrt.sft")
  local checkpoint = require("clrt.train.checkpoint")
  local ckpt_dir, state
  if cfg.resume then ckpt_dir, state = checkpoint.find(run_dir) end
  local model_dir = run_dir .. "/model"
  local m, tok
  local lora = require("clrt.train.lora")
  lora.check_base_dtype(cfg.train.base_dtype, cfg.train.lora, nil, "collabllm_sft")
  if lora.enabled(cfg.train.lora) then
    if not cfg.model then error("collabllm_sft: train.lora needs model= (the base the adapters train over)", 0) end
    m, tok = lora.policy(cfg.model, ckpt_dir, cfg.train.lora, cfg.seed, nil, cfg.train.base_dtype), clrt.tokenizer.load(cfg.model)
  elseif ckpt_dir then
    m, tok = clrt.model.load(ckpt_dir), clrt.tokenizer.load(ckpt_dir)
  elseif cfg.model then
    m, tok = clrt.model.load(cfg.model), clrt.tokenizer.load(cfg.model)
  else
    m, tok = M.build_world_model(model_dir, cfg)
  end
  lora.set_precision(m, cfg.train.precision, "collabllm_sft")
  local convs
  if opts and opts.conversations then
    convs = opts.conversations(cfg)
  elseif cfg.scored then
    local info
    convs, info = require("clrt.train.scored").select(cfg.scored, { top = cfg.scored_top, min_score = cfg.scored_min })
    io.stderr:write(("collabllm_sft: %s: %d of %d conversations selected (best %d of each of %d groups)\n")
      :format(cfg.scored, info.kept, info.rows, cfg.scored_top, info.groups))
    if #convs == 0 then error("collabllm_sft: " .. cfg.scored .. ": no conversation selected", 0) end
  elseif cfg.data then
    convs = M.read_conversations(cfg.data)
  else
    convs = M.world().sft_conversations(cfg.world.conversations, cfg.seed,
      { p_ask_under = cfg.world.p_ask_under, p_ask_spec = cfg.world.p_ask_spec })
  end
  local train_c, val_c
  if cfg.data_val then
    train_c, val_c = convs, M.read_conversations(cfg.data_val)
  else
    train_c, val_c = data.split(convs, 1 - cfg.val_fraction, cfg.seed)
  end
  local notes = {}
  local ropts = { enable_thinking = cfg.chat.enable_thinking }
  local train_items, long1 = sft.encode(tok, train_c, cfg.max_len, ropts)
  local val_items, long2 = sft.encode(tok, val_c, cfg.max_len, ropts)
  if long1 + long2 > 0 then
    notes[#notes + 1] = ("collabllm_sft: %d conversations longer than max_len=%d left out"):format(long1 + long2, cfg.max_len)
  end
  if #train_items == 0 then
    error(("collabllm_sft: no training conversation fits max_len=%d (%d left out)"):format(cfg.max_len, long1), 0)
  end
  notes[#notes + 1] = M.data_summary(train_items, val_items)
  local t = {}
  for k, v in pairs(cfg.train) do t[k] = v end
  t.seed = cfg.seed
  t.check_every = cfg.dist.check_every
  -- a small data set still trains: one step then takes every conversation
  if #train_items < t.batch_size then
    notes[#notes + 1] = ("collabllm_sft: %d training conversations, fewer than batch_size=%d; using %d")
      :format(#train_items, t.batch_size, #train_items)
    t.batch_size = #train_items
  end
  if not t.steps then t.steps = t.epochs * math.max(1, math.floor(#train_items / t.batch_size)) end
  cfg.train.steps = t.steps   -- kept in config.json, so a resumed run has the same length
  if not t.warmup_steps then t.warmup_steps = math.floor(t.steps * (t.warmup_ratio or 0)) end
  local lg = clrt.log.run({ dir = run_dir, config = cfg, total_steps = t.steps,
    plot = { "loss", "val_loss", "lr", "grad_norm" }, resume_step = cfg.resume and (state and state.step or 0) or nil })
  for _, n in ipairs(notes) do lg:print(n) end
  t.start_step = state and state.step or 0
  t.optimizer_state = ckpt_dir and (ckpt_dir .. "/optimizer.safetensors") or nil
  t.stop_after = cfg.stop_after
  -- where the tokenizer files come from: the checkpoint resumed from (when it has them; an
  -- older clrt's may not), else the start model; after each save, the checkpoint just written,
  -- since a later save may delete the one resumed from
  local tok_dir = cfg.model or model_dir
  if ckpt_dir and files.exists(ckpt_dir .. "/tokenizer.json") then tok_dir = ckpt_dir end
  t.on_step = function(step, opt, last_step)
    if cfg.save_every > 0 and (step % cfg.save_every == 0 or step == last_step) then
      tok_dir = checkpoint.save(run_dir, { step = step, model = m, tokenizer_dir = tok_dir, optimizer = opt, base = cfg.model,
        keep = cfg.save_keep }) or tok_dir
    end
  end
  local last = sft.train(m, train_items, val_items, t, lg)
  lg:close()
  local done = (cfg.stop_after or t.steps) >= t.steps
  if not require("clrt.dist").is_main() then return model_dir, last end   -- rank 0 writes the model
  if done then
    if m.lora then   -- the adapter in PEFT's format, and model/ the merged full model
      m:save_adapter(run_dir .. "/adapter", { base = cfg.model })
      if m:base_dtype() == "bf16" then   -- the merge needs the f32 base: load it again
        m:free()
        m = clrt.model.load(cfg.model, { adapter = run_dir .. "/adapter" })
      end
      m:merge_adapter()
    end
    m:save(model_dir)
    for _, f in ipairs(checkpoint.TOKENIZER_FILES) do
      local src = tok_dir .. "/" .. f
      if tok_dir ~= model_dir and files.exists(src) then files.copy(src, model_dir .. "/" .. f) end
    end
    io.stderr:write(("collabllm_sft: %s -> %s\n"):format(M.final_losses(last, run_dir), model_dir))
  else
    io.stderr:write(("collabllm_sft: stopped after step %d of %d (stop_after); continue with:\n  %s\n")
      :format(cfg.stop_after, t.steps, require("clrt.run").resume_command(opts and opts.script or "recipes/collabllm_sft.lua", run_dir)))
  end
  return model_dir, last
end

-- The command line -> a config: with no model= (and no config=) the built-in world's
-- settings are loaded under the overrides.
function M.parse_args(argv)
  if config.arg_value(argv, "resume") then
    return require("clrt.run").resume_config(M.defaults, argv, M.FIXED_ON_RESUME, "collabllm_sft")
  end
  local world = not config.arg_value(argv, "model") and not config.arg_value(argv, "config")
  return config.parse(M.defaults, argv, world and M.world_config() or nil)
end

local argv = { ... }
if argv[1] == "recipes.collabllm_sft" then return M end   -- required as a module
require("clrt.run").main("collabllm_sft", "recipes/collabllm_sft.lua", argv, M.parse_args, M.main)
