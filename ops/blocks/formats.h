// The formats my_ops::linear_blocks and embedding_blocks take, by GGUF type name: each is one source in formats/
// (its traits; kernel_helpers/block_formats.h makes its kernels) and one entry here. Python's statement of the same
// formats is ops/blocks/block_layouts.py; tests/test_block_formats.py holds the two to each other.
#pragma once

#include <string>
#include <string_view>

#include "kernel_helpers/block_formats.h"

#define CUSTOM_OPS_BLOCK_FORMATS(X) \
  X(F32) X(F16) X(BF16) X(Q8_0) X(Q4_0) X(Q4_1) X(Q5_0) X(Q5_1) X(Q2_K) X(Q3_K) X(Q4_K) X(Q5_K) X(Q6_K)

namespace custom {
namespace native {
namespace blocks {

#define CUSTOM_OPS_DECLARE_FORMAT(NAME) extern const FormatKernels kFormat##NAME;
CUSTOM_OPS_BLOCK_FORMATS(CUSTOM_OPS_DECLARE_FORMAT)
#undef CUSTOM_OPS_DECLARE_FORMAT

// The format called `name`, or nullptr.
inline const FormatKernels* find_format(std::string_view name) {
#define CUSTOM_OPS_MATCH_FORMAT(NAME) \
  if (name == #NAME) {                \
    return &kFormat##NAME;            \
  }
  CUSTOM_OPS_BLOCK_FORMATS(CUSTOM_OPS_MATCH_FORMAT)
#undef CUSTOM_OPS_MATCH_FORMAT
  return nullptr;
}

// "F32, F16, ...": what a refusal lists.
inline const char* format_names() {
#define CUSTOM_OPS_FORMAT_NAME(NAME) #NAME ", "
  static const std::string_view all = CUSTOM_OPS_BLOCK_FORMATS(CUSTOM_OPS_FORMAT_NAME);
#undef CUSTOM_OPS_FORMAT_NAME
  static const std::string names(all.substr(0, all.size() - 2));
  return names.c_str();
}

}  // namespace blocks
}  // namespace native
}  // namespace custom
