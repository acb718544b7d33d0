# packages.sh — the Debian 12 packages the GPU kit carries (sourced by prepare.sh and run.sh).
# The GPU image (see docs/gpu.md) has CUDA, gcc, CMake and Python but none of clrt's Debian
# dependencies. Runtime libraries are taken with everything they depend on, except what any
# glibc system with gcc has (KIT_BASE); development packages (headers, .pc files, .so links)
# are taken alone: their own dependencies are other headers clrt never includes.
KIT_RUNTIME=(libluajit-5.1-2 lua-cjson libcurl4 libopenblas0-openmp libreadline8 libpcre2-8-0
             libutf8proc2 libmicrohttpd12 pkgconf-bin libpkgconf3)
KIT_DEV=(libluajit-5.1-dev libcurl4-openssl-dev libopenblas-openmp-dev libreadline-dev libpcre2-dev
         libutf8proc-dev libmicrohttpd-dev)
# Left to the image: glibc, gcc's runtime (libgcc_s, libgomp: OpenMP must be the compiler's
# own), and packaging tools that come with the dependency tree but hold no library clrt loads.
KIT_BASE=(libc6 libgcc-s1 gcc-12-base libgomp1 libstdc++6 dpkg install-info tar libacl1 libselinux1
          libbz2-1.0 liblzma5 libmd0 debconf perl-base)
# Libraries clrt may load from the image rather than the kit (the ldd check of run.sh):
# glibc's, gcc's runtime and CUDA's.
KIT_SYSTEM_LIBS='^(linux-vdso|ld-linux-x86-64|libc|libm|libdl|libpthread|librt|libresolv|libgcc_s|libstdc\+\+|libgomp|libcuda|libcudart|libcublas|libcublasLt|libnccl|libnvidia-[a-z-]+)\.so'
