// The one kernel behind my_ops::mul3.out and my_ops::mul4.out (and the next "multiply by a constant" op a user adds):
// output = input * kFactor for every real dtype, matching PyTorch eager bit for bit (integer wrap-around, one rounding
// for Half/BFloat16). Each *_out.cpp kernel file is a one-line call into multiply_by_constant_out<kFactor>(); the
// speed (vector ISA dispatch, streaming stores, threads) comes from elementwise_loop.h.
//
// Compiled in one of two modes, like ExecuTorch's own kernels:
//   ExecuTorch mode (default): executorch::aten::Tensor; bad input fails the KernelRuntimeContext (the method returns
//     an error) instead of aborting the process.
//   ATen mode (-DUSE_ATEN_LIB, for the PyTorch AOT library): at::Tensor; bad input throws c10::Error, which PyTorch
//     raises in Python as RuntimeError.
#pragma once

#include <cstdint>
#include <type_traits>

#include <c10/macros/Macros.h>

#include "elementwise_loop.h"

#ifdef USE_ATEN_LIB
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#else
#include <executorch/runtime/kernel/thread_parallel_interface.h>
#include <executorch/runtime/core/exec_aten/util/scalar_type_util.h>
#include <executorch/runtime/core/exec_aten/util/tensor_shape_to_c_string.h>
#include <executorch/runtime/kernel/kernel_includes.h>
#endif

namespace custom {
namespace native {
namespace detail {

// x * kFactor with PyTorch's semantics for T. Host and device code (custom_ops_2_cuda.cu) share it.
template <typename T, int64_t kFactor>
C10_HOST_DEVICE inline T multiply_element(T x) {
  if constexpr (std::is_integral_v<T>) {
    // Unsigned arithmetic wraps modulo 2^bits like PyTorch's integer mul; signed overflow would be undefined.
    using Unsigned = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<Unsigned>(x) * static_cast<Unsigned>(kFactor));
  } else if constexpr (std::is_floating_point_v<T>) {
    return x * static_cast<T>(kFactor);
  } else {
    // Half and BFloat16: compute in float and round once, as ATen's CPU kernels do.
    return static_cast<T>(static_cast<float>(x) * static_cast<float>(kFactor));
  }
}

template <int64_t kFactor>
struct MultiplyBy {
  template <typename T>
  static T apply(T x) {
    return multiply_element<T, kFactor>(x);
  }
};

#ifndef USE_ATEN_LIB
inline auto shape_string(const executorch::aten::Tensor& t) {
  return executorch::runtime::tensor_shape_to_c_string({t.sizes().data(), t.sizes().size()});
}
#endif

} // namespace detail

#ifdef USE_ATEN_LIB

// The dtypes the kernel implements: every real dtype of aten::mul on CPU.
inline bool is_supported_dtype(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat: case at::kDouble: case at::kHalf: case at::kBFloat16:
    case at::kByte: case at::kChar: case at::kShort: case at::kInt: case at::kLong:
      return true;
    default:
      return false;
  }
}
constexpr const char* kSupportedDtypes = "float32, float64, float16, bfloat16, uint8, int8, int16, int32, int64";

inline void check_supported_dtype(at::ScalarType dtype, const char* op_name) {
  TORCH_CHECK(is_supported_dtype(dtype), op_name, ": unsupported dtype ", dtype, "; supported: ", kSupportedDtypes);
}

// The out variant's contract, shared by the CPU kernel below and the Meta kernels (custom_ops_2.cpp), so fake tensors
// see exactly the errors and the output shape the real kernel produces.
inline void check_output_and_resize(const at::Tensor& in, at::Tensor& out, const char* op_name) {
  TORCH_CHECK(
      out.scalar_type() == in.scalar_type(),
      op_name, ": output dtype ", out.scalar_type(), " does not match input dtype ", in.scalar_type(),
      "; allocate the output with the input's dtype");
  check_supported_dtype(in.scalar_type(), op_name);
  if (out.sizes() != in.sizes()) {
    out.resize_(in.sizes());
  }
}

template <int64_t kFactor>
at::Tensor& multiply_by_constant_out(const at::Tensor& in, at::Tensor& out, const char* op_name) {
  TORCH_CHECK(
      in.device().is_cpu() && out.device().is_cpu(),
      op_name, ": this kernel runs on CPU tensors, got input on ", in.device(), " and output on ", out.device());
  check_output_and_resize(in, out, op_name);
  const auto dtype = in.scalar_type();
  const at::Tensor src = in.contiguous();
  // Strided outputs get a contiguous scratch result that is copied back, so the inner loop stays flat.
  at::Tensor dst = out.is_contiguous() ? out : at::empty_like(out, at::MemoryFormat::Contiguous);
  AT_DISPATCH_ALL_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "multiply_by_constant_out", [&] {
    elementwise::apply_unary<scalar_t, detail::MultiplyBy<kFactor>>(
        src.const_data_ptr<scalar_t>(), dst.mutable_data_ptr<scalar_t>(), src.numel(),
        [](int64_t begin, int64_t end, int64_t grain, const auto& fn) {
          at::parallel_for(begin, end, grain, fn);
          return true;
        });
  });
  if (!dst.is_same(out)) {
    out.copy_(dst);
  }
  return out;
}

#else // ExecuTorch mode

template <int64_t kFactor>
executorch::aten::Tensor& multiply_by_constant_out(
    executorch::runtime::KernelRuntimeContext& ctx,
    const executorch::aten::Tensor& in,
    executorch::aten::Tensor& out,
    const char* op_name) {
  using executorch::runtime::Error;
  ET_KERNEL_CHECK_MSG(
      ctx, out.scalar_type() == in.scalar_type(), InvalidArgument, out,
      "%s: output dtype %s does not match input dtype %s; the output must have the input's dtype",
      op_name, executorch::runtime::toString(out.scalar_type()), executorch::runtime::toString(in.scalar_type()));
  // Dynamic-shape programs plan the output at its upper bound and expect the kernel to resize it to the real shape.
  ET_KERNEL_CHECK_MSG(
      ctx, executorch::runtime::resize_tensor(out, in.sizes()) == Error::Ok, InvalidArgument, out,
      "%s: the output has shape %s and cannot be resized to the input's shape %s; export the program so the "
      "output's shape matches the input (or is dynamic with a large enough upper bound)",
      op_name, detail::shape_string(out).data(), detail::shape_string(in).data());
  // Same dim order means the same element order in memory, so one flat loop is correct for any layout.
  ET_KERNEL_CHECK_MSG(
      ctx, executorch::runtime::tensors_have_same_dim_order(in, out), InvalidArgument, out,
      "%s: input and output have different dim orders (memory layouts); export them with the same memory format",
      op_name);
  bool all_work_ran = true;
  ET_SWITCH_REALHBF16_TYPES(in.scalar_type(), ctx, op_name, CTYPE, [&] {
    all_work_ran = elementwise::apply_unary<CTYPE, detail::MultiplyBy<kFactor>>(
        in.const_data_ptr<CTYPE>(), out.mutable_data_ptr<CTYPE>(), in.numel(),
        [](int64_t begin, int64_t end, int64_t grain, const auto& fn) {
          return executorch::extension::parallel_for(begin, end, grain, fn);
        });
  });
  ET_KERNEL_CHECK_MSG(ctx, all_work_ran, Internal, out, "%s: the threadpool did not run all of the work", op_name);
  return out;
}

#endif // USE_ATEN_LIB

} // namespace native
} // namespace custom
