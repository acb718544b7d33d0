-- clrt.api.prices — what one chat completion costs, in US dollars, from its usage.
--   local p = prices.lookup("gpt-4o-mini")           -- {input =, cached_input =, output =} or nil
--   local p = prices.lookup("my-model", {input = 1, output = 2})   -- an override wins
--   prices.cost(p, {prompt_tokens =, cached_tokens =, completion_tokens =}) -> dollars
-- Prices are US dollars per million tokens: input (prompt tokens not served from the
-- provider's prompt cache), cached_input (those that were; the input price when a model has
-- none) and output (completion tokens, reasoning tokens included, as OpenAI bills them).
-- The defaults are OpenAI's standard-tier list prices for the models the recipes name and
-- their close relatives, read on 2026-11-25 (docs/api_cost.md says from where); a model not
-- listed has no price unless the config gives one (judge.price, sim_cfg.price).
local M = {}

M.READ_ON = "2026-11-25"
M.DEFAULTS = {
  ["gpt-4o-mini"] = { input = 0.15, cached_input = 0.075, output = 0.60 },
  ["gpt-4o"] = { input = 2.50, cached_input = 1.25, output = 10.00 },
  ["gpt-4.1"] = { input = 2.00, cached_input = 0.50, output = 8.00 },
  ["gpt-4.1-mini"] = { input = 0.40, cached_input = 0.10, output = 1.60 },
  ["gpt-4.1-nano"] = { input = 0.10, cached_input = 0.025, output = 0.40 },
}

-- A price table given in a config: {input =, output =, cached_input = (optional)}, numbers >= 0.
function M.check(p, where)
  if type(p) ~= "table" then error(("%s must be a table {input =, cached_input =, output =} (dollars per million tokens)"):format(where), 0) end
  for k, v in pairs(p) do
    if k ~= "input" and k ~= "cached_input" and k ~= "output" then
      error(("%s: unknown key '%s' (known: input, cached_input, output)"):format(where, tostring(k)), 0)
    end
    if type(v) ~= "number" or v ~= v or v < 0 or v == math.huge then
      error(("%s.%s must be a number >= 0 (dollars per million tokens), got %s"):format(where, k, tostring(v)), 0)
    end
  end
  if p.input == nil or p.output == nil then error(("%s needs input and output"):format(where), 0) end
  return p
end

-- The price of `model`: the override when given, else the default for the name, else for the
-- name less a dated suffix ("gpt-4o-mini-2024-07-18" is gpt-4o-mini); nil when unknown.
function M.lookup(model, override)
  if override ~= nil then return M.check(override, "price") end
  if type(model) ~= "string" then return nil end
  return M.DEFAULTS[model] or M.DEFAULTS[model:gsub("%-%d%d%d%d%-%d%d%-%d%d$", "")]
end

-- Whether a base URL names this machine (localhost, 127.x.x.x, [::1]): a model served here.
function M.is_local(base_url)
  if type(base_url) ~= "string" then return false end
  local host = base_url:lower():match("^%a[%w+.-]*://%[([^%]]+)%]") or base_url:lower():match("^%a[%w+.-]*://([^/:?#]+)")
  if not host then return false end
  return host == "localhost" or host == "::1" or host:match("^127%.%d+%.%d+%.%d+$") ~= nil
end

function M.cost(p, usage)
  if not p then return nil end
  local prompt, cached = usage.prompt_tokens or 0, usage.cached_tokens or 0
  cached = math.min(cached, prompt)
  return ((prompt - cached) * p.input + cached * (p.cached_input or p.input)
    + (usage.completion_tokens or 0) * p.output) / 1e6
end

return M
