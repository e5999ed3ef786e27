# Cross-compiles the runtime side (kernel library, runner) for 64-bit ARM Linux with Debian's GNU cross toolchain
# (g++-aarch64-linux-gnu), against the aarch64 executorch wheel unpacked by `bash test_custom_ops.sh aarch64`:
#   cmake -S . -B cmake-out/aarch64/custom_ops_1 -G Ninja --toolchain cmake/aarch64-linux-gnu.toolchain.cmake \
#     -DEXECUTORCH_PACKAGE_DIR=<unpacked wheel>/executorch -DCUSTOM_OPS_BUILD_AOT_LIBRARY=OFF ...
# GNU, not clang/libc++: the wheel's libraries use libstdc++'s C++ ABI. Binaries run under qemu-aarch64 (set below, for
# ctest and add_custom_command) or on the device.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)

# Libraries and headers of the target come from its sysroot; programs (python, codegen) and CMake packages (the
# unpacked wheel, given by path) from the host.
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)

set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64 -L /usr/aarch64-linux-gnu)
