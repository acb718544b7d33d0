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

find_program(CLRT_QEMU_AARCH64 NAMES qemu-aarch64 qemu-aarch64-static)
if(CLRT_QEMU_AARCH64)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${CLRT_QEMU_AARCH64} -L /usr/aarch64-linux-gnu)
endif()
