// Q5_K (llama.cpp's block_q5_K): Q4_K's super-block (k_scales.h) with a fifth bit per weight; w = d * scale * q -
// dmin * min, q of 5 bits. A format of my_ops::linear_blocks / embedding_blocks (kernel_helpers/block_formats.h).
#include "ops/blocks/formats.h"
#include "ops/blocks/formats/k_scales.h"

namespace custom {
namespace native {
namespace blocks {
namespace {
struct Q5_K {
  static constexpr const char* kName = "Q5_K";
  static constexpr int kWeights = 256, kSub = 32, kOffset = 0;
  static constexpr bool kSubScales = true, kHasMin = true;
  static constexpr std::array<Plane, 2> kPlanes{{{4, 0}, {1, 4}}};
  static constexpr std::array<int, 5> kFields{2, 2, 4, 4, 4};  // d, dmin, 12 scale bytes

  template <class R>
  CUSTOM_OPS_BLOCKS_INLINE static void block(const R* h, R& scale, R& min) {
    scale = h[0];
    min = -h[1];
  }

  template <class W>
  CUSTOM_OPS_BLOCKS_INLINE static void sub(const W* w, int s, W& scale, W& min) {
    k_scales(w, s, scale, min);
  }
};
}  // namespace

extern const FormatKernels kFormatQ5_K = kernels_of<Q5_K>();

}  // namespace blocks
}  // namespace native
}  // namespace custom
