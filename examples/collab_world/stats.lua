-- The world's held-out figures and their mean ± sd over seeds (report.lua and compare.lua).
local M = {}

-- What world.summarize reports and the README's tables show, in that order.
M.KEYS = { "accuracy_underspecified", "accuracy_specified", "ask_rate_underspecified",
  "ask_rate_specified", "tokens_per_conversation" }

-- Mean and sample standard deviation (n - 1; 0 for a single value).
function M.mean_sd(xs)
  local n, s = #xs, 0
  for _, x in ipairs(xs) do s = s + x end
  local m = s / n
  local v = 0
  for _, x in ipairs(xs) do v = v + (x - m) ^ 2 end
  return m, n > 1 and math.sqrt(v / (n - 1)) or 0
end

-- "0.940 ± 0.061" (tokens with two decimals).
function M.format(key, m, sd)
  local fmt = key == "tokens_per_conversation" and "%.2f ± %.2f" or "%.3f ± %.3f"
  return fmt:format(m, sd)
end

return M
