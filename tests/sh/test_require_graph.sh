#!/usr/bin/env bash
# The Lua library's layering, read from the source by scripts/require_graph.py: no require
# cycle, no library module (lua/clrt/) that requires a recipe, metric, simulated user or
# example, no use of the global `clrt` in the library, and no lua-cjson there. The script
# must also see each kind of fault: a copy of lua/ with one planted is checked to fail.
set -u
src="${CLRT_SOURCE_DIR:-.}"
py=/usr/bin/python3
[ -x "$py" ] || py=python3
command -v "$py" >/dev/null || { echo "skip: no python3"; exit 77; }
rc=0
out=$("$py" "$src/scripts/require_graph.py" --check 2>&1) || { echo "FAIL  the tree itself:"; echo "$out"; rc=1; }
echo "$out" | head -4

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
plant() {   # plant NAME FILE TEXT: a copy of lua/ and examples/ with TEXT appended to FILE
  rm -rf "$tmp/tree" && mkdir -p "$tmp/tree/scripts"
  cp -r "$src/lua" "$src/examples" "$tmp/tree/"
  printf '\n%s\n' "$3" >> "$tmp/tree/$2"
  if "$py" "$src/scripts/require_graph.py" --check --root "$tmp/tree" > "$tmp/out" 2>&1; then
    echo "FAIL  planted $1 was not seen"; cat "$tmp/out"; rc=1
  else
    echo "ok    planted $1 is seen: $(grep -m1 -E "^  (cycle|clrt)|lua-cjson [1-9]" "$tmp/out")"
  fi
}
plant "cycle" lua/clrt/files.lua 'local _ = require("clrt.run")'
plant "upward edge" lua/clrt/train/prompts.lua 'local _ = require("recipes.collabllm_sft")'
plant "global use" lua/clrt/train/report.lua 'local _ = clrt.llm'
plant "lua-cjson" lua/clrt/data.lua 'local _ = require("cjson")'
# a require inside a comment or a string is not an edge
rm -rf "$tmp/tree" && mkdir -p "$tmp/tree" && cp -r "$src/lua" "$src/examples" "$tmp/tree/"
printf '\n-- require("recipes.collabllm_sft")\nlocal _ = "clrt.llm"\n' >> "$tmp/tree/lua/clrt/train/prompts.lua"
"$py" "$src/scripts/require_graph.py" --check --root "$tmp/tree" > "$tmp/out" 2>&1 \
  && echo "ok    comments and strings are not edges" || { echo "FAIL  a comment or string was read as code"; cat "$tmp/out"; rc=1; }
exit $rc
