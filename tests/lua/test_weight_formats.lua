-- test_weight_formats.lua — each weight copy takes its format and that format's kernels when
-- it is made (runtime/model/weights.c, device.c's policy), and m:products() says what a
-- computation ran on: f32 panels once a copy is made, f32 rows before; bf16 pairs or rows
-- under set_matmul("bf16"); batch invariance choosing the row-wise sets again without
-- remaking a copy; the f32 master after the CPU level drops below the one a copy's kernels
-- were chosen at (its layout kept, its kernels chosen again).
local T = require("clrt.test")
local ffi = require("ffi")
local model = require("clrt.model")

local CFG = { architectures = { "Qwen2ForCausalLM" }, vocab_size = 301, hidden_size = 96,
  intermediate_size = 200, num_hidden_layers = 2, num_attention_heads = 4, num_key_value_heads = 2,
  max_position_embeddings = 128, rms_norm_eps = 1e-6, tie_word_embeddings = false }
local ROWS = { { 5, 17, 42, 7, 99, 3, 250, 11 }, { 8, 1, 2, 3, 4, 5, 6, 7 } }

local level = model.cpu_paths():match("^kernels (%S+)")
local vector = level ~= "portable"

local function score(m) return m:logprobs(ROWS, { grad = false }) end

T.case("before any computation nothing is named", function()
  T.eq(model.new(CFG, { seed = 1 }):products(), nil)
end)

T.case("f32: panels once logprobs made the copy, the tiles as the master", function()
  if not vector then T.skip("the f32 panels have no portable kernels (CLRT_CPU=portable)") end
  local m = model.new(CFG, { seed = 1 })
  score(m)
  local p = m:products()
  T.ok(p.format:find("^f32 panels"), p.format)
  T.eq(p.kernels, "f32 panels")
  T.eq(p.master, "f32 rows: tiles")
  local repacks = m:copy_repacks()
  m:set_batch_invariant(true)
  score(m)
  p = m:products()
  T.eq(p.kernels, "f32 panels")
  T.eq(p.master, "f32 rows: row-wise, tiles backward")
  T.eq(m:copy_repacks(), repacks, "batch invariance remade no copy")
end)

T.case("f32 without the packed copy: the master's rows, sgemm", function()
  local m = model.new(CFG, { seed = 1 }):set_decode_pack(false)
  score(m)
  local p = m:products()
  T.ok(p.format:find("^f32 rows"), p.format)
  T.eq(p.kernels, "f32 rows: sgemm")
  T.eq(p.kernels, p.master)
end)

T.case("bf16: pairs where the CPU takes panels, rows without them", function()
  if not vector then T.skip("bf16 panels need a vector level (CLRT_CPU=portable)") end
  local m = model.new(CFG, { seed = 1 }):set_matmul("bf16")
  score(m)
  local p = m:products()
  T.ok(p.format:find("^bf16 panels of pairs"), p.format)
  T.ok(p.kernels:find("^bf16 pairs"), p.kernels)
end)

T.case("bf16 rows: batch invariance chooses the row-wise kernels for the copy it has", function()
  local m = model.new(CFG, { seed = 1 }):set_decode_pack(false):set_matmul("bf16")
  local dec = m:decoder(1, 16)
  local logits = ffi.new("float[?]", CFG.vocab_size)
  local function prefill(row) dec:prefill(0, ffi.new("int32_t[?]", #row, row), #row, logits) end
  prefill(ROWS[1])
  local p = m:products()
  T.eq(p.format, "bf16 rows [O, K]")
  T.eq(p.kernels, "bf16 rows")
  local repacks = m:copy_repacks()
  m:set_batch_invariant(true)
  prefill(ROWS[2])
  p = m:products()
  T.eq(p.format, "bf16 rows [O, K]")
  T.eq(p.kernels, "bf16 rows: row-wise")
  T.eq(m:copy_repacks(), repacks, "no copy remade")
  dec:free()
end)

-- Last: the level is the process's.
T.case("a lower CPU level chooses a made copy's kernels again", function()
  if not vector then T.skip("already at the portable level") end
  local m = model.new(CFG, { seed = 1 })
  local before = T.floats(score(m))
  T.eq(m:products().kernels, "f32 panels")
  model.cpu_paths("portable")
  T.cleanup(function() model.cpu_paths(level) end)
  local after = T.floats(score(m))
  local p = m:products()
  T.ok(p.format:find("^f32 panels"), "the copy is still current: " .. p.format)
  T.eq(p.kernels, "f32 rows: sgemm", "the panels have no portable kernels: the master runs")
  T.eq(p.master, "f32 rows: sgemm")
  for i = 1, #before do T.near(after[i], before[i], 1e-4, "logprob " .. i) end
end)

T.run()
