// The one kernel helper for unary elementwise ops: `output = Op(input)` elementwise, for the op's dtypes, behind the
// out-variant contract that EXIR's memory planning and PyTorch's out= convention expect. A kernel file is a functor
// (see elementwise_functor.h) plus one call of unary_elementwise_out<Op, Dtypes>(); the speed is elementwise_loop.h's.
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

#include "elementwise.h"  // the N-input helper; this file is its one-input case, plus PyTorch's functional/Meta kernels
#include "kernel_contract.h"

#include "aten_out_rules.h"

namespace custom {
namespace native {

#ifdef USE_ATEN_LIB

// Every helper here takes the op's dtype set, Dtypes (its declared one, declared_dtypes::<namespace>::<name> from
// declared_dtypes/<namespace>/<name>.h), and refuses the others with the out kernel's words.
template <typename Dtypes>
void check_supported_dtype(at::ScalarType dtype, const char* op_name) {
  TORCH_CHECK(Dtypes::contains(dtype), op_name, ": input has unsupported dtype ", contract::dtype_name(dtype),
              "; supported: ", Dtypes::names());
}

// The functional op's CPU kernel, from the out variant's: a result laid out like the input (channels-last stays
// channels-last, as with ATen's elementwise ops), filled by OutKernel; its errors under the functional op's name.
template <at::Tensor& (*OutKernel)(const at::Tensor&, at::Tensor&)>
at::Tensor unary_elementwise_functional(const at::Tensor& input) {
  at::Tensor output = aten_empty_like(input);
  return contract::reported_as_functional([&]() -> at::Tensor { return OutKernel(input, output); });
}

// The functional op's Meta kernel: a result like the input (shape, dtype, layout), nothing computed.
template <typename Dtypes>
at::Tensor unary_elementwise_meta(const at::Tensor& input, const char* op_name) {
  check_supported_dtype<Dtypes>(input.scalar_type(), op_name);
  return aten_empty_like(input);
}

// The out variant's checks and resize, shared by the CPU kernel below and the Meta kernel of the out variant, so fake
// tensors see the errors and output shape the real kernel produces. Sizes stay symbolic (torch.export with Dim), and
// the resize warns like ATen's out= ops when a non-empty output has the wrong shape.
template <typename Dtypes>
void check_output_and_resize(const at::Tensor& in, at::Tensor& out, const char* op_name) {
  TORCH_CHECK(
      out.scalar_type() == in.scalar_type(),
      op_name, ": output dtype ", contract::dtype_name(out.scalar_type()), " does not match input dtype ",
      contract::dtype_name(in.scalar_type()), "; allocate the output with the input's dtype");
  check_supported_dtype<Dtypes>(in.scalar_type(), op_name);
  if (at::native::resize_output_check_symint(out, in.sym_sizes())) {
    out.resize__symint(in.sym_sizes(), in.suggest_memory_format());
  }
}

// The out variant's Meta kernel.
template <typename Dtypes>
at::Tensor& unary_elementwise_out_meta(const at::Tensor& in, at::Tensor& out, const char* op_name) {
  check_output_and_resize<Dtypes>(in, out, op_name);
  return out;
}

// The out variant's CPU kernel: out = Op(in), the one-input case of elementwise_out().
template <typename Op, typename Dtypes>
at::Tensor& unary_elementwise_out(const at::Tensor& in, at::Tensor& out, const char* op_name) {
  return elementwise_out<Dtypes>(op_name, Op{}, {out, "output"}, {{in, "input"}});
}

#else // ExecuTorch mode

// The out variant's runtime kernel: out = Op(in), the one-input case of elementwise_out().
template <typename Op, typename Dtypes>
executorch::aten::Tensor& unary_elementwise_out(
    executorch::runtime::KernelRuntimeContext& ctx,
    const executorch::aten::Tensor& in,
    executorch::aten::Tensor& out,
    const char* op_name) {
  return elementwise_out<Dtypes>(ctx, op_name, Op{}, {out, "output"}, {{in, "input"}});
}

#endif // USE_ATEN_LIB

} // namespace native
} // namespace custom
