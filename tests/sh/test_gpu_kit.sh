#!/usr/bin/env bash
# test_gpu_kit.sh — the GPU validation kit (scripts/gpu, docs/gpu.md) as far as a machine
# without a GPU goes. prepare.sh fetches the Debian packages into .gpu (kept between runs);
# run.sh with CLRT_GPU_DRY=1 unpacks them into its private prefix, builds clrt (with nvcc when
# there) in a clean environment that cannot see this machine's copies, checks that the build
# read the prefix's headers and loads the prefix's libraries, runs the CPU tests, and skips
# the GPU steps with their reason. Then the same kit without one package (libcurl's headers)
# must fail its build: the check cannot pass on what this machine has installed.
# Skipped (77) only when apt-get cannot download (no Debian mirror).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

set +e
bash "$here/scripts/gpu/prepare.sh" > "$tmp/prepare.log" 2>&1
rc=$?
set -e
cat "$tmp/prepare.log" | grep -v '^Get:' || true
if [ "$rc" = 3 ]; then echo "skipped: apt-get download is not possible here (see above)"; exit 77; fi
[ "$rc" = 0 ] || fail "prepare.sh exited $rc"
grep -q 'MiB of the device tool.s 64 MiB' "$tmp/prepare.log" || fail "prepare.sh printed no size"
grep -q '^glibc_needed=2\.[0-9]*$' "$here/.gpu/manifest.txt" || fail "no glibc figure in the manifest"

# The dry run: the CPU-side steps of `check`.
out="$tmp/out"
set +e
OUT="$out" CLRT_GPU_DRY=1 bash "$here/scripts/gpu/run.sh" check > "$tmp/run.log" 2>&1
rc=$?
set -e
cat "$out/summary.txt" 2>/dev/null || tail -50 "$tmp/run.log"
[ "$rc" = 0 ] || fail "run.sh check (dry) exited $rc"
row() { grep -E "^$1 " "$out/summary.txt" | head -1; }
for s in env unpack build cpu_tests; do
  row "$s" | grep -q ' pass ' || fail "step $s did not pass: $(row "$s")"
done
for s in cuda_tests sanitize hf; do
  row "$s" | grep -qE ' (pass|skipped: .+) ' || fail "step $s: $(row "$s")"
done
row cuda_tests | grep -q 'skipped: dry run' || fail "cuda_tests should skip in a dry run: $(row cuda_tests)"
grep -q '^  prefix_clean=yes$' "$out/summary.txt" || fail "the build used something outside the prefix"
grep -q 'headers: every kit library' "$out/all.log" || fail "no header check in the build log"
n="$(find "$out" -type f | wc -l)"
[ "$n" -le 8 ] || fail "$n files under OUT (the device tool brings back 8)"
for f in summary.txt summary.json all.log logs.tar.gz; do [ -s "$out/$f" ] || fail "no $f"; done
/usr/bin/python3 -c "import json,sys; d=json.load(open(sys.argv[1])); assert d['steps']['build'] == 'pass', d" \
  "$out/summary.json" || fail "summary.json does not say the build passed"

# Planted fault: the kit without libcurl's development package. With this machine's own
# libcurl headers and .pc in /usr, only a build that cannot see them fails as it must.
mkdir -p "$tmp/kit/debs"
grep -v '^deb=libcurl4-openssl-dev_' "$here/.gpu/manifest.txt" > "$tmp/kit/manifest.txt"
ln -s "$here"/.gpu/debs/*.deb "$tmp/kit/debs/"
set +e
OUT="$tmp/out2" CLRT_GPU_DRY=1 CLRT_GPU_KIT="$tmp/kit" CLRT_GPU_WORK="$tmp/work" CLRT_GPU_BUILD="$tmp/build" \
  bash "$here/scripts/gpu/run.sh" env,unpack,build > "$tmp/run2.log" 2>&1
rc=$?
set -e
[ "$rc" = 1 ] || { cat "$tmp/out2/summary.txt" 2>/dev/null; fail "a kit without libcurl4-openssl-dev did not fail (exit $rc)"; }
grep -E '^build ' "$tmp/out2/summary.txt" | grep -q FAIL || fail "the build step did not fail without libcurl's headers"
grep -q "libcurl" "$tmp/out2/all.log" || fail "the failing build does not name libcurl"
echo "gpu kit: dry run passed; a kit missing libcurl4-openssl-dev fails its build"
