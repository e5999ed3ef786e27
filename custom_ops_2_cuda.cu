// mul4's CUDA kernel. Compiled into libcustom_ops_aot_lib.so only when the torch in use was built with CUDA (CMake and
// custom_ops_2.py --jit both check); it computes with the same multiply_element() as the CPU and runtime kernels.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "multiply_by_constant.h"

namespace custom {
namespace native {
namespace {

template <typename T>
__global__ void mul4_kernel(const T* __restrict__ in, T* __restrict__ out, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    out[i] = detail::multiply_element<T, 4>(in[i]);
  }
}

at::Tensor mul4_cuda(const at::Tensor& input) {
  const c10::cuda::CUDAGuard device_guard(input.device());
  const at::Tensor src = input.contiguous();
  at::Tensor output = at::empty_like(src);
  const int64_t n = src.numel();
  if (n == 0) {
    return output;
  }
  constexpr int kThreads = 256;
  const int blocks = static_cast<int>(std::min<int64_t>((n + kThreads - 1) / kThreads, 65535));
  AT_DISPATCH_ALL_TYPES_AND2(at::kHalf, at::kBFloat16, src.scalar_type(), "my_ops::mul4", [&] {
    mul4_kernel<scalar_t><<<blocks, kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
        src.const_data_ptr<scalar_t>(), output.mutable_data_ptr<scalar_t>(), n);
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return output;
}

} // namespace

TORCH_LIBRARY_IMPL(my_ops, CUDA, m) {
  m.impl("mul4", TORCH_FN(mul4_cuda));
}

} // namespace native
} // namespace custom
