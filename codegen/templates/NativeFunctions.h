// Generated from custom_ops.yaml by executorch.codegen.gen: declarations of the kernels the yaml binds.
// ${generated_comment}
// clang-format off
#pragma once

${headers}

${nativeFunctions_declarations}
