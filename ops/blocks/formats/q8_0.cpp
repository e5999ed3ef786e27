// Q8_0 (llama.cpp's block_q8_0): 32 weights, an fp16 d and 32 int8 q; w = d * q. The codes are stored as q + 128
// (unsigned, for vpdpbusd). A format of my_ops::linear_blocks / embedding_blocks (kernel_helpers/block_formats.h).
#include "ops/blocks/formats.h"

namespace custom::native::blocks {
namespace {
struct Q8_0 : ScaleOnly {
  static constexpr const char* kName = "Q8_0";
  static constexpr int kWeights = 32, kSub = 32, kOffset = 128;
  static constexpr bool kSubScales = false, kHasMin = false;
  static constexpr std::array<Plane, 1> kPlanes{{{8, 0}}};
  static constexpr std::array<int, 1> kFields{2};  // d
};
}  // namespace

extern const FormatKernels kFormatQ8_0 = format_kernels<Q8_0, stated::kQ8_0>();

}  // namespace custom::native::blocks
