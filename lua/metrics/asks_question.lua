-- asks_question — 1 when the first response (A1) asks the user something, else 0: a
-- question mark outside fenced code (clrt.conversation.asks_question). Its mean over an
-- evaluation set is "the share of first replies that ask a question". Rule-based, so it
-- never needs a judge; weight it 0 to log it without rewarding it.
local conv = require("clrt.conversation")

return {
  name = "asks_question",
  compute = function(conversation, sample, ctx)
    return conv.asks_question(conv.first_reply(conversation, sample)) and 1 or 0
  end,
}
