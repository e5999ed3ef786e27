// Generated from custom_ops.yaml by executorch.codegen.gen: the functional C++ API of the selected ops.
// ${generated_comment}
// clang-format off
#pragma once

#include <tuple>

#include <executorch/runtime/core/exec_aten/exec_aten.h>
#include <executorch/runtime/kernel/kernel_runtime_context.h>

${static_dispatch_extra_headers}

namespace torch {
namespace executor {

${Functions_declarations}

} // namespace executor
} // namespace torch
