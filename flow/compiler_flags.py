"""The flags every kernel build passes, whoever builds it: the wheel (setup.py) and the JIT build
(flow/registration.py) read them here; CMakeLists.txt and targets.bzl state the same (tests/test_no_contraction.py checks
each build's compile commands).

Kernels are compared with ATen bit for bit, and ATen computes a*b + c as two operations, rounding twice. Left to
itself the compiler fuses them into one FMA, rounding once, wherever the target has FMA: always on ARM64, and in the
elementwise helper's AVX2 and AVX-512 variants on x86 (an a*b + c op was 1 ulp off ATen on ARM64). So no build may
contract floating-point expressions; a kernel that wants an FMA writes std::fma. (An op compared within a tolerance
may allow contraction in its own source with a pragma: ops/sdpa_with_cache/sdpa_with_cache_out.cpp.)
"""

CXX = ["-ffp-contract=off"]
NVCC = ["--fmad=false", "-Xcompiler=-ffp-contract=off"]
# Kernels compiled against at::Tensor (the AOT library). AT_PER_OPERATOR_HEADERS: ATen's headers declare an op only
# where ATen/ops/<op>.h is included, not every op (a third of each such compile); CMake's torch target says the same.
ATEN_MODE = ["-DUSE_ATEN_LIB", "-DAT_PER_OPERATOR_HEADERS"]
