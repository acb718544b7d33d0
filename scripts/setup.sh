#!/usr/bin/env bash
# setup.sh — install what clrt needs from Debian, build it (Release) and install it.
# Idempotent and non-interactive: safe to run again; it only installs what is missing.
#   CLRT_PREFIX   install prefix (default /usr/local)
#   CLRT_CUDA     ON/OFF (default: ON when nvcc is found)
#   CLRT_EXTRA_PACKAGES  more Debian packages to install (the test script uses this)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
prefix="${CLRT_PREFIX:-/usr/local}"

# bubblewrap: the sandbox pass_rate runs the policy's code in (docs/sandbox.md).
# OpenBLAS: the OpenMP flavour. Measured against libopenblas0-pthread (bench/matmul.lua and a
# matmul + elementwise loop, 2 shared cores): sgemm alone is within noise of each other, but
# the pthread flavour's thread pool fights clrt's OpenMP loops (4x slower at n=256 when
# matmuls and elementwise ops alternate, as in training), while the OpenMP one shares them.
packages=(build-essential cmake pkg-config luajit libluajit-5.1-dev lua-cjson
          libcurl4-openssl-dev libopenblas-openmp-dev libreadline-dev libpcre2-dev libutf8proc-dev
          libmicrohttpd-dev ca-certificates bubblewrap ${CLRT_EXTRA_PACKAGES:-})
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# nvcc is usually not on PATH; CMake needs to be told where it is.
if [ -z "${CUDACXX:-}" ] && ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export CUDACXX=/usr/local/cuda/bin/nvcc
fi
cuda_flag=()
[ -n "${CLRT_CUDA:-}" ] && cuda_flag=(-DCLRT_CUDA="$CLRT_CUDA")

build="$here/build/release"
mkdir -p "$here/build"
cmake -S "$here" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$prefix" \
      "${cuda_flag[@]}" > "$build.configure.log" 2>&1 || { mkdir -p "$build"; cat "$build.configure.log"; exit 1; }
cmake --build "$build" -j"$(nproc)"
cmake --install "$build" > /dev/null
echo "setup: clrt $("$prefix/bin/clrt" --version | head -1 | cut -d' ' -f2) installed in $prefix/bin"
