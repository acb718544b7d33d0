#!/usr/bin/env bash
# `clrt chat MODEL_DIR` through tmux: a reply streams after the prompt and equals greedy
# generation; /system, /temp, /reset, /save (the JSON written is the conversation); Ctrl-D
# leaves. The model is a tiny random one built by tests/support/tiny_model.lua.
set -u
command -v tmux >/dev/null || { echo "skip: tmux is not installed"; exit 77; }
bin="${CLRT_BIN:-clrt}"
src="${CLRT_SOURCE_DIR:-.}"
tmp="$(mktemp -d /tmp/clrt-chat.XXXXXX)"
sock="clrt-chat-$$"
export TMUX_TMPDIR="$tmp"
T() { tmux -L "$sock" "$@"; }
cleanup() { T kill-server 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
fails=0
passes=0
pane() { T capture-pane -p -J -S -1000 -t chat 2>/dev/null; }
wait_for() {
  local want="$1" limit="${2:-15}" i
  for ((i = 0; i < limit * 20; i++)); do
    pane | grep -qF -- "$want" && return 0
    sleep 0.05
  done
  return 1
}
expect() {
  if wait_for "$2" "${3:-15}"; then echo "ok    $1"; passes=$((passes + 1)); else
    echo "FAIL  $1: '$2' never appeared; the pane shows:"; pane | sed 's/^/      | /'; fails=$((fails + 1)); fi
}
check() { if eval "$2"; then echo "ok    $1"; passes=$((passes + 1)); else echo "FAIL  $1"; fails=$((fails + 1)); fi; }
type_line() { T send-keys -t chat -l -- "$1"; T send-keys -t chat Enter; }

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
expect "Ctrl-D leaves" "chat exited with 0"
check "history file written" "[ -s '$tmp/.clrt_chat_history' ]"

echo "$passes passed, $fails failed"
exit $((fails > 0))
