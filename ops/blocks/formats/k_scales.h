// The 6-bit scales and mins of Q4_K and Q5_K's eight sub-blocks of 32 (llama.cpp's get_scale_min_k4), packed in 12
// bytes as three words: sub-block s < 4 has its scale in bits 0-5 of byte s and its min in byte s + 4; s >= 4 has the
// low four bits of each in byte s + 4 (scale low, min high) and the top two in bits 6-7 of bytes s - 4 and s.
#pragma once

#include "kernel_helpers/block_formats.h"

namespace custom {
namespace native {
namespace blocks {

// Q4_K and Q5_K's super-block: 256 weights in 8 sub-blocks of 32; its record d, dmin, then the 12 bytes of packed
// scales and mins; w = d * scale * q - dmin * min.
struct KScales : ScaleAndNegatedMin {
  static constexpr int kWeights = 256, kSub = 32, kOffset = 0;
  static constexpr bool kSubScales = true, kHasMin = true;
  static constexpr std::array<int, 5> kFields{2, 2, 4, 4, 4};  // d, dmin, 12 scale bytes

  // Sub-block s's six-bit scale and min from the three words.
  template <class W>
  CUSTOM_OPS_INLINE static void sub(const W* w, int s, W& scale, W& min) {
    if (s < 4) {
      scale = (w[0] >> (8 * s)) & 63;
      min = (w[1] >> (8 * s)) & 63;
    } else {
      const int byte = 8 * (s - 4);
      scale = ((w[2] >> byte) & 15) | (((w[0] >> (byte + 6)) & 3) << 4);
      min = ((w[2] >> (byte + 4)) & 15) | (((w[1] >> (byte + 6)) & 3) << 4);
    }
  }
};

}  // namespace blocks
}  // namespace native
}  // namespace custom
