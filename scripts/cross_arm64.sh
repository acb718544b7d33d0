#!/usr/bin/env bash
# cross_arm64.sh — build clrt for aarch64 on an x86-64 Debian host and run its C kernel and
# model tests under qemu-aarch64: once at the CPU's best level (neon; qemu's default cpu has
# the dot product), once with CLRT_CPU=portable, and the int8 and level tests once more on a
# cpu without the dot product (QEMU_CPU=cortex-a72). Prints ctest's summary for each pass and
# a total, and exits non-zero on any failure.
# Idempotent and non-interactive like setup.sh: it installs only what is missing (the cross
# compiler, qemu-user, the arm64 -dev packages through dpkg's multiarch), configures
# build/arm64 (CLRT_CUDA=OFF, cmake/aarch64-linux-gnu.cmake) and builds everything there.
#   CLRT_ARM64_TESTS  the C tests to run (names without c_; default below)
#   CLRT_ARM64_SKIP=1 do nothing (a CI machine that cannot install foreign packages)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
start=$(date +%s)

if [ "${CLRT_ARM64_SKIP:-0}" = 1 ]; then
  echo "cross_arm64: skipped (CLRT_ARM64_SKIP=1)"
  exit 0
fi
if [ "$(uname -m)" != x86_64 ]; then
  echo "cross_arm64: this host is $(uname -m), not x86-64: build natively instead (scripts/test.sh)"
  exit 0
fi

sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }

# The host's tools, then arm64 libraries: what clrt_core, the tests and the clrt binary link.
host_packages=(cmake make pkg-config gcc-aarch64-linux-gnu libc6-dev-arm64-cross)
arm_packages=(libc6-dev:arm64 libgomp1:arm64 libopenblas-openmp-dev:arm64 libluajit-5.1-dev:arm64
              libpcre2-dev:arm64 libutf8proc-dev:arm64 libcurl4-openssl-dev:arm64
              libmicrohttpd-dev:arm64 libreadline-dev:arm64)
missing=()
for p in "${host_packages[@]}"; do installed "$p" || missing+=("$p"); done
command -v qemu-aarch64 >/dev/null || command -v qemu-aarch64-static >/dev/null || missing+=(qemu)
if ! dpkg --print-foreign-architectures | grep -qx arm64; then
  echo "cross_arm64: adding dpkg architecture arm64"
  $sudo dpkg --add-architecture arm64
  missing+=("${arm_packages[@]}")
else
  for p in "${arm_packages[@]}"; do installed "$p" || missing+=("$p"); done
fi
if ((${#missing[@]})); then
  $sudo apt-get update -qq
  want=()
  for p in "${missing[@]}"; do
    if [ "$p" = qemu ]; then
      # Debian 12: qemu-user (qemu-aarch64); some releases only ship qemu-user-static.
      if apt-cache show qemu-user >/dev/null 2>&1; then want+=(qemu-user); else want+=(qemu-user-static); fi
    else
      want+=("$p")
    fi
  done
  echo "cross_arm64: installing ${want[*]}"
  $sudo apt-get install -y -qq --no-install-recommends "${want[@]}" > /dev/null
fi
qemu="$(command -v qemu-aarch64 || command -v qemu-aarch64-static)"

build="$here/build/arm64"
mkdir -p "$here/build"
cmake -S "$here" -B "$build" -DCMAKE_TOOLCHAIN_FILE="$here/cmake/aarch64-linux-gnu.cmake" \
      -DCMAKE_BUILD_TYPE=Release -DCLRT_CUDA=OFF -DCLRT_MPI=OFF > "$build.configure.log" 2>&1 ||
  { cat "$build.configure.log"; exit 1; }
cmake --build "$build" -j"$(nproc)" > "$build.build.log" 2>&1 || { tail -n 60 "$build.build.log"; exit 1; }
echo "cross_arm64: built $(file -b "$build/clrt" | cut -d, -f1-2) in $build (build log: $build.build.log)"
echo "cross_arm64: running tests with $("$qemu" --version | head -1)"

# The C kernel and model tests at the CPU's best level (neon) and, as their @portable copies
# (tests/CMakeLists.txt), with CLRT_CPU=portable, in one ctest run so both cores stay busy;
# the other C tests that need no network at neon only. test_model_kernels is the long one
# under qemu: 160-195 s a level on 2 busy cores (its finite differences run each forward
# thousands of times), against 36 s natively on x86.
kernel_tests="test_cpu_levels test_model_kernels test_linear_int8 test_gemm_bf16 test_tensor_ops
  test_model_cached test_shared_math test_tensor_core"
other_tests="test_model_workspace test_model_contexts test_sample test_safetensors test_json_grammar test_tokenizer_bpe test_tokenizer_sp"
tests="${CLRT_ARM64_TESTS:-$kernel_tests $other_tests}"
alt() { echo $* | tr ' ' '|'; }
failed=0 summary=""
run_pass() {   # name, test regex, then VAR=value ... for the pass
  local name="$1" re="$2"; shift 2
  echo "== arm64 under qemu: $name =="
  local log="$build/ctest-$(echo "$name" | tr -cs "a-z0-9" "-").log" rc=0 t0=$(date +%s)
  env OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(nproc)}" "$@" \
    ctest --test-dir "$build" --output-on-failure --no-tests=error -j"$(nproc)" -R "$re" > "$log" 2>&1 || rc=$?
  grep -E "Test +#[0-9]+:|tests passed|tests failed" "$log" || true
  if [ $rc -ne 0 ]; then
    failed=1
    sed -n '/The following tests FAILED/,$p' "$log"
  fi
  local level
  for level in neon portable; do
    local sel='Test +#[0-9]+: c_test_[a-z0-9_]+ '
    [ $level = portable ] && sel='Test +#[0-9]+: c_test_[a-z0-9_]+@portable '
    local p f k
    p=$(grep -E "$sel" "$log" | grep -cE " Passed " || true)
    k=$(grep -E "$sel" "$log" | grep -cE "Skipped" || true)
    f=$(grep -E "$sel" "$log" | grep -vE " Passed |Skipped" | grep -c . || true)
    [ $((p + k + f)) -gt 0 ] && summary="$summary
  $name, $level: $p passed, $f failed, $k skipped"
  done
  echo "($(($(date +%s) - t0)) s)"
}
t_built=$(date +%s)
echo "cross_arm64: configure and build took $((t_built - start)) s"
run_pass "default cpu (max: dotprod)" "^c_($(alt $tests))(@portable)?\$"
run_pass "cortex-a72 (no dotprod)" "^c_(test_linear_int8|test_cpu_levels)\$" QEMU_CPU=cortex-a72

secs=$(($(date +%s) - start))
echo "cross_arm64: summary (${secs} s in all):$summary"
if [ $failed -ne 0 ] || echo "$summary" | grep -qE " [1-9][0-9]* failed"; then
  echo "cross_arm64: FAILED"
  exit 1
fi
echo "cross_arm64: all passed"
