-- clrt merge BASE_DIR ADAPTER_DIR OUT_DIR, or clrt merge RUN_OR_CHECKPOINT OUT_DIR
-- Folds a LoRA adapter (PEFT's adapter_config.json + adapter_model.safetensors) into its base:
-- OUT_DIR is a full Hugging Face folder (config.json, model.safetensors and the base's tokenizer
-- files) whose weights are W + alpha/r B A, so its logits equal the base with the adapter.
-- With two folders the first is a LoRA run's folder (its latest checkpoint) or checkpoint,
-- over the base its adapter_config.json names.
local files = require("clrt.files")
local model_path = require("clrt.model_path")
local usage = "usage: clrt merge BASE_DIR ADAPTER_DIR OUT_DIR | clrt merge RUN_OR_CHECKPOINT_DIR OUT_DIR"
local args = { ... }
if args[1] == "--help" or args[1] == "-h" then print(usage) return end
if #args ~= 3 and #args ~= 2 then error("clrt merge: expected two or three folders\n" .. usage, 0) end
local out = args[#args]
local base, adapter
if #args == 3 then
  base = model_path.resolve(args[1], { who = "clrt merge" }).model
  adapter = model_path.resolve(args[2], { who = "clrt merge", base = base }).adapter
else
  local where = model_path.resolve(args[1], { who = "clrt merge" })
  base, adapter = where.model, where.adapter
end
if not adapter then error(("clrt merge: %s holds no LoRA adapter (adapter_config.json)\n%s"):format(args[#args - 1], usage), 0) end
local m = require("clrt.model").load(base, { adapter = adapter })
local n = #m.lora_names
m:merge_adapter()
files.mkdir_p(out)
m:save(out)
for _, f in ipairs(require("clrt.train.checkpoint").TOKENIZER_FILES) do
  if files.exists(base .. "/" .. f) then files.copy(base .. "/" .. f, out .. "/" .. f) end
end
print(("clrt merge: %d adapter tensors of %s merged into %s -> %s"):format(n, adapter, base, out))
