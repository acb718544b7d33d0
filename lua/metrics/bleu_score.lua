-- bleu_score — sentence BLEU of the document the conversation produced against the
-- reference (sample.ground_truth, the dataset's single_turn_completion).
--
-- Default: what verl's recipe and the authors' repository compute, NLTK's
-- `sentence_bleu([ground_truth], completion)` on the two raw strings (NLTK 3.8, Debian's
-- python3-nltk; tests/lua/test_bleu_nltk.lua compares with it). A Python string is a
-- sequence of characters, so the "tokens" are Unicode code points (spaces included), not
-- words and not bytes:
--   * uniform weights 0.25 over the modified (clipped) precisions of 1- to 4-grams, one
--     reference; a precision's denominator is at least 1
--   * no smoothing: when no unigram matches the score is exactly 0; when a higher order has
--     no match its precision becomes the smallest normal double (2.2250738585072014e-308,
--     NLTK's sys.float_info.min, with a warning there), so the score is tiny (below 1e-76)
--     but not 0 — e.g. "abc" against "abcd" gives 8.75e-78
--   * brevity penalty BP = 1 if c > r, 0 if c = 0, else exp(1 - r / c) (c, r: hypothesis
--     and reference lengths in characters)
--   * an empty hypothesis or an empty reference scores 0
-- Options (ctx.metric_options.bleu_score, from reward.metric_options.bleu_score on the
-- command line: +reward.metric_options.bleu_score.level=word, or
-- 'reward.metric_options={"bleu_score":{"level":"word","smoothing":"method1"}}'):
--   level      "char" (default, the references') | "word" (whitespace-split words)
--   smoothing  "none" (default, the references') | "method1" (Chen & Cherry 2014 method 1,
--              NLTK's SmoothingFunction().method1: a zero-match order gets 0.1 / its
--              n-gram count)
--   extract    false to score the last assistant message instead of asking the judge to
--              extract the document; extract_max_tokens, prompt_file: metrics/lib/judge.lua
local judge = require("metrics.lib.judge")

local M = { name = "bleu_score", uses_judge = true }   -- uses_judge: the run checks the judge's endpoint before its first step

-- NLTK's stand-in for a zero precision (sys.float_info.min).
M.DBL_MIN = 2.2250738585072014e-308

-- The code points of a UTF-8 string, each as its bytes; a byte that starts no valid
-- sequence stands alone (so nothing is lost on malformed text).
local function code_points(text)
  local out, i, n = {}, 1, #text
  while i <= n do
    local b = text:byte(i)
    local len = b < 0x80 and 1 or (b >= 0xC2 and b <= 0xDF) and 2 or (b >= 0xE0 and b <= 0xEF) and 3
      or (b >= 0xF0 and b <= 0xF4) and 4 or 1
    for k = i + 1, i + len - 1 do
      local c = text:byte(k)
      if not c or c < 0x80 or c > 0xBF then len = 1 break end
    end
    out[#out + 1] = text:sub(i, i + len - 1)
    i = i + len
  end
  return out
end

local function tokens(text, level)
  if level == "char" then return code_points(text) end
  local out = {}
  for w in text:gmatch("%S+") do out[#out + 1] = w end
  return out
end

local function ngrams(toks, n)
  local counts, total = {}, 0
  for i = 1, #toks - n + 1 do
    local g = table.concat(toks, "\1", i, i + n - 1)
    counts[g] = (counts[g] or 0) + 1
    total = total + 1
  end
  return counts, total
end

-- BLEU of two strings; exposed for tests and other scripts.
-- opts: level ("char"), smoothing ("none"), max_n (4), eps (0.1, method1's epsilon).
-- (A string as opts is the level, for callers of the old signature bleu(h, r, level).)
function M.bleu(hypothesis, reference, opts)
  if type(opts) == "string" then opts = { level = opts } end
  opts = opts or {}
  local level, smoothing = opts.level or "char", opts.smoothing or "none"
  local max_n, eps = opts.max_n or 4, opts.eps or 0.1
  if level ~= "word" and level ~= "char" then
    error("bleu_score: level must be 'char' or 'word', got " .. tostring(level), 2)
  end
  if smoothing ~= "none" and smoothing ~= "method1" then
    error("bleu_score: smoothing must be 'none' or 'method1', got " .. tostring(smoothing), 2)
  end
  local h, r = tokens(hypothesis, level), tokens(reference, level)
  local logsum = 0
  for n = 1, max_n do
    local hc, total = ngrams(h, n)
    local rc = ngrams(r, n)
    local match = 0
    for g, c in pairs(hc) do match = match + math.min(c, rc[g] or 0) end
    if match == 0 and n == 1 then return 0 end   -- NLTK: no unigram match is exactly 0
    local p
    if match > 0 then p = match / math.max(total, 1)
    elseif smoothing == "method1" then p = eps / math.max(total, 1)
    else p = M.DBL_MIN end
    logsum = logsum + math.log(p) / max_n
  end
  local c, rl = #h, #r
  local bp = (c > rl) and 1 or math.exp(1 - rl / c)
  return bp * math.exp(logsum)
end

function M.compute(conversation, sample, ctx)
  if sample.ground_truth == nil then error("bleu_score: sample has no ground_truth (reference)", 0) end
  local opts = judge.options(ctx, "bleu_score")
  local doc = judge.final_completion(conversation, sample, ctx, "bleu_score", "document")
  return M.bleu(doc, tostring(sample.ground_truth), { level = opts.level, smoothing = opts.smoothing })
end

return M
