// The kernel of my_ops::silu_mul.out (silu_mul.py registers the op with PyTorch): out = gate / (1 + exp(-gate)) * up
// element by element, in float (16-bit types widened, and rounded once at the end), 16 lanes at a time (AVX-512 where
// the CPU has it). exp is a polynomial of its own, within 2 ulp of the C library's: the op is declared close to its
// ATen reference, not equal to it (ATen's silu has its own exp).
#include <cstring>

#include "kernel_helpers/kernel_contract.h"
#include "kernel_helpers/row_wise.h"

namespace custom {
namespace native {
namespace {

constexpr const char* kOp = "my_ops::silu_mul.out";
using Dtypes = contract::FloatingDtypes;

// 16 floats in a GCC vector: one body that the compiler lowers to one AVX-512 register, or to four SSE ones on the
// baseline ISA (the same operations in the same order: the same bits). Scalar code would not vectorize: its clamps
// are branches under -ftrapping-math.
// The helpers below are always inlined, so no call passes a vector: GCC's warning about the ABI of such calls is moot.
#pragma GCC diagnostic ignored "-Wpsabi"
using Floats = float __attribute__((vector_size(64)));
using Ints = int32_t __attribute__((vector_size(64)));
constexpr int64_t kLanes = 16;

__attribute__((always_inline)) inline Floats splat(float v) {
  return Floats{} + v;
}

__attribute__((always_inline)) inline Floats clamp(Floats x, float lo, float hi) {
  x = x < splat(lo) ? splat(lo) : x;
  return x > splat(hi) ? splat(hi) : x;
}

// exp(x) as 2^n * p(r), x = n ln2 + r, |r| <= ln2/2, p Cephes' degree-7 polynomial, within 2 ulp of the C library's.
// NaN goes in as 0 (silu's numerator keeps it NaN), past +-104 is clamped, and n is clamped to [-127, 128], whose
// powers of two are 0 and infinity: exp's underflow and overflow.
__attribute__((always_inline)) inline Floats exp_lanes(Floats x) {
  x = clamp(x == x ? x : Floats{}, -104.0f, 104.0f);
  // Adding and taking away 1.5 * 2^23 rounds to the nearest integer (|x log2 e| < 2^22) with plain vector adds.
  const Floats n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const Floats r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
  Floats p = splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  const Ints exponent = __builtin_convertvector(clamp(n, -127.0f, 128.0f), Ints) + 127;
  return p * reinterpret_cast<const Floats&>(static_cast<const Ints&>(exponent << 23));
}

// n <= kBlock floats of each, in place in gate; whole vectors (the blocks' lanes past n are computed and not stored).
__attribute__((always_inline)) inline void silu_times_block(float* gate, const float* up, int64_t n) {
  for (int64_t k = 0; k < n; k += kLanes) {
    Floats g, u;
    std::memcpy(&g, gate + k, sizeof(g));
    std::memcpy(&u, up + k, sizeof(u));
    g = g / (1.0f + exp_lanes(-g)) * u;
    std::memcpy(gate + k, &g, sizeof(g));
  }
}

template <typename T, bool kAvx512>
__attribute__((always_inline)) inline void silu_mul_range_body(const T* gate, const T* up, T* out, int64_t first,
                                                               int64_t end) {
  alignas(64) float g[rows::kBlock] = {};
  alignas(64) float u[rows::kBlock] = {};
  for (int64_t i = first; i < end; i += rows::kBlock) {
    const int64_t n = std::min(rows::kBlock, end - i);
    rows::load_floats<T, kAvx512>(gate + i, g, n);
    rows::load_floats<T, kAvx512>(up + i, u, n);
    silu_times_block(g, u, n);
    rows::store_floats<T, kAvx512>(g, out + i, n);
  }
}

template <typename T>
void silu_mul_range(const T* gate, const T* up, T* out, int64_t first, int64_t end) {
  silu_mul_range_body<T, false>(gate, up, out, first, end);
}

#ifdef CUSTOM_OPS_X86_DISPATCH
template <typename T>
CUSTOM_OPS_AVX512 void silu_mul_range_avx512(const T* gate, const T* up, T* out, int64_t first, int64_t end) {
  silu_mul_range_body<T, true>(gate, up, out, first, end);
}
#endif

template <typename T>
bool run(const Tensor& gate, const Tensor& up, Tensor& out) {
  const int64_t count = gate.numel();
  const T* g = gate.template const_data_ptr<T>();
  const T* u = up.template const_data_ptr<T>();
  T* o = out.template mutable_data_ptr<T>();
#ifdef CUSTOM_OPS_X86_DISPATCH
  const bool avx512 = elementwise::detected_isa() == elementwise::Isa::kAvx512;
#endif
  // Rows of one block: the pool's grain in bytes decides when a second thread is worth waking.
  const int64_t blocks = (count + rows::kBlock - 1) / rows::kBlock;
  return rows::for_each_row(blocks, rows::kBlock * 3 * static_cast<int64_t>(sizeof(T)), [&](int64_t first, int64_t end) {
    const int64_t begin = first * rows::kBlock, stop = std::min(count, end * rows::kBlock);
#ifdef CUSTOM_OPS_X86_DISPATCH
    if (avx512) {
      silu_mul_range_avx512<T>(g, u, o, begin, stop);
      elementwise::count(elementwise::kAvx512Elements, static_cast<uint64_t>(stop - begin));
      return;
    }
#endif
    silu_mul_range<T>(g, u, o, begin, stop);
    elementwise::count(elementwise::kBaselineElements, static_cast<uint64_t>(stop - begin));
  });
}

// The arguments, before `out` is resized: silu_mul.py's _check, in its order and words.
contract::Problem arguments_problem(const Tensor& gate, const Tensor& up, const Tensor& out) {
  if (auto p = contract::dtype_problem<Dtypes>(gate, kOp, "gate")) {
    return p;
  }
  if (auto p = contract::same_dtype_problem(up, gate, kOp, "up", "gate")) {
    return p;
  }
  if (auto p = contract::same_dtype_problem(out, gate, kOp, "out", "gate")) {
    return p;
  }
  if (!contract::same_sizes(gate, up)) {
    return std::string(kOp) + ": gate of shape " + contract::shape_text(gate) + " and up of shape " +
        contract::shape_text(up) + " differ; give both the same shape";
  }
  return std::nullopt;
}

contract::Problem layout_problem(const Tensor& gate, const Tensor& up, const Tensor& out) {
  for (const auto& [t, name] : {std::pair<const Tensor&, const char*>{gate, "gate"}, {up, "up"}, {out, "out"}}) {
    if (auto p = contract::dense_problem(t, kOp, name)) {
      return p;
    }
  }
  // Element i reads only element i: out may be either input exactly.
  return contract::memory_problem(kOp, {{out, "out"}}, {{gate, "gate", true}, {up, "up", true}});
}

} // namespace

executorch::aten::Tensor& silu_mul_out_impl(executorch::runtime::KernelRuntimeContext& ctx,
                                            const executorch::aten::Tensor& gate, const executorch::aten::Tensor& up,
                                            executorch::aten::Tensor& out) {
  if (!contract::require(ctx, arguments_problem(gate, up, out)) ||
      !contract::resize_output(ctx, out, gate.sizes(), kOp, "out") ||
      !contract::require(ctx, layout_problem(gate, up, out))) {
    return out;
  }
  bool all_ran = true;
  Dtypes::visit(gate.scalar_type(), [&](auto tag) { all_ran = run<decltype(tag)>(gate, up, out); });
  ET_KERNEL_CHECK_MSG(ctx, all_ran, Internal, out, "%s: the threadpool did not run all of the elements", kOp);
  return out;
}

} // namespace native
} // namespace custom
