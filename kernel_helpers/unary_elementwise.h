// The one kernel helper for unary elementwise ops: `output = Op(input)` elementwise, for every real dtype, behind the
// out-variant contract that EXIR's memory planning and PyTorch's out= convention expect. A kernel file is a functor
// (see elementwise_functor.h) plus one call of unary_elementwise_out<Op>(); the speed comes from elementwise_loop.h.
//
// Compiled in one of two modes, like ExecuTorch's own kernels:
//   ExecuTorch mode (default): executorch::aten::Tensor; bad input fails the KernelRuntimeContext through
//     ET_KERNEL_CHECK_MSG (the method returns an error with the message logged) instead of aborting the process.
//   ATen mode (-DUSE_ATEN_LIB, for the PyTorch AOT library): at::Tensor; bad input throws c10::Error (a RuntimeError in
//     Python). Also provides the Meta-kernel helpers, so fake tensors see the same errors and shapes.
//
// The contract, both modes: output dtype == input dtype, one of the supported dtypes; the output is resized to the
// input's shape (and, in ATen mode, laid out like the input when it had to be resized); input and output data exist,
// are aligned to their element size, and are the same memory (in place) or do not overlap.
#pragma once

#include <cstdint>

#include "elementwise_loop.h"
#include "kernel_contract.h"  // the checks and thread pool every kernel shares; this adds the elementwise cases

#ifdef USE_ATEN_LIB
#include <ATen/Dispatch.h>
#include <ATen/ops/empty_like.h>
#endif

namespace custom {
namespace native {

#ifdef USE_ATEN_LIB

// The dtypes the kernels implement: every real dtype of aten::mul on CPU.
constexpr const char* kSupportedDtypes = "float32, float64, float16, bfloat16, uint8, int8, int16, int32, int64";

inline bool is_supported_dtype(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat: case at::kDouble: case at::kHalf: case at::kBFloat16:
    case at::kByte: case at::kChar: case at::kShort: case at::kInt: case at::kLong:
      return true;
    default:
      return false;
  }
}

inline void check_supported_dtype(at::ScalarType dtype, const char* op_name) {
  TORCH_CHECK(is_supported_dtype(dtype), op_name, ": unsupported dtype ", dtype, "; supported: ", kSupportedDtypes);
}

// The functional op's CPU kernel, from the out variant's: a result laid out like the input (channels-last stays
// channels-last, as with ATen's elementwise ops), filled by OutKernel.
template <at::Tensor& (*OutKernel)(const at::Tensor&, at::Tensor&)>
at::Tensor unary_elementwise_functional(const at::Tensor& input) {
  at::Tensor output = at::empty_like(input);
  return OutKernel(input, output);
}

// The functional op's Meta kernel: a result like the input (shape, dtype, layout), nothing computed.
inline at::Tensor unary_elementwise_meta(const at::Tensor& input, const char* op_name) {
  check_supported_dtype(input.scalar_type(), op_name);
  return at::empty_like(input);
}

// The out variant's checks and resize, shared by the CPU kernel below and the Meta kernel of the out variant, so fake
// tensors see the errors and output shape the real kernel produces. Sizes stay symbolic (torch.export with Dim), and
// the resize warns like ATen's out= ops when a non-empty output has the wrong shape.
inline void check_output_and_resize(const at::Tensor& in, at::Tensor& out, const char* op_name) {
  TORCH_CHECK(
      out.scalar_type() == in.scalar_type(),
      op_name, ": output dtype ", out.scalar_type(), " does not match input dtype ", in.scalar_type(),
      "; allocate the output with the input's dtype");
  check_supported_dtype(in.scalar_type(), op_name);
  if (at::native::resize_output_check_symint(out, in.sym_sizes())) {
    out.resize__symint(in.sym_sizes(), in.suggest_memory_format());
  }
}

// The out variant's Meta kernel.
inline at::Tensor& unary_elementwise_out_meta(const at::Tensor& in, at::Tensor& out, const char* op_name) {
  check_output_and_resize(in, out, op_name);
  return out;
}

namespace detail {
// Same dense layout: element i of the input's memory is element i of the output's, so one flat loop is correct.
inline bool same_dense_layout(const at::Tensor& a, const at::Tensor& b) {
  return a.is_non_overlapping_and_dense() && b.is_non_overlapping_and_dense() && a.strides() == b.strides();
}

template <typename Op>
void run_flat(const at::Tensor& in, at::Tensor& out) {
  AT_DISPATCH_ALL_TYPES_AND2(at::kHalf, at::kBFloat16, in.scalar_type(), "unary_elementwise_out", [&] {
    elementwise::apply_unary<scalar_t, Op>(
        in.const_data_ptr<scalar_t>(), out.mutable_data_ptr<scalar_t>(), in.numel(),
        [](int64_t begin, int64_t end, int64_t grain, const auto& fn) {
          return contract::parallel_for(begin, end, grain, fn);
        });
  });
}
} // namespace detail

// The out variant's CPU kernel: out = Op(in).
template <typename Op>
at::Tensor& unary_elementwise_out(const at::Tensor& in, at::Tensor& out, const char* op_name) {
  TORCH_CHECK(
      in.device().is_cpu() && out.device().is_cpu(),
      op_name, ": this kernel runs on CPU tensors, got input on ", in.device(), " and output on ", out.device());
  // PyTorch's out= rules: an output whose elements alias each other, or that partially overlaps the input, would
  // give order-dependent results. Exactly the input (in place) is fine.
  at::assert_no_internal_overlap(out);
  at::assert_no_partial_overlap(out, in);
  check_output_and_resize(in, out, op_name);
  TORCH_CHECK(
      contract::is_element_aligned(in) && contract::is_element_aligned(out),
      op_name, ": input and output data must be aligned to their element size (", in.element_size(),
      " bytes); make a copy with .clone()");
  if (detail::same_dense_layout(in, out)) {
    detail::run_flat<Op>(in, out);
    return out;
  }
  // Other layouts (strided views): compute between contiguous buffers and copy back. The input is read whole before
  // the output is written, so this is also right where they overlap in ways too hard to analyse.
  const at::Tensor src = in.contiguous();
  at::Tensor dst = at::empty_like(src, at::MemoryFormat::Contiguous);
  detail::run_flat<Op>(src, dst);
  out.copy_(dst);
  return out;
}

#else // ExecuTorch mode

// The out variant's runtime kernel: out = Op(in).
template <typename Op>
executorch::aten::Tensor& unary_elementwise_out(
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
      op_name, contract::shape_string(out).data(), contract::shape_string(in).data());
  // Same dim order means the same element order in memory, so one flat loop is correct for any layout.
  ET_KERNEL_CHECK_MSG(
      ctx, executorch::runtime::tensors_have_same_dim_order(in, out), InvalidArgument, out,
      "%s: input and output have different dim orders (memory layouts); export them with the same memory format",
      op_name);
  if (in.numel() > 0) {
    ET_KERNEL_CHECK_MSG(
        ctx, in.const_data_ptr() != nullptr && out.const_data_ptr() != nullptr, InvalidArgument, out,
        "%s: the input or output has elements but no memory; the program's memory plan is corrupt, re-export it",
        op_name);
    ET_KERNEL_CHECK_MSG(
        ctx, contract::is_element_aligned(in) && contract::is_element_aligned(out), InvalidArgument, out,
        "%s: input or output data is not aligned to its %zu-byte elements; the program's memory plan is corrupt, "
        "re-export it", op_name, static_cast<size_t>(in.element_size()));
    // The same memory (in place), or none of it shared: a program's memory plan decides where tensors live, and a
    // corrupt one can place the output across the input.
    ET_KERNEL_CHECK_MSG(
        ctx, contract::same_or_disjoint(in, out, /*may_be_same=*/true), InvalidArgument, out,
        "%s: the output overlaps the input without being it (in place); the program's memory plan is corrupt, "
        "re-export it", op_name);
  }
  bool all_work_ran = true;
  ET_SWITCH_REALHBF16_TYPES(in.scalar_type(), ctx, op_name, CTYPE, [&] {
    all_work_ran = elementwise::apply_unary<CTYPE, Op>(
        in.const_data_ptr<CTYPE>(), out.mutable_data_ptr<CTYPE>(), in.numel(),
        [](int64_t begin, int64_t end, int64_t grain, const auto& fn) {
          return contract::parallel_for(begin, end, grain, fn);
        });
  });
  ET_KERNEL_CHECK_MSG(ctx, all_work_ran, Internal, out, "%s: the threadpool did not run all of the work", op_name);
  return out;
}

#endif // USE_ATEN_LIB

} // namespace native
} // namespace custom
