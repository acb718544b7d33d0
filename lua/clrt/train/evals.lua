-- clrt.train.evals — an RL run's evaluations and its summary.json: the held-out evaluation of
-- the built-in world (scripted user) before and after training, and validation on data_val
-- at step 0, every eval.every steps and the last step (each a metrics.jsonl row). Every
-- result is written to summary.json at once; a resumed run keeps the "before" results it has.
--   local ev = evals.new{ run_dir =, cfg =, model =, tokenizer =, world =, user =, ctx =,
--     metrics =, val_set =, can_eval =, log =, resume_state = }
--   ev:before(); ev:at_step(step) (each step); ev:after(last_step); lg:close(); ev:finish()
--   ev.summary   {config =, before =, after =, val_before =, val_after =, api = (clrt.api.usage's total)}
local files = require("clrt.files")
local json = require("clrt.json")
local llm = require("clrt.llm")
local validation = require("clrt.train.validation")
local M = {}
M.__index = M

function M.new(a)
  local self = setmetatable(a, M)
  local cfg = a.cfg
  self.path = a.run_dir .. "/summary.json"
  self.summary = { config = { seed = cfg.seed, single_turn = cfg.single_turn, steps = cfg.steps } }
  if a.resume_state and files.exists(self.path) then
    local ok, old = pcall(require("clrt.config").load, self.path)
    if ok and type(old) == "table" then self.summary.before, self.summary.val_before = old.before, old.val_before end
  end
  return self
end

function M:save() files.write_atomic(self.path, json.encode(self.summary) .. "\n") end

function M:validate(step)
  local rep = validation.validate(self.model, self.tokenizer, self.cfg, self.val_set, self.user, self.ctx, self.metrics)
  self.log:log(step, validation.val_row(rep, {}))
  if rep.first_drop then self.log:print("validation: first dropped conversation: " .. rep.first_drop) end
  return rep
end

-- Before the first step (those a resumed run already has are not run again).
function M:before()
  local s, cfg = self.summary, self.cfg
  if self.can_eval and cfg.eval.before and not s.before then
    s.before = validation.evaluate(self.model, self.tokenizer, cfg, self.world, self.user, self.ctx)
    self.log:print("before RL: " .. json.encode(s.before))
    self:save()
  end
  if self.val_set and cfg.eval.before and not s.val_before and not (self.resume_state and self.resume_state.step > 0) then
    s.val_before = self:validate(0)
    self:save()
  end
end

function M:at_step(step)
  local cfg = self.cfg
  if self.val_set and (step == cfg.steps or (cfg.eval.every > 0 and step % cfg.eval.every == 0)) then
    local rep = self:validate(step)
    if step == cfg.steps and cfg.eval.after then self.summary.val_after = rep end
  end
end

-- After the loop: the held-out evaluation when the run reached its last step.
function M:after(last_step)
  if self.can_eval and self.cfg.eval.after and last_step == self.cfg.steps then
    self.summary.after = validation.evaluate(self.model, self.tokenizer, self.cfg, self.world, self.user, self.ctx)
    self.log:print("after RL:  " .. json.encode(self.summary.after))
  end
end

-- summary.json and the before/after table on stdout, when there is anything to show.
function M:finish()
  local s = self.summary
  -- the run's API spend (clrt.api.usage), with the calls since the last step's row
  local spend = self.ctx and self.ctx.spend
  if spend then
    local rest = llm.drain_records()
    if #rest > 0 then spend:add(rest, true) end
    if spend.total.all.calls > 0 then s.api = spend.total end
  end
  if s.before or s.after or s.val_before or s.val_after or s.api then
    self:save()
    require("clrt.train.report").print_summary(s, self.cfg, self.cfg.reward.metric_weights)
    if s.api then print(require("clrt.api.usage").line(s.api)) end
  end
end

return M
