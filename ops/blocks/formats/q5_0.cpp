// Q5_0 (llama.cpp's block_q5_0): 32 weights, an fp16 d, their fifth bits and 32 nibbles; w = d * (q - 16). The
// fifth bits are a plane of their own (one chunk: bit i of byte j is weight 4i + j). A format of
// my_ops::linear_blocks / embedding_blocks (kernel_helpers/block_formats.h).
#include "ops/blocks/formats.h"

namespace custom::native::blocks {
namespace {
struct Q5_0 : ScaleOnly {
  static constexpr const char* kName = "Q5_0";
  static constexpr int kWeights = 32, kSub = 32, kOffset = 16;
  static constexpr bool kSubScales = false, kHasMin = false;
  static constexpr std::array<Plane, 2> kPlanes{{{4, 0}, {1, 4}}};
  static constexpr std::array<int, 1> kFields{2};  // d
};
}  // namespace

extern const FormatKernels kFormatQ5_0 = format_kernels<Q5_0, stated::kQ5_0>();

}  // namespace custom::native::blocks
