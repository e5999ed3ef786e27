// Q5_K (llama.cpp's block_q5_K): Q4_K's super-block (k_scales.h) with a fifth bit per weight; w = d * scale * q -
// dmin * min, q of 5 bits. A format of my_ops::linear_blocks / embedding_blocks (kernel_helpers/block_formats.h).
#include "ops/blocks/formats.h"
#include "ops/blocks/formats/k_scales.h"

namespace custom::native::blocks {
namespace {
struct Q5_K : KScales {
  static constexpr const char* kName = "Q5_K";
  static constexpr std::array<Plane, 2> kPlanes{{{4, 0}, {1, 4}}};
};
}  // namespace

extern const FormatKernels kFormatQ5_K = format_kernels<Q5_K, stated::kQ5_K>();

}  // namespace custom::native::blocks
