// Q2_K (llama.cpp's block_q2_K): super-blocks of 256 weights in 16 sub-blocks of 16, each with a 4-bit scale and a
// 4-bit min (one byte: scale low, min high), an fp16 d and dmin, 2-bit q; w = d * scale * q - dmin * min. A format
// of my_ops::linear_blocks / embedding_blocks (kernel_helpers/block_formats.h).
#include "ops/blocks/formats.h"

namespace custom::native::blocks {
namespace {
struct Q2_K : ScaleAndNegatedMin {
  static constexpr const char* kName = "Q2_K";
  static constexpr int kWeights = 256, kSub = 16, kOffset = 0;
  static constexpr bool kSubScales = true, kHasMin = true;
  static constexpr std::array<Plane, 1> kPlanes{{{2, 0}}};
  static constexpr std::array<int, 6> kFields{4, 4, 4, 4, 2, 2};  // 16 scale bytes, d, dmin

  // Byte s of the 16: the sub-scale in its low nibble, the sub-min in its high one.
  template <class W>
  CUSTOM_OPS_INLINE static void sub(const W* w, int s, W& scale, W& min) {
    const W byte = w[s / 4] >> (8 * (s % 4));
    scale = byte & 15;
    min = (byte >> 4) & 15;
  }
};
}  // namespace

extern const FormatKernels kFormatQ2_K = format_kernels<Q2_K, stated::kQ2_K>();

}  // namespace custom::native::blocks
