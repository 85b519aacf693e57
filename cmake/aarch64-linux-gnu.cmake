# Cross-compiles nodetron's cpu addon for Linux arm64 (aarch64: AWS Graviton, NVIDIA Grace in GH200/GB200
# nodes) on an x86-64 Debian/Ubuntu machine. scripts/arm64/build.mjs drives it (into build-arm64/, never
# build/); by hand:
#   cmake -S . -B build-arm64 -G Ninja -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake \
#     -DNT_ARM64_GLOO_ROOT=<folder holding usr/share/cmake/Gloo> -DNT_TESTING=OFF -DNT_CUDA=OFF
# What it needs: g++-aarch64-linux-gnu, and the arm64 OpenBLAS from Debian's multiarch packages
# (dpkg --add-architecture arm64; apt-get install libopenblas-dev:arm64 libhiredis-dev:arm64 libibverbs-dev:arm64).
# Debian's libgloo-dev is not multiarch (it installs to /usr/lib and /usr/share/cmake), so its arm64 build
# cannot sit beside the x86-64 one: scripts/arm64/build.mjs unpacks the arm64 .debs into
# build-arm64/sysroot and passes that folder as NT_ARM64_GLOO_ROOT.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)

set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_STRIP aarch64-linux-gnu-strip CACHE FILEPATH "strip for arm64 objects")

# Libraries and headers: the cross compiler's own sysroot, Debian's multiarch folders under / (found
# through CMAKE_LIBRARY_ARCHITECTURE: /usr/lib/aarch64-linux-gnu), and the unpacked arm64 Gloo.
# Programs (node, python3) are the build machine's.
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu / ${NT_ARM64_GLOO_ROOT})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
if(NT_ARM64_GLOO_ROOT)
  set(Gloo_DIR ${NT_ARM64_GLOO_ROOT}/usr/share/cmake/Gloo CACHE PATH "the arm64 Gloo's CMake package" FORCE)
endif()
