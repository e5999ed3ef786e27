// A format's kernels, one per ISA, as the op's out kernels find them by name (ops/blocks/formats.h): the portable loop
// (block_layout.h), the AVX2 tiles, the AVX-512 VNNI tiles and ARM64's dot-product tiles (sdot, or smmla with sdot),
// picked at run time.
#pragma once

#include "block_layout.h"
#include "block_tiles_avx2.h"
#include "block_tiles_avx512.h"
#include "block_tiles_dotprod.h"

namespace custom {
namespace native {
namespace blocks {

enum class Isa { kBaseline, kAvx2, kAvx512, kDotProd, kI8mm };
enum class Storage { kBytes, kFloat32, kFloat16, kBFloat16 };  // the weight tensor's dtype

using Units = void (*)(const Task&, int64_t first, int64_t end);
using Embed = void (*)(const uint8_t* weight, int64_t n, int64_t k, const int64_t* indices, int64_t count, float* out);

struct FormatKernels {
  const char* name;
  Storage storage;
  int64_t weights_per_block, block_bytes;  // a row of k weights: k / weights_per_block * block_bytes bytes
  bool quantizes_activations;              // per block of weights_per_block; row formats multiply in float
  bool avx512_needs_vnni;
  Units units[5];  // by Isa: units [first, end) of the weight (groups of 16 rows, or rows) against every token
  Embed embed;
};

template <class F>
void units_baseline(const Task& task, int64_t first, int64_t end) {
  groups_portable<F>(task, first, end);
}

#if defined(CUSTOM_OPS_X86_DISPATCH) && !defined(CUSTOM_OPS_BLOCKS_PORTABLE_ONLY)
template <class F>
CUSTOM_OPS_AVX2 void units_avx2(const Task& task, int64_t first, int64_t end) {
  in_token_runs<GroupTilesAvx2<F>, kMaxTokensAvx2>(task, first, end);
}

template <class F>
CUSTOM_OPS_AVX512_VNNI void units_avx512(const Task& task, int64_t first, int64_t end) {
  in_token_runs<GroupTiles<F>, max_tokens<F>()>(task, first, end);
}
#endif

#ifdef CUSTOM_OPS_BLOCKS_DOTPROD_DISPATCH
// Flattened: everything they call is inlined, compiled for their target (block_tiles_dotprod.h says why).
template <class F>
CUSTOM_OPS_DOTPROD __attribute__((flatten)) void units_dotprod(const Task& task, int64_t first, int64_t end) {
  in_token_runs<GroupTilesArm64<F, false>, 2>(task, first, end);
}

template <class F>
CUSTOM_OPS_I8MM __attribute__((flatten)) void units_i8mm(const Task& task, int64_t first, int64_t end) {
  in_token_runs<GroupTilesArm64<F, true>, 4>(task, first, end);
}
#endif

// An ISA's units of format F; the portable loop for an ISA this build has no tiles of (block_ops.h's isa_of picks
// only the ISAs this build and CPU have).
template <class F>
constexpr Units vector_units(Isa isa) {
#if defined(CUSTOM_OPS_X86_DISPATCH) && !defined(CUSTOM_OPS_BLOCKS_PORTABLE_ONLY)
  if (isa == Isa::kAvx2) {
    return units_avx2<F>;
  }
  if (isa == Isa::kAvx512) {
    return units_avx512<F>;
  }
#endif
#ifdef CUSTOM_OPS_BLOCKS_DOTPROD_DISPATCH
  if (isa == Isa::kDotProd) {
    return units_dotprod<F>;
  }
  if (isa == Isa::kI8mm) {
    return units_i8mm<F>;
  }
#endif
  return units_baseline<F>;
}

template <class F>
constexpr FormatKernels kernels_of() {
  return {F::kName, Storage::kBytes, F::kWeights, block_bytes<F>(), true, true,
          {units_baseline<F>, vector_units<F>(Isa::kAvx2), vector_units<F>(Isa::kAvx512),
           vector_units<F>(Isa::kDotProd), vector_units<F>(Isa::kI8mm)},
          embed_blocks<F>};
}

template <class E>
void rows_baseline(const Task& task, int64_t first, int64_t end) {
  rows_portable<E>(task, first, end);
}

#if defined(CUSTOM_OPS_X86_DISPATCH) && !defined(CUSTOM_OPS_BLOCKS_PORTABLE_ONLY)
template <class E>
CUSTOM_OPS_AVX2 void rows_avx2_units(const Task& task, int64_t first, int64_t end) {
  if (task.a->in_panels) {
    rows_in_panels_avx2<E>(task, first, end);
  } else {
    rows_avx2<E>(task, first, end);
  }
}

template <class E>
CUSTOM_OPS_AVX512_VNNI void rows_avx512_units(const Task& task, int64_t first, int64_t end) {
  if (task.a->in_panels) {
    rows_in_panels<E>(task, first, end);
  } else {
    in_token_runs<RowTiles<E>, 8>(task, first, end);
  }
}
#endif

// An ISA's units of row format E, as vector_units (ARM64 runs the portable rows).
template <class E>
constexpr Units vector_rows(Isa isa) {
#if defined(CUSTOM_OPS_X86_DISPATCH) && !defined(CUSTOM_OPS_BLOCKS_PORTABLE_ONLY)
  if (isa == Isa::kAvx2) {
    return rows_avx2_units<E>;
  }
  if (isa == Isa::kAvx512) {
    return rows_avx512_units<E>;
  }
#endif
  (void)isa;
  return rows_baseline<E>;
}

template <class E>
constexpr FormatKernels row_kernels_of(const char* name, Storage storage) {
  return {name, storage, 1, sizeof(E), false, false,
          {rows_baseline<E>, vector_rows<E>(Isa::kAvx2), vector_rows<E>(Isa::kAvx512), vector_rows<E>(Isa::kDotProd),
           vector_rows<E>(Isa::kI8mm)},
          embed_rows<E>};
}

}  // namespace blocks
}  // namespace native
}  // namespace custom
