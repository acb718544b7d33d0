#!/usr/bin/env bash
# The REPL driven through tmux like a person at a terminal: an expression prints its value,
# a multi-line function then a call, an error prints message + traceback and the session
# goes on, Ctrl-C out of `while true do end`, tab completion, Ctrl-D, the history file.
set -u
SESSION=repl
bin="${CLRT_BIN:-clrt}"
. "$(dirname "$0")/tmux_lib.sh"

# interrupt N: press Ctrl-C until more than N pane lines say "interrupted" (a press that
# lands before the chunk starts running only clears the prompt line), at most 10 times.
interrupt() {
  local i j
  for ((i = 0; i < 10; i++)); do
    T send-keys -t repl C-c
    for ((j = 0; j < 20; j++)); do
      [ "$(count interrupted)" -gt "$1" ] && return 0
      sleep 0.05
    done
  done
  return 1
}
# count TEXT: how many pane lines contain TEXT
count() { pane | grep -cF -- "$1"; }

T new-session -d -s repl -x 160 -y 50 \
  "env CLRT_HISTORY='$tmp/history' HOME='$tmp' '$bin'; echo 'clrt exited with' \$?; sleep 30"
expect "banner and prompt" "Ctrl-D exits"

type_line '1 + 41'
expect "an expression prints its value" "42"

type_line 'function sq(x)'
type_line '  local y = x * x'
type_line '  return y'
type_line 'end'
type_line 'sq(12) + 0.5'
expect "multi-line function, then a call" "144.5"
pane | grep -qF '>> ' && pass "continuation prompt" || fail "no '>> ' continuation prompt"

type_line 'error("boom-" .. 7)'
expect "an error prints its message" "stdin:1: boom-7"
expect "and a traceback" "stack traceback:"
type_line 'print("still" .. "alive")'
expect "the session continues after an error" "stillalive"

type_line 'local n = 0; while true do n = n + 1 end'
sleep 0.3
if interrupt 0; then pass "Ctrl-C interrupts a running loop"; else
  fail "Ctrl-C did not interrupt 'while true do end'"; pane | sed 's/^/      | /'; fi
type_line '6 * 7 + 100'
expect "the session works after Ctrl-C" "142"

before=$(count "interrupted")
type_line 'big = clrt.tensor.ones({2000, 2000})'
type_line 'for i = 1, 1e9 do big = big + 1 end'
sleep 0.3
if interrupt "$before"; then pass "Ctrl-C interrupts a loop of tensor ops"; else
  fail "Ctrl-C did not interrupt a loop of tensor ops"; pane | sed 's/^/      | /'; fi
type_line 'big:get(1, 1) > 1'
expect "and the tensor is still usable" "true"

T send-keys -t repl -l 'clrt.ten'
T send-keys -t repl Tab
T send-keys -t repl -l '.ones({3, 5}):sum() * 2'
T send-keys -t repl Enter
expect "tab completes clrt.ten to clrt.tensor" "30"

type_line 'tt = clrt.tensor.arange(4)'
T send-keys -t repl -l 'tt:so'
T send-keys -t repl Tab
T send-keys -t repl -l '(1):sum() * 777'
T send-keys -t repl Enter
expect "tab completes a tensor's methods (tt:so -> tt:softmax)" "777"

type_line 'clrt.tensor.arange(6):reshape({2, 3})'
expect "a tensor prints its shape and dtype" "shape=[2, 3], dtype=f32"

T send-keys -t repl C-d
expect "Ctrl-D exits" "clrt exited with 0"
if grep -qF 'sq(12) + 0.5' "$tmp/history" 2>/dev/null; then pass "history file written"; else
  fail "history file $tmp/history lacks 'sq(12) + 0.5'"; fi

summary
