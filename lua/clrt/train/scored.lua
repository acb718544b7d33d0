-- clrt.train.scored — MR-selected SFT data: the best-scoring conversations of a scored file.
--   local convs, info = scored.select(path, {top = 1, min_score = nil})
-- The file is JSONL, one conversation a line:
--   {"messages": [{"role": ..., "content": ...}, ...],   -- the whole conversation (system,
--                                                        -- prompt, replies, simulated turns)
--    "score": 0.83,                                      -- its multiturn-aware reward
--    "group": "3-7"}                                     -- optional: rows of one group (the
--                                                        -- candidates for one prompt) compete
-- collabllm_dpo.lua writes RUN_DIR/scored.jsonl in this schema in the built-in world; any
-- tool can (e.g. from the published datasets' sessions and rewards). A row without a group
-- is its own group. Per group the `top` best-scoring rows are kept (the first in file order
-- on a tie), then those below min_score are left out. info: {rows, groups, kept}.
local M = {}

function M.select(path, o)
  o = o or {}
  local top = o.top or 1
  local rows, line_of = require("clrt.data").read_dataset(path)
  local groups, order = {}, {}
  for i, r in ipairs(rows) do
    local where = ("scored: %s:%d: "):format(path, line_of[i])
    if type(r) ~= "table" or type(r.messages) ~= "table" or #r.messages == 0 then error(where .. "a row needs a \"messages\" list", 0) end
    for j, msg in ipairs(r.messages) do
      if type(msg) ~= "table" or type(msg.role) ~= "string" or type(msg.content) ~= "string" then
        error(where .. ("message %d needs a \"role\" and a \"content\" string"):format(j), 0)
      end
    end
    if type(r.score) ~= "number" or r.score ~= r.score then error(where .. "a row needs a numeric \"score\"", 0) end
    local g = r.group ~= nil and tostring(r.group) or ("\0row" .. i)
    if not groups[g] then groups[g] = {}; order[#order + 1] = g end
    local list = groups[g]
    list[#list + 1] = { row = r, i = i }
  end
  local out = {}
  for _, g in ipairs(order) do
    local list = groups[g]
    table.sort(list, function(a, b) if a.row.score ~= b.row.score then return a.row.score > b.row.score end return a.i < b.i end)
    for k = 1, math.min(top, #list) do
      local r = list[k].row
      if o.min_score == nil or r.score >= o.min_score then out[#out + 1] = { messages = r.messages, score = r.score } end
    end
  end
  return out, { rows = #rows, groups = #order, kept = #out }
end

return M
