#!/bin/bash
# build_llama_server.sh DIR — llama.cpp's llama-server for bench/serve.lua, from what npm
# ships: node-llama-cpp bundles llama.cpp's source (llama/gitRelease.bundle, a git bundle)
# and @node-llama-cpp/linux-x64 its prebuilt libraries (libllama, libllama-common, ggml and
# the per-CPU ggml backends) but no programs. This compiles only the server's own sources,
# mtmd (which it links) and two vendored hashes against those libraries (~7 min on 2 cores),
# and puts the binary beside the libraries, where ggml looks for its CPU backends.
# Also llama-quantize (the Q8_0/Q4_0/BF16 peers of bench/serve.lua quant=int8 and
# bench/llama_cpp.lua) and llama-batched-bench (bench/llama_cpp.lua's prefill and decode
# peer), each one tool's sources over the same libraries; TOOLS_ONLY=1 builds only those two
# (~2 min, no server) and prints their folder. Otherwise prints the server's path. Then:
#   clrt bench/serve.lua peer=DIR/package/bins/linux-x64/llama-server
#   clrt bench/llama_cpp.lua bin=DIR/package/bins/linux-x64
set -euo pipefail
dir=${1:?usage: build_llama_server.sh DIR}
version=${NODE_LLAMA_CPP_VERSION:-3.22.1}
mkdir -p "$dir" && cd "$dir"
[ -f node-llama-cpp-$version.tgz ] || npm pack --silent node-llama-cpp@$version @node-llama-cpp/linux-x64@$version > /dev/null
tar xzf node-llama-cpp-$version.tgz package/llama/gitRelease.bundle
tar xzf node-llama-cpp-linux-x64-$version.tgz
[ -d llama.cpp ] || git clone -q package/llama/gitRelease.bundle llama.cpp
# generates build-info.cpp, and ui.cpp/ui.h for the server (no web UI)
cmake -S llama.cpp -B build -DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF > cmake.log
L=$PWD/llama.cpp B=$PWD/build O=$PWD/obj P=$PWD/package/bins/linux-x64
inc="-I$L/include -I$L/ggml/include -I$L/common -I$L/vendor -I$L/vendor/hash -I$L/tools/mtmd -I$L/tools/server -I$L -I$B/tools/ui -I$B/common -I$L/src"
libs="-L$P -l:libllama-common.so -l:libllama.v0.5.0.so -l:libggml.v0.5.0.so -l:libggml-base.so -Wl,-rpath,$P -lpthread -ldl"
for t in quantize batched-bench; do
  g++ -std=c++17 -O2 -DNDEBUG $inc "$L/tools/$t/$t.cpp" "$L/tools/$t/main.cpp" -o "$P/llama-$t" $libs
done
if [ "${TOOLS_ONLY:-0}" = 1 ]; then echo "$P"; exit 0; fi
make -C build llama-ui-assets > /dev/null
mkdir -p "$O"
srcs="$L/tools/server/*.cpp $L/tools/mtmd/mtmd.cpp $L/tools/mtmd/clip.cpp $L/tools/mtmd/mtmd-audio.cpp \
  $L/tools/mtmd/mtmd-image.cpp $L/tools/mtmd/mtmd-helper.cpp $L/tools/mtmd/models/*.cpp $B/tools/ui/ui.cpp $L/vendor/hash/hash.cpp"
for f in $srcs; do echo "$f"; done | xargs -P "$(nproc)" -I{} sh -c \
  'o='"$O"'/$(echo {} | md5sum | cut -c1-12).o; [ -f $o ] || g++ -std=c++17 -O2 -DNDEBUG -fPIC '"$inc"' -c {} -o $o'
gcc -O2 -fPIC -I"$L/vendor/hash" -c "$L/vendor/hash/sha256/sha256.c" -o "$O/sha256.o"
g++ -o "$P/llama-server" "$O"/*.o $libs
echo "$P/llama-server"
