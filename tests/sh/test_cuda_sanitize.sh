#!/usr/bin/env bash
# test_cuda_sanitize.sh — runs scripts/cuda_sanitize.sh (compute-sanitizer memcheck + racecheck
# over the CUDA tests) on the build under test; skipped (77) without a GPU or the sanitizer.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
bin="${CLRT_BIN:?CLRT_BIN must point at the clrt binary}"
exec bash "$here/scripts/cuda_sanitize.sh" "$(dirname "$bin")"
