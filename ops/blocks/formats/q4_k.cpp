// Q4_K (llama.cpp's block_q4_K): super-blocks of 256 weights in 8 sub-blocks of 32, each with a 6-bit scale and min
// (k_scales.h), an fp16 d and dmin, 4-bit q; w = d * scale * q - dmin * min. A format of my_ops::linear_blocks /
// embedding_blocks (kernel_helpers/block_formats.h).
#include "ops/blocks/formats.h"
#include "ops/blocks/formats/k_scales.h"

namespace custom::native::blocks {
namespace {
struct Q4_K : KScales {
  static constexpr const char* kName = "Q4_K";
  static constexpr std::array<Plane, 1> kPlanes{{{4, 0}}};
};
}  // namespace

extern const FormatKernels kFormatQ4_K = format_kernels<Q4_K, stated::kQ4_K>();

}  // namespace custom::native::blocks
