// ATen's out= resize rule and broadcast shape for the ATen-mode kernels (the PyTorch side), declared here as
// ATen/native/Resize.h and ATen/ExpandUtils.h declare them. Those headers, like every ATen/ops/*.h, pull in most of
// ATen: ~3 s more for each ATen-mode compile, of which a cold test run makes about fifty. The functions are
// libtorch's own (TORCH_API): a declaration that stopped matching libtorch's is an undefined symbol when the library
// links (every library built against libtorch links with --no-undefined), never a call of something else.
#pragma once

#ifdef USE_ATEN_LIB
#include <ATen/core/Tensor.h>
#include <c10/util/DimVector.h>

namespace at {

TORCH_API c10::SymDimVector infer_size_symdimvector(c10::SymIntArrayRef a, c10::SymIntArrayRef b);

namespace native {

// False when `output` already has `shape`; else true, after warning (as ATen's out= ops do) when it was not empty.
TORCH_API bool resize_output_check(const Tensor& output, IntArrayRef shape);
TORCH_API bool resize_output_check_symint(const Tensor& output, c10::SymIntArrayRef shape);

} // namespace native
} // namespace at
#endif
