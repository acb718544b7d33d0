-- clrt merge BASE_DIR ADAPTER_DIR OUT_DIR
-- Folds a LoRA adapter (PEFT's adapter_config.json + adapter_model.safetensors) into its base:
-- OUT_DIR is a full Hugging Face folder (config.json, model.safetensors and the base's tokenizer
-- files) whose weights are W + alpha/r B A, so its logits equal the base with the adapter.
local files = require("clrt.files")
local usage = "usage: clrt merge BASE_DIR ADAPTER_DIR OUT_DIR"
local args = { ... }
if args[1] == "--help" or args[1] == "-h" then print(usage) return end
if #args ~= 3 then error("clrt merge: expected three folders\n" .. usage, 0) end
local base, adapter, out = args[1], args[2], args[3]
for _, d in ipairs({ base, adapter }) do
  if not files.is_dir(d) then error(("clrt merge: %s is not a folder\n%s"):format(d, usage), 0) end
end
local m = require("clrt.model").load(base, { adapter = adapter })
local n = #m.lora_names
m:merge_adapter()
files.mkdir_p(out)
m:save(out)
for _, f in ipairs(require("clrt.train.checkpoint").TOKENIZER_FILES) do
  if files.exists(base .. "/" .. f) then files.copy(base .. "/" .. f, out .. "/" .. f) end
end
print(("clrt merge: %d adapter tensors of %s merged into %s -> %s"):format(n, adapter, base, out))
