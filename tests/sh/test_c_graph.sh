#!/usr/bin/env bash
# The C side's map, read from the source by scripts/c_graph.py: no folder's files call each
# other in a cycle (runtime/model is layered), kernels include no runtime
# header and name no runtime function (the CUDA kernels' stream and handle are their own), the CPU
# kernels allocate nothing (their workspace is the caller's), and CLRT_HAVE_CUDA appears only
# in the device files. The script must also see each kind of fault: a copy of runtime/ and
# kernels/ with one planted is checked to fail.
set -u
src="${CLRT_SOURCE_DIR:-.}"
py=/usr/bin/python3
[ -x "$py" ] || py=python3
command -v "$py" >/dev/null || { echo "skip: no python3"; exit 77; }
rc=0
out=$("$py" "$src/scripts/c_graph.py" --check 2>&1) || { echo "FAIL  the tree itself:"; echo "$out"; rc=1; }
echo "$out" | grep -E "^runtime/model|^all:"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fresh() { rm -rf "$tmp/tree" && mkdir -p "$tmp/tree" && cp -r "$src/runtime" "$src/kernels" "$tmp/tree/"; }
plant() {   # plant NAME FILE TEXT: a copy with TEXT appended to FILE fails --check, naming FILE
  fresh
  printf '\n%s\n' "$3" >> "$tmp/tree/$2"
  if "$py" "$src/scripts/c_graph.py" --check --root "$tmp/tree" > "$tmp/out" 2>&1; then
    echo "FAIL  planted $1 was not seen"; cat "$tmp/out"; rc=1
  elif ! grep -q "^  $2" "$tmp/out"; then
    echo "FAIL  planted $1 failed the check without naming $2"; cat "$tmp/out"; rc=1
  else
    echo "ok    planted $1 is seen: $(grep -m1 "^  $2" "$tmp/out")"
  fi
}
plant "allocation in a CPU kernel" kernels/cpu/rmsnorm.c 'void *clrt_planted(size_t n) { return malloc(n); }'
plant "free in a CPU kernel" kernels/cpu/lora.c 'void clrt_planted(void *p) { free (p); }'
plant "runtime header in a kernel" kernels/cpu/swiglu.c '#include "model_internal.h"'
plant "runtime header in a CUDA kernel" kernels/cuda/rope.cu '#include "clrt.h"'
plant "runtime error set by a kernel" kernels/cpu/embedding.c 'void clrt_planted(void) { clrt_set_error("x"); }'
plant "a CUDA kernel reaching the runtime's device layer" kernels/cuda/rope.cu 'void clrt_planted(void) { clrt_cuda_sync(); }'
plant "CUDA ifdef in optim.c" runtime/model/optim.c '#ifdef CLRT_HAVE_CUDA
#endif'
plant "CUDA ifdef in decode.c" runtime/model/decode.c '#if defined(CLRT_HAVE_CUDA)
#endif'
# a malloc or CLRT_HAVE_CUDA in a comment or a string is not a use
fresh
printf '\n/* malloc(1); free(p); CLRT_HAVE_CUDA */\nstatic const char *clrt_planted = "malloc(2) CLRT_HAVE_CUDA";\n' \
  >> "$tmp/tree/kernels/cpu/rmsnorm.c"
"$py" "$src/scripts/c_graph.py" --check --root "$tmp/tree" > "$tmp/out" 2>&1 \
  && echo "ok    comments and strings are not uses" || { echo "FAIL  a comment or string was read as code"; cat "$tmp/out"; rc=1; }
# the graph itself: params.c naming a function of weights.c and weights.c one of params.c
# make a cycle of the two, which fails the check
fresh
printf '\nvoid clrt_planted_a(void) { model_workspace_bytes(0, 0); }\n' >> "$tmp/tree/runtime/model/params.c"
printf '\nvoid clrt_planted_b(void) { clrt_planted_a(); }\n' >> "$tmp/tree/runtime/model/weights.c"
if "$py" "$src/scripts/c_graph.py" --check --root "$tmp/tree" > "$tmp/out" 2>&1; then
  echo "FAIL  a planted cycle passed the check"; rc=1
# (the cycle names every file on its paths: params.c frees quant8.c's int8 copies, and
# quant8.c reads weights.c's product policy, so quant8.c lies on one)
elif grep -qE "cycle: params.c( [a-z0-9_]+\.c)* weights.c" "$tmp/out"; then echo "ok    a planted cycle is found and fails the check"
else echo "FAIL  a planted cycle was not named"; grep "^runtime/model" -A2 "$tmp/out"; rc=1; fi
exit $rc
