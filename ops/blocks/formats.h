// The formats my_ops::linear_blocks and embedding_blocks take, by GGUF type name: each is one source in formats/
// (its traits; kernel_helpers/block_formats.h makes its kernels). Their list and their layouts are
// ops/blocks/block_layouts.py's, written at build time into the generated ops/blocks/block_layouts.h: a format's
// source gets its kernels from format_kernels(), which checks its traits against that statement, so C++ and Python
// cannot disagree on a layout.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "kernel_helpers/block_formats.h"
#include "ops/blocks/block_layouts.h"  // generated: CUSTOM_OPS_BLOCK_FORMATS and stated::k<NAME>

namespace custom {
namespace native {
namespace blocks {

// Whether F's traits are the layout block_layouts.py states for it.
template <typename F>
constexpr bool is_stated(const stated::Layout& s) {
  if (std::string_view(F::kName) != s.name || F::kWeights != s.weights || F::kSub != s.sub ||
      F::kOffset != s.offset || static_cast<int>(F::kPlanes.size()) != s.planes ||
      static_cast<int>(F::kFields.size()) != s.fields) {
    return false;
  }
  for (size_t i = 0; i < F::kPlanes.size(); ++i) {
    if (F::kPlanes[i].bits != s.plane_bits[i] || F::kPlanes[i].shift != s.plane_shifts[i]) {
      return false;
    }
  }
  for (size_t i = 0; i < F::kFields.size(); ++i) {
    if (F::kFields[i] != s.field_bytes[i]) {
      return false;
    }
  }
  return true;
}

// A block format's kernels: `extern const FormatKernels kFormatQ8_0 = format_kernels<Q8_0, stated::kQ8_0>();`
template <typename F, const stated::Layout& kStated>
constexpr FormatKernels format_kernels() {
  static_assert(is_stated<F>(kStated), "this block format's traits (name, kWeights, kSub, kOffset, kPlanes, kFields) "
                                       "differ from its layout in ops/blocks/block_layouts.py: make the two agree");
  return kernels_of<F>();
}

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
