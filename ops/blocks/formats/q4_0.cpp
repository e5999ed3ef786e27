// Q4_0 (llama.cpp's block_q4_0): 32 weights, an fp16 d and 32 four-bit q; w = d * (q - 8). A format of
// my_ops::linear_blocks / embedding_blocks (kernel_helpers/block_formats.h).
#include "ops/blocks/formats.h"

namespace custom::native::blocks {
namespace {
struct Q4_0 : ScaleOnly {
  static constexpr const char* kName = "Q4_0";
  static constexpr int kWeights = 32, kSub = 32, kOffset = 8;
  static constexpr bool kSubScales = false, kHasMin = false;
  static constexpr std::array<Plane, 1> kPlanes{{{4, 0}}};
  static constexpr std::array<int, 1> kFields{2};  // d
};
}  // namespace

extern const FormatKernels kFormatQ4_0 = format_kernels<Q4_0, stated::kQ4_0>();

}  // namespace custom::native::blocks
