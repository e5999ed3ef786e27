// ATen's out= resize rule, broadcast shape and empty_like for the ATen-mode kernels (the PyTorch side), declared as
// ATen/native/Resize.h, ATen/ExpandUtils.h and ATen/ops/empty_like_ops.h declare them. The first two, like every
// ATen/ops/<op>.h, pull in most of ATen: ~3 s more for each ATen-mode compile, of which a cold test run makes about
// fifty. The functions are libtorch's own (TORCH_API): a declaration that stopped matching libtorch's is an undefined
// symbol when the library links (every library built against libtorch links with --no-undefined), never a call of
// something else.
#pragma once

#ifdef USE_ATEN_LIB
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like_ops.h>
#include <c10/util/DimVector.h>

namespace at {

TORCH_API c10::SymDimVector infer_size_symdimvector(c10::SymIntArrayRef a, c10::SymIntArrayRef b);

namespace native {

// False when `output` already has `shape`; else true, after warning (as ATen's out= ops do) when it was not empty.
TORCH_API bool resize_output_check(const Tensor& output, IntArrayRef shape);
TORCH_API bool resize_output_check_symint(const Tensor& output, c10::SymIntArrayRef shape);

} // namespace native
} // namespace at

namespace custom {
namespace native {

// at::empty_like(t): t's shape, dtype and device, and its strides when it is dense; the operator at::empty_like calls.
inline at::Tensor aten_empty_like(const at::Tensor& t) {
  return at::_ops::empty_like::call(t, std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt);
}

} // namespace native
} // namespace custom
#endif
