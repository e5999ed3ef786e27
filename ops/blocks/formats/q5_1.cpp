// Q5_1 (llama.cpp's block_q5_1): 32 weights, an fp16 d and m, their fifth bits and 32 nibbles; w = d * q + m. A
// format of my_ops::linear_blocks / embedding_blocks (kernel_helpers/block_formats.h).
#include "ops/blocks/formats.h"

namespace custom::native::blocks {
namespace {
struct Q5_1 : ScaleAndMin {
  static constexpr const char* kName = "Q5_1";
  static constexpr int kWeights = 32, kSub = 32, kOffset = 0;
  static constexpr bool kSubScales = false, kHasMin = true;
  static constexpr std::array<Plane, 2> kPlanes{{{4, 0}, {1, 4}}};
  static constexpr std::array<int, 2> kFields{2, 2};  // d, m
};
}  // namespace

extern const FormatKernels kFormatQ5_1 = format_kernels<Q5_1, stated::kQ5_1>();

}  // namespace custom::native::blocks
