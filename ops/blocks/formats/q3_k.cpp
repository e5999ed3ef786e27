// Q3_K (llama.cpp's block_q3_K): super-blocks of 256 weights in 16 sub-blocks of 16, each with a 6-bit scale stored
// + 32 (12 bytes: the low nibbles of scales 0-7 and 8-15 in bytes 0-7, their top two bits in bytes 8-11), an fp16 d,
// 2-bit q and a high bit each: w = d * (scale - 32) * (q + 4 * high - 4). A format of my_ops::linear_blocks /
// embedding_blocks (kernel_helpers/block_formats.h).
#include "ops/blocks/formats.h"

namespace custom::native::blocks {
namespace {
struct Q3_K : ScaleOnly {
  static constexpr const char* kName = "Q3_K";
  static constexpr int kWeights = 256, kSub = 16, kOffset = 4;
  static constexpr bool kSubScales = true, kHasMin = false;
  static constexpr std::array<Plane, 2> kPlanes{{{2, 0}, {1, 2}}};
  static constexpr std::array<int, 4> kFields{4, 4, 4, 2};  // 12 scale bytes, d

  template <class W>
  CUSTOM_OPS_INLINE static void sub(const W* w, int s, W& scale, W&) {
    const W low = (w[(s % 8) / 4] >> (8 * (s % 4) + 4 * (s / 8))) & 15;
    const W high = (w[2] >> (8 * (s % 4) + 2 * (s / 4))) & 3;
    scale = (low | (high << 4)) - 32;
  }
};
}  // namespace

extern const FormatKernels kFormatQ3_K = format_kernels<Q3_K, stated::kQ3_K>();

}  // namespace custom::native::blocks
