// Q4_1 (llama.cpp's block_q4_1): 32 weights, an fp16 d and m and 32 four-bit q; w = d * q + m. A format of
// my_ops::linear_blocks / embedding_blocks (kernel_helpers/block_formats.h).
#include "ops/blocks/formats.h"

namespace custom::native::blocks {
namespace {
struct Q4_1 : ScaleAndMin {
  static constexpr const char* kName = "Q4_1";
  static constexpr int kWeights = 32, kSub = 32, kOffset = 0;
  static constexpr bool kSubScales = false, kHasMin = true;
  static constexpr std::array<Plane, 1> kPlanes{{{4, 0}}};
  static constexpr std::array<int, 2> kFields{2, 2};  // d, m
};
}  // namespace

extern const FormatKernels kFormatQ4_1 = format_kernels<Q4_1, stated::kQ4_1>();

}  // namespace custom::native::blocks
