-- clrt.train.warm_start — a world's SFT warm start, trained once and cached: the RL and DPO
-- recipes each call it when no model= is given. The SFT trainer and the world come from the
-- caller (the library never loads a recipe or an example itself).
--   local dir = warm_start.ensure(cfg, world, require("recipes.collabllm_sft"), "collabllm_rl")
--   warm_start.dir(cfg, world)    -- where it is (or will be) kept
-- cfg: seed, sft_cache (the cache's root), sft (the SFT settings over the trainer's defaults);
-- world: version (bumped when its text changes); sft: {defaults, parse_args(argv), main(cfg)
-- -> the model folder}, the collabllm_sft recipe's module.
local config = require("clrt.config")
local files = require("clrt.files")
local M = {}

-- 8 hex digits of FNV-1a over s: names a cache folder after the settings that made it.
local function short_hash(s)
  local bit = require("bit")
  local h = 0x811c9dc5
  for i = 1, #s do
    h = bit.bxor(h, s:byte(i))
    h = bit.tobit(bit.lshift(h, 24) + (h % 4294967296) * 403)   -- h * 16777619 mod 2^32
  end
  return bit.tohex(h)
end

-- The folder's name carries a hash of the `sft` settings, so a cache trained with other
-- settings (an older world config, an sft.* override) is never taken for this one.
function M.dir(cfg, world)
  local key = short_hash(require("clrt.json").encode(cfg.sft or {}))
  return ("%s/world%d-%s-seed%d"):format(cfg.sft_cache, world.version, key, cfg.seed)
end

-- The warm start's model folder: the cached one, else an interrupted one continued, else a
-- new one trained by sft.main. who names the calling recipe in the line it prints.
function M.ensure(cfg, world, sft, who)
  if type(sft) ~= "table" or type(sft.main) ~= "function" or type(sft.parse_args) ~= "function" then
    error("clrt.train.warm_start.ensure: sft must be the SFT recipe's module (defaults, parse_args, main)", 2)
  end
  local dir = M.dir(cfg, world)
  -- rank 0 decides for all data-parallel ranks (they would race on the folder); the warm start
  -- itself runs on all of them (the SFT recipe is data-parallel)
  local dist = require("clrt.dist")
  local state = dist.broadcast_string(files.exists(dir .. "/model/model.safetensors") and "cached"
    or files.exists(dir .. "/config.json") and "resume" or "new")
  if state == "cached" then return dir .. "/model" end
  local scfg
  if state == "resume" then   -- an interrupted warm start: continue it
    scfg = sft.parse_args({ "resume=" .. dir })
  else
    if dist.is_main() then files.remove_tree(dir) end   -- nothing in it to continue
    dist.barrier()
    scfg = config.parse(sft.defaults, {}, cfg.sft)
    scfg.seed, scfg.run_dir = cfg.seed, dir
  end
  if dist.is_main() then
    io.stderr:write((who or "clrt.train.warm_start") .. ": no cached warm start; training one with collabllm_sft.lua -> " .. dir .. "\n")
  end
  return (sft.main(scfg))
end

return M
