-- Files that would load wrong without a word (issue 46): a config value past 32 bits is named
-- as such, not wrapped to -2147483648; a products of widths past 32 bits is refused; duplicate
-- or fractional vocabulary ids are one error naming tokenizer.json; an eos_token missing from
-- the vocabulary is a warning naming tokenizer_config.json.
local T = require("clrt.test")
package.path = T.source_dir() .. "/tests/?.lua;" .. package.path
local files = require("clrt.files")
local json = require("clrt.json")

local root = T.tmpdir()
local dir = require("support.tiny_model")(root .. "/tiny", { seed = 1 })

local function copy_with(name, edit)
  local out = root .. "/" .. name
  files.mkdir_p(out)
  for _, f in ipairs(files.list(dir)) do files.copy(dir .. "/" .. f, out .. "/" .. f) end
  edit(out)
  return out
end

local function edit_json(path, fn)
  local v = json.decode(T.read(path))
  fn(v)
  files.write_atomic(path, json.encode(v))
end

T.case("hidden_size 2^40 is named as too large, not wrapped to a negative number", function()
  local d = copy_with("big", function(o) edit_json(o .. "/config.json", function(c) c.hidden_size = 2 ^ 40 end) end)
  local ok, err = pcall(clrt.model.load, d)
  T.ok(not ok, "refused")
  err = tostring(err)
  T.ok(err:find(d .. "/config.json", 1, true) and err:find("hidden_size", 1, true) and err:find("1099511627776", 1, true), err)
  T.ok(not err:find("-2147483648", 1, true), err)
end)

T.case("num_attention_heads x head_dim past 32 bits is refused before anything is sized from it", function()
  local d = copy_with("wide", function(o)
    edit_json(o .. "/config.json", function(c) c.num_attention_heads, c.num_key_value_heads, c.head_dim = 2 ^ 20, 2 ^ 20, 2 ^ 12 end)
  end)
  local ok, err = pcall(clrt.model.load, d)
  T.ok(not ok and tostring(err):find("4294967296", 1, true), tostring(err))
end)

T.case("duplicate and fractional vocabulary ids are one error naming tokenizer.json", function()
  local dup = copy_with("dup", function(o)
    edit_json(o .. "/tokenizer.json", function(tj)
      local a, b
      for k in pairs(tj.model.vocab) do if not a then a = k elseif not b then b = k end end
      tj.model.vocab[b] = tj.model.vocab[a]
    end)
  end)
  local ok, err = pcall(clrt.tokenizer.load, dup)
  T.ok(not ok and tostring(err):find(dup .. "/tokenizer.json", 1, true) and tostring(err):find("is given to both", 1, true), tostring(err))
  local frac = copy_with("frac", function(o)
    edit_json(o .. "/tokenizer.json", function(tj) local k = next(tj.model.vocab); tj.model.vocab[k] = 3.5 end)
  end)
  ok, err = pcall(clrt.tokenizer.load, frac)
  T.ok(not ok and tostring(err):find("id 3.5, not an integer", 1, true) and tostring(err):find(frac, 1, true), tostring(err))
end)

T.case("an eos_token missing from the vocabulary is a warning naming tokenizer_config.json", function()
  local d = copy_with("eos", function(o) edit_json(o .. "/tokenizer_config.json", function(c) c.eos_token = "<|no such token|>" end) end)
  local bin = os.getenv("CLRT_BIN") or arg[-1]
  local p = io.popen(("%s -e 'clrt.tokenizer.load(%q)' 2>&1"):format(bin, d))
  local out = p:read("*a")
  p:close()
  T.ok(out:find(d .. "/tokenizer_config.json", 1, true) and out:find("<|no such token|>", 1, true)
    and out:find("not in the vocabulary", 1, true), out)
end)

T.run()
