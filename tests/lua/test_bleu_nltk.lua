-- bleu_score against NLTK itself: Debian's python3-nltk (/usr/bin/python3) scores a seeded
-- corpus of 320 document pairs with `sentence_bleu([reference], hypothesis)` on the raw
-- strings (what verl's recipe and the authors' repository call), and clrt's default must
-- agree within 1e-9 on every pair; the word-level + method1 option must agree with NLTK on
-- split() tokens with SmoothingFunction().method1.
-- NLTK is called here rather than through a committed fixture: the corpus (edits, truncations,
-- non-ASCII text, empty and very short strings) is the point of the test, and a fixture of
-- 320 documents would pin only what it holds; the hand-computed cases in test_metrics.lua run
-- where NLTK is absent. Without python3-nltk this test skips (exit 77) and says so.
local T = require("clrt.test")
local json = require("clrt.json")
local bleu = require("metrics.bleu_score")

local PY = "/usr/bin/python3"
if os.execute(PY .. " -c 'import nltk.translate.bleu_score' >/dev/null 2>&1") ~= 0 then
  io.write("skip: Debian's python3-nltk is not installed (/usr/bin/python3 cannot import nltk)\n")
  os.exit(77)
end

-- A seeded generator of its own (a 31-bit LCG), so the corpus never changes under us.
local state = 20250611
local function rand(n)
  state = (state * 1103515245 + 12345) % 2147483648
  return math.floor(state / 65536) % n + 1   -- the high bits: an LCG's low bits cycle fast
end

local WORDS = { "the", "garden", "party", "moves", "to", "Saturday", "at", "four", "bring", "a", "dish",
  "we", "will", "set", "up", "tables", "three", "thanks", "optimism", "leads", "better", "health",
  "résumé", "naïve", "café", "—", "“quoted”", "über", "日本語", "emoji😀", "data,", "model.", "(notes)",
  "it's", "x", "is", "of", "and", "in", "on" }

local function document(nwords)
  local w = {}
  for i = 1, nwords do w[i] = WORDS[rand(#WORDS)] end
  local text = table.concat(w, " ")
  if rand(4) == 1 then text = text:gsub(" ", "\n", 2) end
  return text
end

-- A hypothesis made from the reference the way an extracted draft differs from it.
local function edited(ref)
  local words = {}
  for w in ref:gmatch("%S+") do words[#words + 1] = w end
  local kind = rand(6)
  if kind == 1 then                 -- a few words replaced
    for _ = 1, rand(5) do if #words > 0 then words[rand(#words)] = WORDS[rand(#WORDS)] end end
  elseif kind == 2 then             -- a prefix (brevity penalty)
    local keep = {}
    for i = 1, math.max(1, math.floor(#words * rand(9) / 10)) do keep[i] = words[i] end
    words = keep
  elseif kind == 3 then             -- longer than the reference
    for _ = 1, rand(20) do words[#words + 1] = WORDS[rand(#WORDS)] end
  elseif kind == 4 then             -- shuffled
    for i = #words, 2, -1 do local j = rand(i); words[i], words[j] = words[j], words[i] end
  elseif kind == 5 then             -- unrelated text
    return document(rand(60))
  end                               -- kind 6: identical
  return table.concat(words, " ")
end

local pairs_list = {}
for i = 1, 300 do
  local ref = document(5 + rand(120))
  pairs_list[i] = { hyp = edited(ref), ref = ref }
end
-- the edges: empty, shorter than 4 characters, no unigram match, one character, equal
local edges = { { "", "abc" }, { "abc", "" }, { "", "" }, { "abc", "abcd" }, { "a", "a" }, { "ab", "ab" },
  { "xyz", "abc" }, { "abcd", "abcd" }, { "é", "é" }, { "éa", "aé" }, { "ab ab ab ab", "ab ab" },
  { "the cat", "the cat sat on the mat" }, { "a", "b c d e" }, { "日本語のテキスト", "日本語" },
  { "same words", "words same" }, { "  ", " " }, { "q", "qqqqq" }, { "abcdef", "abc" }, { "\n\n\n\n", "\n\n\n\n" },
  { "x y z w", "x y z w" } }
for _, e in ipairs(edges) do pairs_list[#pairs_list + 1] = { hyp = e[1], ref = e[2] } end

local NLTK = [==[
import json, sys, warnings
from nltk.translate.bleu_score import sentence_bleu, SmoothingFunction
warnings.simplefilter("ignore")
rows = json.load(open(sys.argv[1], encoding="utf-8"))
m1 = SmoothingFunction().method1
out = []
for r in rows:
    out.append({"char": float(sentence_bleu([r["ref"]], r["hyp"])),
                "word": float(sentence_bleu([r["ref"].split()], r["hyp"].split(), smoothing_function=m1))})
json.dump(out, open(sys.argv[2], "w"), allow_nan=False)
]==]

local dir = T.tmpdir()
local function write(path, text) local f = assert(io.open(path, "wb")); f:write(text); f:close() end
write(dir .. "/pairs.json", json.encode(pairs_list))
write(dir .. "/ref.py", NLTK)
local rc = os.execute(("%s %s/ref.py %s/pairs.json %s/scores.json"):format(PY, dir, dir, dir))
assert(rc == 0, "NLTK reference script failed")
local want = json.decode(T.read(dir .. "/scores.json"))

T.case("default = NLTK sentence_bleu on raw strings, within 1e-9 on every pair", function()
  T.eq(#want, #pairs_list)
  local worst, at, nonzero = 0, 0, 0
  for i, p in ipairs(pairs_list) do
    local got = bleu.bleu(p.hyp, p.ref)
    local d = math.abs(got - want[i].char)
    if d > worst then worst, at = d, i end
    if want[i].char > 1e-6 then nonzero = nonzero + 1 end
  end
  T.ok(worst <= 1e-9, ("pair %d: clrt %.17g, NLTK %.17g (hyp %q, ref %q)"):format(at,
    at > 0 and bleu.bleu(pairs_list[at].hyp, pairs_list[at].ref) or 0, at > 0 and want[at].char or 0,
    at > 0 and pairs_list[at].hyp:sub(1, 60) or "", at > 0 and pairs_list[at].ref:sub(1, 60) or ""))
  -- the corpus covers the range: many clearly non-zero scores, some exactly 1, some exactly 0
  T.ok(nonzero > 150, "non-zero scores: " .. nonzero)
  local ones, zeros = 0, 0
  for i = 1, #want do
    if want[i].char == 1 then ones = ones + 1 end
    if want[i].char == 0 then zeros = zeros + 1 end
  end
  T.ok(ones >= 10 and zeros >= 3, ("ones %d zeros %d"):format(ones, zeros))
end)

T.case("NLTK's edge behaviour: tiny not zero without a higher-order match, 0 without a unigram", function()
  -- "abc" vs "abcd": no 4-gram in the hypothesis -> sys.float_info.min stands in for p4
  T.near(bleu.bleu("abc", "abcd"), 8.751273976943354e-78, 1e-90)
  T.ok(bleu.bleu("abc", "abcd") > 0)
  T.eq(bleu.bleu("xyz", "abc"), 0); T.eq(bleu.bleu("", "abc"), 0); T.eq(bleu.bleu("abc", ""), 0)
  T.eq(bleu.bleu("abcd", "abcd"), 1)
end)

T.case("word level with method1 smoothing = NLTK on split() words with method1", function()
  local worst, at = 0, 0
  for i, p in ipairs(pairs_list) do
    local d = math.abs(bleu.bleu(p.hyp, p.ref, { level = "word", smoothing = "method1" }) - want[i].word)
    if d > worst then worst, at = d, i end
  end
  T.ok(worst <= 1e-9, ("pair %d differs by %g"):format(at, worst))
end)

T.run()
