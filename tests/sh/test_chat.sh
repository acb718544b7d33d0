#!/usr/bin/env bash
# `clrt chat MODEL_DIR` through tmux: a reply streams after the prompt and equals greedy
# generation; /system, /temp, /reset, /save (the JSON written is the conversation); Ctrl-D
# leaves. The model is a tiny random one built by tests/support/tiny_model.lua.
set -u
SESSION=chat
bin="${CLRT_BIN:-clrt}"
src="${CLRT_SOURCE_DIR:-.}"
. "$(dirname "$0")/tmux_lib.sh"

model="$tmp/model"
mkdir -p "$model"
"$bin" -e "package.path = '$src/tests/?.lua;' .. package.path; require('support.tiny_model')('$model', {seed = 3})" \
  || { echo "FAIL  building the tiny model"; exit 1; }
# What greedy decoding says to "hello there" (the reply must match it exactly).
"$bin" -e "local m = clrt.model.load('$model'); local tok = clrt.tokenizer.load('$model')
  io.open('$tmp/want.txt', 'w'):write((clrt.chat.generate(m, tok, {{role = 'user', content = 'hello there'}}, {temperature = 0, max_new_tokens = 12})))"

T new-session -d -s chat -x 200 -y 50 \
  "env HOME='$tmp' '$bin' chat '$model' --temp 0 --max-tokens 12; echo 'chat exited with' \$?; sleep 30"
expect "banner" "/help for commands"
type_line "hello there"
expect "the reply follows the prompt" "assistant> "
type_line "/temp 0.5"
expect "/temp" "(temperature 0.5)"
type_line "/save $tmp/conv.json"
expect "/save" "(saved $tmp/conv.json)"
check "/save wrote the conversation, and the streamed reply is the greedy reply" \
  "\"$bin\" -e \"local c = require('cjson').decode(io.open('$tmp/conv.json'):read('*a')); local want = io.open('$tmp/want.txt'):read('*a'); assert(#c.messages == 2 and c.messages[1].content == 'hello there' and c.messages[2].role == 'assistant' and c.messages[2].content == want)\""
type_line "/system you are terse"
expect "/system" "(system message set; conversation cleared)"
type_line "/reset"
expect "/reset" "(conversation cleared)"
type_line "/bogus"
expect "unknown commands are named" "(unknown command /bogus"
T send-keys -t chat C-d
expect "Ctrl-D leaves" "chat exited with 0" 15
check "history file written" "[ -s '$tmp/.clrt_chat_history' ]"

summary
