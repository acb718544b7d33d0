#!/usr/bin/env bash
# A new user at the REPL, through tmux: help() lists the modules and how to start, help(m),
# help(tok), help(m.generate) and help("model.load") print the files' doc comments, the
# classic slip m:generate(tok, "text") says what to write instead, and m:chat answers in one
# call with the folder's tokenizer.
set -u
SESSION=help
bin="${CLRT_BIN:-clrt}"
src="${CLRT_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}"
. "$(dirname "$0")/tmux_lib.sh"

model="$tmp/model"
CLRT_SOURCE_DIR="$src" CLRT_BIN="$bin" "$bin" -e "package.path = '$src/tests/?.lua;' .. package.path
  require('support.tiny_model')('$model', {seed = 6})" > "$tmp/model.log" 2>&1 ||
  { echo "FAIL  building the tiny model:"; cat "$tmp/model.log"; exit 1; }

T new-session -d -s help -x 200 -y 200 \
  "env CLRT_HISTORY='$tmp/history' HOME='$tmp' '$bin'; echo 'clrt exited with' \$?; sleep 30"
expect "banner" "Ctrl-D exits"

type_line 'help()'
expect "help() lists the modules" "tokenizer        Hugging Face tokenizer.json"
expect "help() says how to start" 'm:chat("Plan a trip.")'

type_line "m = clrt.model.load('$model')"
type_line 'help(m)'
expect "help(m) lists the model's methods" "m:generate(prompts, opts)"
expect "help(m) lists m:chat with its doc line" "m:chat(tok, input, opts)               chat([tok,] text or messages"

type_line "tok = clrt.tokenizer.load('$model')"
type_line 'help(tok)'
expect "help(tok) lists the tokenizer's methods" "tok:encode(text, opts)"

type_line 'help(m.generate)'
expect "help(m.generate) prints its comment" "the engine runs until they finish; its decoder grows"
type_line 'help("model.load")'
expect "help(\"model.load\") by name" "model.load(dir, opts)  (lua/clrt/model.lua:"

type_line 'm:generate(tok, "Plan a trip.", {max_new_tokens=20})'
expect "m:generate(tok, text) says what it expected" "prompts must be a list of token lists"
expect "and what to write instead" "for a chat reply to a text use m:chat(tok, text)"
T capture-pane -p -J -S -1000 -t help | grep -qF "decoder: slots" && fail "the decoder's error still leaks out" ||
  pass "no error from inside the decoder"

type_line 'reply = m:chat("Plan a trip.", {max_new_tokens = 6, seed = 2})'
type_line 'print("chat says: " .. type(reply) .. " " .. tostring(#reply > 0) .. " " .. tostring(reply == clrt.chat.generate(m, tok, {{role = "user", content = "Plan a trip."}}, {temperature = 0.7, max_new_tokens = 6, seed = 2})))'
expect "m:chat answers in one call (the folder's tokenizer), as clrt.chat.generate" "chat says: string true true"

T send-keys -t help C-d
expect "Ctrl-D exits" "clrt exited with 0"
summary
