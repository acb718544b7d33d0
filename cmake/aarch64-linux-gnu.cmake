# aarch64-linux-gnu.cmake — cross-build clrt for 64-bit Arm Linux from an x86-64 Debian host
# (scripts/cross_arm64.sh installs what this needs): Debian's gcc-aarch64-linux-gnu, the
# arm64 -dev packages through multiarch (dpkg --add-architecture arm64), and qemu-aarch64 to
# run what was built (ctest runs each test through CMAKE_CROSSCOMPILING_EMULATOR).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)

# Libraries and headers from the arm64 multiarch folders (and the cross toolchain's sysroot);
# programs (cmake's helpers, pkg-config) from the host.
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)

# pkg-config reads the arm64 .pc files only (the host's would name x86-64 libraries).
set(ENV{PKG_CONFIG_LIBDIR} /usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig)
set(ENV{PKG_CONFIG_PATH} "")

# qemu's -L is where the arm64 loader and libraries are. The -dev packages above bring
# Debian's libc6:arm64 into /lib/aarch64-linux-gnu, a later build than the cross toolchain's
# copy in /usr/aarch64-linux-gnu (2.36-9+deb12u14 against 2.36-8cross1 on Debian 12): with
# -L /usr/aarch64-linux-gnu qemu takes that loader but the other libc.so.6 (the loader finds
# it in the multiarch folder), and the mismatched pair spins forever in the first
# pthread_create (any OpenMP region of 2 threads). So -L / wherever libc6:arm64 is installed.
find_program(CLRT_QEMU_AARCH64 NAMES qemu-aarch64 qemu-aarch64-static)
if(EXISTS /lib/ld-linux-aarch64.so.1)
  set(CLRT_QEMU_SYSROOT / CACHE PATH "qemu-aarch64 -L: the arm64 loader's root")
else()
  set(CLRT_QEMU_SYSROOT /usr/aarch64-linux-gnu CACHE PATH "qemu-aarch64 -L: the arm64 loader's root")
endif()
if(CLRT_QEMU_AARCH64)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${CLRT_QEMU_AARCH64} -L ${CLRT_QEMU_SYSROOT})
endif()
