#!/usr/bin/env bash
# The clrt command: -e, --version, --help, script arguments in `arg`, script errors (message,
# traceback, non-zero exit), `clrt recipes/x.lua` from another directory, stdin scripts, and
# no C crash (signal exit) for garbage input.
set -u
bin="${CLRT_BIN:-clrt}"
tmp="$(mktemp -d /tmp/clrt-cli.XXXXXX)"
trap 'rm -rf "$tmp"' EXIT
fails=0
ok() { echo "ok    $1"; }
bad() { echo "FAIL  $1"; shift; for l in "$@"; do echo "      $l"; done; fails=$((fails + 1)); }
# run CMD...: sets out (stdout+stderr) and rc
run() { out="$("$@" 2>&1)"; rc=$?; }
has() { case "$out" in *"$1"*) return 0 ;; esac; return 1; }

run "$bin" -e 'print(clrt.tensor.ones({2,3}):sum())'
[ "$rc" -eq 0 ] && [ "$out" = "6" ] && ok "-e prints 6 for ones({2,3}):sum()" || bad "-e sum" "rc=$rc out=$out"

run "$bin" -e 'local c = require("clrt"); print(c == clrt, type(clrt.tensor))'
[ "$out" = "true	table" ] && ok "require('clrt') is the preloaded global" || bad "require clrt" "$out"

run "$bin" --version
[ "$rc" -eq 0 ] && [[ "$out" =~ ^clrt\ [0-9]+\.[0-9]+\.[0-9]+\ \(LuaJIT ]] && ok "--version" || bad "--version" "rc=$rc out=$out"
# the second line names the CPU kernels in use; CLRT_CPU=portable forces the plain loops
[[ "$out" =~ $'\n'cpu:\ kernels\ (portable|avx2|avxvnni|avx512)\ \(this\ CPU:\ [a-z0-9]+ ]] && has "bf16 products " && has ", int8 " &&
  ok "--version names the kernels" || bad "--version kernels" "$out"
run env CLRT_CPU=portable "$bin" --version
has "cpu: kernels portable" && has "bf16 products f32" && has "int8 portable" && ok "CLRT_CPU=portable: plain loops, no bf16 unit" ||
  bad "CLRT_CPU=portable" "$out"
run "$bin" -e 'print(clrt.model.cpu_paths("portable")); print(pcall(clrt.model.cpu_paths, "sse"))'
has "kernels portable" && has "cpu level 'sse' (portable, avx2, avxvnni, avx512)" && ok "clrt.model.cpu_paths caps the level, names a bad one" ||
  bad "cpu_paths" "$out"
run "$bin" -v
[ "$rc" -eq 0 ] && has "clrt " && ok "-v" || bad "-v" "$out"
run "$bin" --help
[ "$rc" -eq 0 ] && has "usage: clrt" && has "-e CODE" && ok "--help" || bad "--help" "rc=$rc out=$out"
# --help goes on with every subcommand and shipped recipe, one line each from its file's doc
src="${CLRT_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}"
missing=""
for f in "$src"/lua/clrt/cli/commands/*.lua; do
  c="$(basename "$f" .lua)"
  printf '%s\n' "$out" | grep -qE "^  $c +[A-Z][a-z]" || missing="$missing command:$c"
done
for f in "$src"/lua/recipes/*.lua; do
  r="$(basename "$f")"
  printf '%s\n' "$out" | grep -qE "^  $r +[[:alnum:]]" || missing="$missing recipe:$r"
done
[ -z "$missing" ] && has "  serve    An OpenAI-compatible server" && has "  train_tokenizer.lua  train a byte-level BPE tokenizer" &&
  ok "--help lists the commands and recipes with their doc line" || bad "--help catalogue" "missing:$missing" "$out"
run "$bin" --bogus
[ "$rc" -eq 2 ] && has "unknown option '--bogus'" && ok "an unknown option exits 2" || bad "unknown option" "rc=$rc out=$out"
run "$bin" -e
[ "$rc" -eq 2 ] && has "-e needs an argument" && ok "-e without code exits 2" || bad "-e alone" "rc=$rc out=$out"

cat > "$tmp/args.lua" <<'LUA'
print(arg[0], #arg, arg[1], arg[2], select("#", ...), (...))
LUA
run "$bin" "$tmp/args.lua" lr=0.5 "two words"
[ "$rc" -eq 0 ] && [ "$out" = "$tmp/args.lua	2	lr=0.5	two words	2	lr=0.5" ] && ok "script arguments in arg and ..." || bad "script args" "out=$out"

cat > "$tmp/fail.lua" <<'LUA'
local function inner() error("the reason " .. 42) end
local function outer() inner() end
outer()
LUA
run "$bin" "$tmp/fail.lua"
if [ "$rc" -eq 1 ] && has "fail.lua:1: the reason 42" && has "stack traceback:" && has "in function 'outer'"; then
  ok "a script error prints message and traceback and exits 1"
else bad "script error" "rc=$rc" "$out"; fi

run "$bin" -e 'error("from -e")'
[ "$rc" -eq 1 ] && has "(command line):1: from -e" && has "stack traceback:" && ok "an -e error exits 1 with a traceback" || bad "-e error" "rc=$rc $out"

run "$bin" "$tmp/missing.lua"
[ "$rc" -eq 1 ] && has "cannot open" && ok "a missing script is an error" || bad "missing script" "rc=$rc $out"

# recipes/x.lua resolves to the Lua dir when there is no such file here
mkdir -p "$tmp/elsewhere"
out="$(cd "$tmp/elsewhere" && "$bin" recipes/train_tokenizer.lua 2>&1)"; rc=$?
if has "train_tokenizer: input= is required" && ! has "cannot open"; then ok "recipes/x.lua resolves from another directory (rc=$rc)"; else bad "recipe resolution" "$out"; fi
# ... but a file in the current directory wins
mkdir -p "$tmp/elsewhere/recipes"
echo 'print("local recipe")' > "$tmp/elsewhere/recipes/train_tokenizer.lua"
out="$(cd "$tmp/elsewhere" && "$bin" recipes/train_tokenizer.lua 2>&1)"
[ "$out" = "local recipe" ] && ok "a script in the current directory wins" || bad "local recipe" "$out"

out="$(echo 'print(20 + 22, ...)' | "$bin" - x 2>&1)"
[ "$out" = "42	x" ] && ok "'-' runs stdin with arguments" || bad "stdin script" "$out"
out="$(echo 'print(6 * 7)' | "$bin" 2>&1)"
[ "$out" = "42" ] && ok "piped stdin runs as a script" || bad "piped stdin" "$out"

# Garbage never crashes: every run exits 0 or 1, never by a signal.
crash=0
check_no_crash() {
  local what="$1"; shift
  "$@" > "$tmp/out" 2>&1 < /dev/null; local r=$?
  if [ "$r" -gt 1 ]; then crash=1; bad "no crash: $what" "rc=$r" "$(head -c 400 "$tmp/out")"; fi
}
for code in '(((' 'x = = 1' 'return' '%' 'local t = {} t = t.x.y' 'error(nil)' 'error({})' \
    'error(setmetatable({}, {__tostring = function() error("again") end}))' \
    'local function f() return 1 + f() end f()' 'string.rep("x", 2^31)' \
    'clrt.tensor.zeros({-1})' 'clrt.tensor.zeros({2,3}):get(9, 9)' 'clrt.tensor.from({{1},{2,3}})' \
    'clrt.tensor.zeros({2,3}) + clrt.tensor.zeros({3,2})' 'clrt.tensor.zeros({2}):matmul(nil)' \
    'clrt.tensor.zeros({2}):sum("x")' 'clrt.tensor.zeros({2}):softmax(1e300)' 'clrt.tensor.ones({2}):reshape({-1, -1})' \
    'clrt.tensor.ones(nil)' 'clrt.tensor.ones({1e10, 1e10})' 'clrt.nope.x()' 'coroutine.wrap(function() error("co") end)()'; do
  check_no_crash "-e $code" "$bin" -e "$code"
done
printf '\033LJ\002\000\377garbage bytecode' > "$tmp/bytecode.lua"
check_no_crash "bytecode file" "$bin" "$tmp/bytecode.lua"
for i in 1 2 3 4 5 6 7 8; do
  head -c 2048 /dev/urandom > "$tmp/random$i.lua"
  check_no_crash "random bytes $i" "$bin" "$tmp/random$i.lua"
done
printf 'print("unterminated' > "$tmp/trunc.lua"
check_no_crash "truncated script" "$bin" "$tmp/trunc.lua"
[ "$crash" -eq 0 ] && ok "garbage input never crashes the process"

echo "$fails failed"
[ "$fails" -eq 0 ]
