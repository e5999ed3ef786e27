// Generated from custom_ops.yaml by executorch.codegen.gen: declarations of the kernels the yaml binds.
// ${generated_comment}
// clang-format off
#pragma once

#include <tuple>  // kernels of ops with several outputs return std::tuple<Tensor&, ...>

#ifdef USE_ATEN_LIB
// Only at::Tensor and its argument types: the generator's choice here (ATen/ATen.h and torch/torch.h) took most of
// the compile time of every file including this one.
#include <ATen/core/Tensor.h>
#else
${headers}
#endif

${nativeFunctions_declarations}
