// mul4's CUDA kernels, for mul4 and mul4.out. Compiled into libcustom_ops_aot_lib.so only when the torch in use was built
// with CUDA and a CUDA compiler is found (CMake and custom_ops_2.py --jit both check); the out variant keeps the CPU
// kernel's contract (kernel_helpers/unary_elementwise.h) and each element is the same MultiplyBy<4> functor.
#include <ATen/Dispatch.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/core/Tensor.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>

#include "declared_dtypes/my_ops/mul4.h"
#include "kernel_helpers/unary_elementwise.h"
#include "kernel_helpers/multiply_by_constant.h"

namespace custom {
namespace native {
namespace {

constexpr const char* kOutOpName = "my_ops::mul4.out";

// No __restrict__: in place (out == in) is allowed, and restrict would let the compiler assume they never alias.
template <typename T>
__global__ void mul4_kernel(const T* in, T* out, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    out[i] = elementwise::apply_op<MultiplyBy<4>>(in[i]);
  }
}

// out = in * 4 over n contiguous elements, on the current stream of in's device.
void launch_mul4(const at::Tensor& in, at::Tensor& out) {
  const int64_t n = in.numel();
  if (n == 0) {
    return;
  }
  constexpr int kThreads = 256;
  // A grid-stride loop: enough blocks to fill any GPU, each thread then strides over the rest.
  const int blocks = static_cast<int>(std::min<int64_t>((n + kThreads - 1) / kThreads, 65535));
  AT_DISPATCH_ALL_TYPES_AND2(at::kHalf, at::kBFloat16, in.scalar_type(), kOutOpName, [&] {
    mul4_kernel<scalar_t><<<blocks, kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
        in.const_data_ptr<scalar_t>(), out.mutable_data_ptr<scalar_t>(), n);
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

at::Tensor& mul4_out_cuda(const at::Tensor& input, at::Tensor& output) {
  TORCH_CHECK(
      input.is_cuda() && output.device() == input.device(),
      kOutOpName, ": input and output must be on the same CUDA device, got ", input.device(), " and ", output.device());
  const c10::cuda::CUDAGuard device_guard(input.device());
  at::assert_no_internal_overlap(output);
  at::assert_no_partial_overlap(output, input);
  check_output_and_resize<declared_dtypes::my_ops::mul4>(input, output, kOutOpName);
  if (input.is_non_overlapping_and_dense() && output.is_non_overlapping_and_dense() &&
      input.strides() == output.strides()) {
    launch_mul4(input, output);
    return output;
  }
  const at::Tensor src = input.contiguous();
  at::Tensor dst = at::empty_like(src, at::MemoryFormat::Contiguous);
  launch_mul4(src, dst);
  output.copy_(dst);
  return output;
}

at::Tensor mul4_cuda(const at::Tensor& input) {
  at::Tensor output = at::empty_like(input);
  return mul4_out_cuda(input, output);
}

} // namespace

TORCH_LIBRARY_IMPL(my_ops, CUDA, m) {
  m.impl("mul4", TORCH_FN(mul4_cuda));
  m.impl("mul4.out", TORCH_FN(mul4_out_cuda));
}

} // namespace native
} // namespace custom
