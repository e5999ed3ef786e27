// Generated from custom_ops.yaml by executorch.codegen.gen: declarations of the kernels the yaml binds.
// ${generated_comment}
// clang-format off
#pragma once

#include <tuple>  // kernels of ops with several outputs return std::tuple<Tensor&, ...>

${headers}

${nativeFunctions_declarations}
