#!/usr/bin/env bash
# run.sh — the GPU validation kit, run from the repository root on the GPU machine with .gpu/
# (scripts/gpu/prepare.sh) carried: unpacks the Debian packages into a private prefix
# (build/gpu-kit/prefix, never /), builds clrt with CUDA for sm_90 against them in a clean environment,
# then runs each step under its own time budget; a step that fails or runs out of time does
# not stop the others (those that need its result are skipped, with the reason). Writes under
# $OUT (the device tool's folder; build/gpu-kit/out without it): summary.txt (one line a step, the
# figures, the tail of each failing log), summary.json, all.log (every log, in order) and
# logs.tar.gz (the logs, the RL runs' metrics and summaries). docs/gpu.md says how to run it.
#   bash scripts/gpu/run.sh [check|perf|all|STEP,...]     (default all)
#     check: build, cuda_tests, hf, cpu_tests, sanitize    perf: build, bench_train,
#     bench_generate, rl     all: both, in that order, as far as the budget goes
#   CLRT_GPU_DRY=1        here, without a GPU: the same unpacking and clean build (CUDA when
#                         nvcc is found), the CPU tests; the GPU steps skip with their reason
#   CLRT_GPU_BUDGET=560   seconds for the whole run (the device tool stops a command at 600;
#                         3000 in a dry run); CLRT_GPU_BUDGET_<step> one step's (see `want`)
#   CLRT_GPU_JOBS         build jobs (default: all cores; 2 in a dry run)
#   CLRT_GPU_ARCH=90      CUDA architectures to build
#   CLRT_GPU_CPU_TESTS    ctest regex of the CPU tests
#   CLRT_GPU_RL_ARGS      more key=value arguments of the RL runs (e.g. steps=40)
# Exit 0 when no step failed, 1 otherwise (skips are not failures).
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
self="$here/scripts/gpu/run.sh"
. "$here/scripts/gpu/packages.sh"
kit="${CLRT_GPU_KIT:-$here/.gpu}"       # the carried packages (another: the kit test's planted fault)
# Everything made here stays out of .gpu (which travels): the prefix, logs, Hugging Face files.
work="${CLRT_GPU_WORK:-$here/build/gpu-kit}"
prefix="$work/prefix"
dry="${CLRT_GPU_DRY:-0}"
if [ "$dry" = 1 ]; then build="${CLRT_GPU_BUILD:-$here/build/gpu-dry}"; else build="${CLRT_GPU_BUILD:-$here/build/gpu}"; fi
logs="$work/logs"
multiarch=x86_64-linux-gnu
libdirs="$prefix/usr/lib/$multiarch:$prefix/lib/$multiarch:$prefix/usr/lib/$multiarch/openblas-openmp"
export CLRT_SOURCE_DIR="$here" CLRT_BIN="$build/clrt"
export LUA_CPATH="$prefix/usr/lib/$multiarch/lua/5.1/?.so;;"
export PYTHONUNBUFFERED=1
# The image's Python (the one with PyTorch) is the first python3 on PATH there; Debian's here.
if [ -z "${CLRT_PYTHON:-}" ]; then
  if [ "$dry" = 1 ] && [ -x /usr/bin/python3 ]; then CLRT_PYTHON=/usr/bin/python3
  else CLRT_PYTHON="$(command -v python3 || echo /usr/bin/python3)"; fi
fi
export CLRT_PYTHON

# ---------------------------------------------------------------------------------- steps
# Each runs in a process of its own (run.sh --step NAME) under `timeout`; exit 0 passed, 77
# skipped (its last line says why), anything else failed. A line "FIGURE key=value" in its
# output goes into the summary.

find_tool() {   # the first of: PATH, then the given absolute paths
  local name="$1"; shift
  command -v "$name" 2>/dev/null && return
  for c in "$@"; do [ -x "$c" ] && { echo "$c"; return; }; done
  return 1
}

step_env() {
  echo "date: $(date -u)  host: $(uname -srm)"
  [ -r /etc/os-release ] && grep PRETTY_NAME /etc/os-release
  local have need
  have="$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')"
  need="$(sed -n 's/^glibc_needed=//p' "$kit/manifest.txt" 2>/dev/null)"
  echo "glibc here: ${have:-unknown}; the kit's Debian 12 binaries need: ${need:-unknown (no .gpu/manifest.txt)}"
  echo "FIGURE glibc=${have:-?}"
  if [ -n "$have" ] && [ -n "$need" ] &&
     [ "$(printf '%s\n%s\n' "$have" "$need" | sort -V | head -1)" != "$need" ]; then
    echo "this glibc ($have) is older than the kit's binaries need ($need): they cannot run here;"
    echo "build clrt's dependencies from source or bring a newer image"
    return 1
  fi
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader &&
    echo "FIGURE gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr ' ' '_')"
  local nvcc; nvcc="$(find_tool nvcc /usr/local/cuda/bin/nvcc)" && "$nvcc" --version | tail -2
  echo "cmake: $(cmake --version 2>/dev/null | head -1)  gcc: $(gcc -dumpfullversion 2>/dev/null)"
  echo "python: $CLRT_PYTHON"
  "$CLRT_PYTHON" - <<'EOF' || true
import importlib
for name in ("torch", "transformers", "peft", "safetensors", "tokenizers", "tensorboard"):
    try:
        m = importlib.import_module(name)
        print(f"  {name} {getattr(m, '__version__', '?')}")
    except Exception as e:
        print(f"  {name} missing ({type(e).__name__})")
try:
    import torch
    print("  torch cuda:", torch.cuda.is_available(), torch.version.cuda,
          torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
except Exception:
    pass
EOF
  return 0
}

# dpkg-deb -x; where the image has no dpkg, the .deb's own layout: an ar archive holding data.tar.*.
extract_deb() {
  if command -v dpkg-deb >/dev/null; then dpkg-deb -x "$1" "$2"; return; fi
  local t; t="$(mktemp -d)"
  (cd "$t" && ar x "$1" && tar -xf data.tar.* -C "$2")
  local rc=$?; rm -rf "$t"; return $rc
}

step_unpack() {
  local n=0
  [ -f "$kit/manifest.txt" ] || { echo "no .gpu/manifest.txt: run scripts/gpu/prepare.sh here and carry .gpu"; return 1; }
  # Unpacked from this manifest already (a second call on a warm machine): kept as it is, so
  # the headers' times do not make the build start again.
  if cmp -s "$kit/manifest.txt" "$prefix/.manifest" && [ -x "$prefix/kit-bin/pkg-config" ]; then
    echo "already unpacked from this manifest in $prefix"
    echo "FIGURE packages=$(grep -c '^deb=' "$kit/manifest.txt")"
    return 0
  fi
  # A new prefix: objects compiled against the old one (their dependency files name its
  # headers) go too, so the build and its checks see only this one.
  rm -rf "$prefix" "$build"
  mkdir -p "$prefix"
  while read -r deb _; do
    [ -s "$kit/debs/$deb" ] || { echo "missing .gpu/debs/$deb (the manifest lists it): run prepare.sh again"; return 1; }
    extract_deb "$kit/debs/$deb" "$prefix" || { echo "unpacking $deb failed"; return 1; }
    n=$((n + 1))
  done < <(sed -n 's/^deb=//p' "$kit/manifest.txt")
  # libmicrohttpd.pc names gnutls as a private requirement (static links only); pkgconf looks
  # for it all the same, and its -dev package would bring a tree of headers clrt never reads.
  sed -i '/^Requires.private:/d' "$prefix/usr/lib/$multiarch/pkgconfig/libmicrohttpd.pc" || return 1
  # pkgconf, run with the prefix's libpkgconf; it reports the prefix's .pc files only.
  mkdir -p "$prefix/kit-bin"
  cat > "$prefix/kit-bin/pkg-config" <<EOF
#!/bin/sh
LD_LIBRARY_PATH="$libdirs" PKG_CONFIG_LIBDIR="$prefix/usr/lib/$multiarch/pkgconfig:$prefix/usr/share/pkgconfig" \\
  PKG_CONFIG_SYSROOT_DIR="$prefix" exec "$prefix/usr/bin/pkgconf" "\$@"
EOF
  chmod +x "$prefix/kit-bin/pkg-config"
  cp "$kit/manifest.txt" "$prefix/.manifest"
  echo "unpacked $n packages into $prefix ($(du -sh "$prefix" | cut -f1))"
  echo "FIGURE packages=$n"
}

# The build runs under env -i: nothing from the caller's environment, the kit's pkg-config,
# CMake told to ignore /usr as a prefix, so a library the kit lacks fails the build instead
# of being found on this machine; the binary gets the prefix in its DT_RPATH (which, unlike
# RUNPATH, also serves the libraries' own dependencies).
step_build() {
  local cmake nvcc jobs cuda_args=() path
  cmake="$(find_tool cmake /usr/local/bin/cmake /opt/torch/.venv/bin/cmake)" || { echo "no cmake"; return 1; }
  jobs="${CLRT_GPU_JOBS:-$([ "$dry" = 1 ] && echo 2 || nproc)}"
  path="$prefix/kit-bin:$(dirname "$cmake"):/usr/local/bin:/usr/bin:/bin"
  if nvcc="$(find_tool nvcc /usr/local/cuda/bin/nvcc)"; then
    cuda_args=(-DCLRT_CUDA=ON -DCMAKE_CUDA_COMPILER="$nvcc" -DCLRT_CUDA_ARCHITECTURES="${CLRT_GPU_ARCH:-90}")
    path="$(dirname "$nvcc"):$path"
    echo "CUDA: $nvcc, sm_${CLRT_GPU_ARCH:-90}"
  elif [ "$dry" = 1 ]; then
    cuda_args=(-DCLRT_CUDA=OFF); echo "no nvcc here: building without CUDA (dry run)"
  else
    echo "no nvcc found (PATH, /usr/local/cuda/bin)"; return 1
  fi
  local inc="$prefix/usr/include" lib="$prefix/usr/lib/$multiarch"
  # A cache made against another prefix keeps its pkg-config results: start it again.
  if [ -f "$build/CMakeCache.txt" ] && ! grep -q "^PKG_CONFIG_EXECUTABLE:.*=$prefix/kit-bin/pkg-config\$" "$build/CMakeCache.txt"; then
    rm -rf "$build/CMakeCache.txt" "$build/CMakeFiles"
  fi
  env -i HOME="${HOME:-/root}" PATH="$path" LANG=C.UTF-8 \
    "$cmake" -S "$here" -B "$build" -DCMAKE_BUILD_TYPE=Release "${cuda_args[@]}" -DCLRT_MPI=OFF \
      -DPKG_CONFIG_EXECUTABLE="$prefix/kit-bin/pkg-config" \
      -DCMAKE_IGNORE_PREFIX_PATH="/usr;/" -DCMAKE_PREFIX_PATH="$prefix/usr" \
      -DOPENBLAS_INCLUDE="$inc/$multiarch/openblas-openmp" \
      -DOPENBLAS_LIB="$lib/openblas-openmp/libopenblas.so" \
      -DREADLINE_LIB="$lib/libreadline.so" \
      -DCMAKE_EXE_LINKER_FLAGS="-Wl,--disable-new-dtags -Wl,-rpath,$libdirs" || return 1
  env -i HOME="${HOME:-/root}" PATH="$path" LANG=C.UTF-8 nice "$cmake" --build "$build" -j"$jobs" || return 1
  step_deps
}

# What the build used must be the prefix's: every header of a kit library that the compiler
# read (its dependency files), every library the binaries load (ldd, with a clean
# environment). Only glibc, gcc's runtime and CUDA may come from the machine.
step_deps() {
  local bad=0 f
  local kit_headers='/usr/include/(luajit-2\.1|readline|pcre2|utf8proc|microhttpd|curl|'"$multiarch"'/(curl|openblas[^/]*)|cblas)'
  local used
  used="$(find "$build" -name '*.d' -print0 | xargs -0 cat 2>/dev/null | tr ' \\' '\n\n' | grep -E "^$kit_headers" | sort -u)"
  if [ -n "$used" ]; then
    echo "headers of kit libraries read from the machine instead of $prefix:"; echo "$used" | head -20; bad=1
  else
    echo "headers: every kit library's header came from the prefix"
  fi
  for f in "$build/clrt" "$build"/tests/test_*; do
    [ -x "$f" ] || continue
    local out
    out="$(env -i PATH=/usr/bin:/bin ldd "$f" 2>&1)"
    local miss; miss="$(echo "$out" | grep 'not found')"
    local sys; sys="$(echo "$out" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | grep -v " $prefix/" | grep -Ev "$KIT_SYSTEM_LIBS")"
    if [ -n "$miss$sys" ]; then
      echo "$(basename "$f"): libraries not from the prefix:"; echo "$miss$sys" | sed 's/^/  /'; bad=1
    fi
  done
  [ "$bad" = 0 ] && echo "libraries: clrt and the C tests load the kit's copies (only glibc, gcc and CUDA from the machine)"
  echo "FIGURE prefix_clean=$([ "$bad" = 0 ] && echo yes || echo no)"
  return "$bad"
}

need_gpu() {
  if [ "$dry" = 1 ]; then echo "skipped: dry run (CLRT_GPU_DRY=1), no GPU"; return 77; fi
  "$CLRT_BIN" -e 'os.exit(clrt.cuda_available() and 0 or 77)' ||
    { echo "skipped: clrt sees no CUDA device: $("$CLRT_BIN" -e 'print(clrt.cuda_status())')"; return 77; }
}

ctest_bin() { local c; c="$(find_tool cmake /usr/local/bin/cmake /opt/torch/.venv/bin/cmake)" && echo "$(dirname "$c")/ctest"; }

step_cpu_tests() {
  # One quick test or two for each carried library: OpenBLAS (tensor ops), curl and
  # microhttpd (http), PCRE2 and utf8proc (the tokenizer), LuaJIT and cjson (the Lua ones).
  local re="${CLRT_GPU_CPU_TESTS:-^(c_test_(tensor_core|tensor_ops|shared_math|safetensors|tokenizer_bpe|http)|lua_test_(tensor_basics|extract_json|log|tensorboard))\$}"
  "$(ctest_bin)" --test-dir "$build" --output-on-failure --timeout 300 -j"$(nproc)" -R "$re"
}

step_cuda_tests() {
  need_gpu || return
  "$(ctest_bin)" --test-dir "$build" --output-on-failure --timeout 300 -R '^(c_test_cuda|lua_test_(cuda|lora_cuda))'
}

step_sanitize() {
  need_gpu || return
  bash "$here/scripts/cuda_sanitize.sh" "$build"
}

step_hf() {
  "$CLRT_PYTHON" "$here/scripts/gpu/hf_checks.py" --clrt "$CLRT_BIN" --work "$work/hf" \
    $([ "$dry" = 1 ] || echo --device-also cuda)
}

step_bench_train() {
  need_gpu || return
  local rc=0
  for mm in f32 bf16; do
    "$CLRT_BIN" "$here/bench/train_step.lua" sizes=0.5B device=cuda matmul=$mm steps=5 threads=8 | tee "$logs/bench_train_$mm.txt" || rc=1
    sed -n 's/^ratio: speed \([0-9.]*\)x.*/FIGURE train_'$mm'_speed_vs_torch=\1/p; s/^clrt : *\([0-9.]*\) tokens.*/FIGURE train_'$mm'_clrt_tokens_per_s=\1/p; s/^TFLOP\/s: clrt \([0-9.]*\) (MFU \([^)]*\)), torch \([0-9.]*\) (MFU \([^)]*\)).*/FIGURE train_'$mm'_tflops=\1 train_'$mm'_mfu=\2 train_'$mm'_torch_tflops=\3 train_'$mm'_torch_mfu=\4/p' "$logs/bench_train_$mm.txt"
  done
  return $rc
}

step_bench_generate() {
  need_gpu || return
  "$CLRT_BIN" "$here/bench/generate.lua" sizes=0.5b device=cuda weights=f32,bf16 batches=1,32 new=64 reps=3 |
    tee "$logs/bench_generate.txt" || return 1
  awk '$1 == "0.5b" {print "FIGURE decode_" $2 "_b" $3 "_clrt_tokens_per_s=" $4, "decode_" $2 "_b" $3 "_torch_tokens_per_s=" $5}' "$logs/bench_generate.txt"
}

# The built-in world's default run, the RL on the GPU, beside the same run on the CPU of this
# machine at the same time (each builds its own warm start on the CPU, the same one). Against
# the CPU targets of the README's default run: after RL accuracy_underspecified 0.97 and
# ask_rate_underspecified 1.00 (seeds 1, 2: >= 0.95), accuracy_specified >= 0.97.
# Each run gets OMP_NUM_THREADS=4 (CLRT_GPU_RL_THREADS): on the kit's first GPU run (H100, 16
# vCPUs) both took all 16 and their CPU warm starts ran at 5.5 s a step, 55x a 2-core machine's.
step_rl() {
  need_gpu || return
  local devs="cuda cpu" rc=0 pids=()
  for d in $devs; do
    rm -rf "$here/runs/gpu_kit_$d" "$here/runs/gpu_kit_sft_$d"
    ( cd "$here" && OMP_NUM_THREADS="${CLRT_GPU_RL_THREADS:-4}" exec "$CLRT_BIN" lua/recipes/collabllm_rl.lua device=$d run_dir=runs/gpu_kit_$d \
        sft_cache=runs/gpu_kit_sft_$d ${CLRT_GPU_RL_ARGS:-} ) > "$logs/rl_$d.log" 2>&1 &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do wait "${pids[$i]}" || rc=1; done
  for d in $devs; do
    echo "== device=$d: $(tail -3 "$logs/rl_$d.log")"
    mkdir -p "$logs/rl_$d"
    cp "$here/runs/gpu_kit_$d/summary.json" "$here/runs/gpu_kit_$d/metrics.jsonl" "$logs/rl_$d/" 2>/dev/null
  done
  "$CLRT_PYTHON" - "$here/runs" $devs <<'EOF' || rc=1
import json, os, sys
runs, devs, bad = sys.argv[1], sys.argv[2:], 0
for d in devs:
    try:
        s = json.load(open(os.path.join(runs, f"gpu_kit_{d}", "summary.json")))
    except Exception as e:
        print(f"device={d}: no summary.json ({e})"); bad = 1; continue
    rows = []
    try:
        rows = [json.loads(l) for l in open(os.path.join(runs, f"gpu_kit_{d}", "metrics.jsonl"))]
    except Exception:
        pass
    after = s.get("after") or {}
    print(f"device={d}: summary {json.dumps(s)[:600]}")
    for k in ("accuracy_underspecified", "accuracy_specified", "ask_rate_underspecified", "ask_rate_specified"):
        v = after.get(k)
        if isinstance(v, (int, float)):
            print(f"FIGURE rl_{d}_{k}={v:.3f}")
    secs = [r.get("time_step_s") for r in rows]
    secs = [x for x in secs if isinstance(x, (int, float))]
    if secs:
        print(f"FIGURE rl_{d}_s_per_step={sum(secs) / len(secs):.3f}")
    target = {"accuracy_underspecified": (0.9, 1), "ask_rate_underspecified": (0.9, 1),
              "accuracy_specified": (0.9, 1), "ask_rate_specified": (0, 0.1)}
    for k, (lo, hi) in target.items():
        v = after.get(k)
        if not isinstance(v, (int, float)) or not lo <= v <= hi:
            print(f"device={d}: {k} after RL = {v}, outside the CPU target [{lo}, {hi}]"); bad = 1
sys.exit(bad)
EOF
  return $rc
}

# ---------------------------------------------------------------------------------- driver
# In a function, read whole before it runs: a script edited while it runs is not re-read.
main() {
OUT="${OUT:-$work/out}"
mkdir -p "$OUT"
rm -rf "$logs"; mkdir -p "$logs"
# A dry run builds on a small shared machine (CI's): a longer budget.
budget="${CLRT_GPU_BUDGET:-$([ "$dry" = 1 ] && echo 3000 || echo 560)}"
t0="$(date +%s)"
deadline=$((t0 + budget))
declare -A status=() secs=()
order=()

# name, budget in seconds, the steps it needs
declare -A want=(   [env]=30  [unpack]=60 [build]=300 [cpu_tests]=150 [cuda_tests]=150 [sanitize]=240
                    [hf]=180  [bench_train]=200 [bench_generate]=120 [rl]=300 )
declare -A needs=(  [unpack]=env [build]=unpack [cpu_tests]=build [cuda_tests]=build [sanitize]=build
                    [hf]=build [bench_train]=build [bench_generate]=build [rl]=build )
case "${1:-all}" in
  # The sanitizer last in its group: the slowest, it gets what the others leave.
  check) steps="env unpack build cuda_tests hf cpu_tests sanitize" ;;
  perf)  steps="env unpack build bench_train bench_generate rl" ;;
  all)   steps="env unpack build cuda_tests hf cpu_tests sanitize bench_train bench_generate rl" ;;
  *)     steps="$(echo "$1" | tr ',' ' ')" ;;
esac
[ "$dry" = 1 ] && want[build]=2400 && want[cpu_tests]=900
for s in $steps; do
  [ -n "${want[$s]:-}" ] || { echo "run.sh: unknown step '$s' (${!want[*]})" >&2; exit 2; }
  v="CLRT_GPU_BUDGET_$s"   # a step's own budget, e.g. CLRT_GPU_BUDGET_rl=400
  [ -n "${!v:-}" ] && want[$s]="${!v}"
done

write_summary() {
  local now; now="$(date +%s)"
  {
    echo "clrt GPU kit: $(date -u +%FT%TZ), $([ "$dry" = 1 ] && echo "DRY RUN (no GPU)" || echo "GPU run"), $((now - t0)) s of $budget"
    echo "steps: $steps"
    for s in "${order[@]}"; do printf '%-15s %-40s %5ss\n' "$s" "${status[$s]}" "${secs[$s]}"; done
    echo
    echo "figures:"
    for s in "${order[@]}"; do
      grep -ho 'FIGURE .*' "$logs/$s.log" 2>/dev/null | sed 's/^FIGURE /  /'
    done
    for s in "${order[@]}"; do
      case "${status[$s]}" in
        FAIL*|TIMEOUT*) echo; echo "---- $s: last 40 lines of its log"; tail -40 "$logs/$s.log" ;;
      esac
    done
  } > "$OUT/summary.txt"
  "${CLRT_PYTHON}" - "$OUT/summary.json" "$logs" "$dry" "$((now - t0))" "${order[@]/%/=}" <<'EOF' 2>/dev/null || true
import json, os, re, sys
out, logs, dry, secs = sys.argv[1], sys.argv[2], sys.argv[3] == "1", int(sys.argv[4])
steps = [a[:-1] for a in sys.argv[5:]]
lines = open(os.path.join(os.path.dirname(out), "summary.txt")).read().splitlines()
table = {l.split()[0]: l for l in lines[2:2 + len(steps)]}
res = {"dry_run": dry, "seconds": secs, "steps": {}, "figures": {}}
for s in steps:
    row = table.get(s, "")
    res["steps"][s] = row[15:].rsplit(None, 1)[0].strip() if row else "?"
    try:
        for l in open(os.path.join(logs, s + ".log"), errors="replace"):
            for k, v in re.findall(r"(\S+?)=(\S+)", l[7:]) if l.startswith("FIGURE ") else []:
                res["figures"][k] = v
    except OSError:
        pass
json.dump(res, open(out, "w"), indent=1)
EOF
  for s in "${order[@]}"; do echo "======== $s (${status[$s]}, ${secs[$s]} s)"; cat "$logs/$s.log" 2>/dev/null; done |
    tail -c 15000000 > "$OUT/all.log"
  tar -czf "$OUT/logs.tar.gz" -C "$work" logs 2>/dev/null || true
}

fails=0
for s in $steps; do
  order+=("$s")
  start="$(date +%s)"
  left=$((deadline - start))
  dep="${needs[$s]:-}"
  if [ -n "$dep" ] && [ -n "${status[$dep]:-}" ] && [ "${status[$dep]}" != pass ]; then
    status[$s]="skipped: $dep did not pass"; secs[$s]=0
    echo "skipped: $dep did not pass" > "$logs/$s.log"
  elif ((left < 20)); then
    status[$s]="skipped: out of time (${left}s left)"; secs[$s]=0
    echo "skipped: out of time" > "$logs/$s.log"
  else
    b="${want[$s]}"; ((b > left)) && b=$left
    echo "== $s (budget ${b}s) =="
    timeout -k 10 "$b" bash "$self" --step "$s" > "$logs/$s.log" 2>&1
    rc=$?
    secs[$s]=$(($(date +%s) - start))
    case "$rc" in
      0) status[$s]=pass ;;
      77) status[$s]="skipped: $(grep -h 'skipped' "$logs/$s.log" | tail -1 | sed 's/^.*skipped:* *//' | cut -c1-60)" ;;
      124|137) status[$s]="TIMEOUT after ${b}s"; fails=$((fails + 1)) ;;
      *) status[$s]="FAIL (exit $rc)"; fails=$((fails + 1)) ;;
    esac
  fi
  echo "   $s: ${status[$s]} (${secs[$s]}s)"
  write_summary
done
cat "$OUT/summary.txt"
[ "$fails" = 0 ]
}

if [ "${1:-}" = "--step" ]; then
  mkdir -p "$logs"
  "step_$2"
  exit $?
fi
main "$@"; exit $?   # one line: nothing after it is read
