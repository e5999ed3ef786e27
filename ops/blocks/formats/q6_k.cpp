// Q6_K (llama.cpp's block_q6_K): super-blocks of 256 weights in 16 sub-blocks of 16, each with an int8 scale, an
// fp16 d, 6-bit q (four low bits and two high ones, a plane each); w = d * scale * (q - 32). A format of
// my_ops::linear_blocks / embedding_blocks (kernel_helpers/block_formats.h).
#include "ops/blocks/formats.h"

namespace custom::native::blocks {
namespace {
struct Q6_K : ScaleOnly {
  static constexpr const char* kName = "Q6_K";
  static constexpr int kWeights = 256, kSub = 16, kOffset = 32;
  static constexpr bool kSubScales = true, kHasMin = false;
  static constexpr std::array<Plane, 2> kPlanes{{{4, 0}, {2, 4}}};
  static constexpr std::array<int, 5> kFields{4, 4, 4, 4, 2};  // 16 int8 scales, d

  template <class W>
  CUSTOM_OPS_INLINE static void sub(const W* w, int s, W& scale, W&) {
    scale = as_unsigned(signed_byte(w[s / 4], s % 4));
  }
};
}  // namespace

extern const FormatKernels kFormatQ6_K = format_kernels<Q6_K, stated::kQ6_K>();

}  // namespace custom::native::blocks
