-- The world's user model (recipes/collabllm_user_sft.lua with no model=; sim=user_lm,
-- docs/user_models.md): these settings over config.lua's `sft` table, so the same model
-- shape and schedule, trained on the world's conversations seen from the user's side. Half
-- of them ask, so the user model sees as many questions to answer as answers after which
-- it ends the chat.
return {
  world = { conversations = 4000, p_ask_under = 0.5, p_ask_spec = 0.5, vocab_size = 512 },
}
