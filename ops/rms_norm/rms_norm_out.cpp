// The kernel of my_ops::rms_norm.out, compiled twice like mul4's: ExecuTorch mode into libcustom_ops_lib.so (the
// runtime kernel) and ATen mode into libcustom_ops_aot_lib.so (rms_norm.cpp's CPU kernel). Each row of the input:
// y = x / sqrt(mean(x^2) + eps) * weight, in one read for the sum of squares and one read-and-write pass, where the
// same math in ATen ops is five passes with four intermediates. Half types are accumulated and computed in float.
// On a CPU with AVX-512 the rows run in a variant compiled for it (the same sums in the same order: the same bits);
// bfloat16 rows there convert in registers.
#include <cmath>

#include "kernel_helpers/kernel_contract.h"
#include "kernel_helpers/row_wise.h"

#ifdef USE_ATEN_LIB
#include <ATen/ops/empty_like.h>
#endif

namespace custom {
namespace native {
namespace {

constexpr const char* kOp = "my_ops::rms_norm.out";
using Dtypes = contract::FloatingDtypes;

// Sum of squares of n floats: 16 independent partial sums, which the compiler vectorizes without reassociating (the
// same sums at every vector width, so every ISA gives the same bits).
__attribute__((always_inline)) inline void sum_of_squares(const float* x, int64_t n, float (&acc)[16]) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    for (int k = 0; k < 16; ++k) {
      acc[k] += x[i + k] * x[i + k];
    }
  }
  for (; i < n; ++i) {
    acc[i % 16] += x[i] * x[i];
  }
}

// kAvx512: inlined into rms_norm_rows_avx512, so the whole body is compiled for AVX-512.
template <typename T, bool kAvx512>
__attribute__((always_inline)) inline void rms_norm_rows_body(const T* in, const T* weight, T* out, int64_t first,
                                                              int64_t end, int64_t cols, float eps) {
  alignas(64) float x[rows::kBlock];
  alignas(64) float w[rows::kBlock];
  for (int64_t r = first; r < end; ++r) {
    const T* row = in + r * cols;
    T* out_row = out + r * cols;
    float acc[16] = {};
    for (int64_t c = 0; c < cols; c += rows::kBlock) {
      const int64_t n = std::min(rows::kBlock, cols - c);
      if constexpr (std::is_same_v<T, float>) {
        sum_of_squares(row + c, n, acc);
      } else {
        rows::load_floats<T, kAvx512>(row + c, x, n);
        sum_of_squares(x, n, acc);
      }
    }
    float sum = 0.0f;
    for (float a : acc) {
      sum += a;
    }
    const float inv_rms = 1.0f / std::sqrt(sum / static_cast<float>(cols) + eps);
    for (int64_t c = 0; c < cols; c += rows::kBlock) {
      const int64_t n = std::min(rows::kBlock, cols - c);
      if constexpr (std::is_same_v<T, float>) {
        for (int64_t i = 0; i < n; ++i) {
          out_row[c + i] = row[c + i] * inv_rms * weight[c + i];
        }
      } else {
        rows::load_floats<T, kAvx512>(row + c, x, n);
        rows::load_floats<T, kAvx512>(weight + c, w, n);
        for (int64_t i = 0; i < n; ++i) {
          x[i] = x[i] * inv_rms * w[i];
        }
        rows::store_floats<T, kAvx512>(x, out_row + c, n);
      }
    }
  }
}

template <typename T>
void rms_norm_rows(const T* in, const T* weight, T* out, int64_t first, int64_t end, int64_t cols, float eps) {
  rms_norm_rows_body<T, false>(in, weight, out, first, end, cols, eps);
}

#ifdef CUSTOM_OPS_X86_DISPATCH
CUSTOM_OPS_AVX512 inline __m512 widen_bfloat16_avx512(const c10::BFloat16* p) {
  const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(elementwise::bits_of(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

// bfloat16 rows with each vector widened and narrowed in registers instead of through a float block (the block's
// stores and loads cost more than the math here). The same operations in the same order as rms_norm_rows_body, so
// the same bits: lane k of the sum adds x[k]^2, x[k + 16]^2, ... (the tail too), the lanes are added in order, and
// each output is (x * inv_rms) * w rounded once to nearest even.
CUSTOM_OPS_AVX512 void rms_norm_rows_bfloat16_avx512(const c10::BFloat16* in, const c10::BFloat16* weight,
                                                     c10::BFloat16* out, int64_t first, int64_t end, int64_t cols,
                                                     float eps) {
  const int64_t whole = cols / 16 * 16;
  alignas(64) float x[16];
  alignas(64) float w[16];
  for (int64_t r = first; r < end; ++r) {
    const c10::BFloat16* row = in + r * cols;
    c10::BFloat16* out_row = out + r * cols;
    __m512 squares = _mm512_setzero_ps();
    for (int64_t c = 0; c < whole; c += 16) {
      const __m512 v = widen_bfloat16_avx512(row + c);
      squares = _mm512_add_ps(squares, _mm512_mul_ps(v, v));
    }
    alignas(64) float acc[16];
    _mm512_store_ps(acc, squares);
    if (whole < cols) {
      rows::load_floats<c10::BFloat16, true>(row + whole, x, cols - whole);
      for (int64_t i = 0; i < cols - whole; ++i) {
        acc[i] += x[i] * x[i];
      }
    }
    float sum = 0.0f;
    for (float a : acc) {
      sum += a;
    }
    const float inv_rms = 1.0f / std::sqrt(sum / static_cast<float>(cols) + eps);
    const __m512 scale = _mm512_set1_ps(inv_rms);
    for (int64_t c = 0; c < whole; c += 16) {
      const __m512 y = _mm512_mul_ps(_mm512_mul_ps(widen_bfloat16_avx512(row + c), scale),
                                     widen_bfloat16_avx512(weight + c));
      const __m512i rounded = elementwise::round_to_bfloat16_avx512(_mm512_castps_si512(y));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(elementwise::bits_of(out_row + c)),
                          _mm512_cvtepi32_epi16(rounded));
    }
    if (whole < cols) {
      const int64_t n = cols - whole;
      rows::load_floats<c10::BFloat16, true>(row + whole, x, n);
      rows::load_floats<c10::BFloat16, true>(weight + whole, w, n);
      for (int64_t i = 0; i < n; ++i) {
        x[i] = x[i] * inv_rms * w[i];
      }
      rows::store_floats<c10::BFloat16, true>(x, out_row + whole, n);
    }
  }
}

template <typename T>
CUSTOM_OPS_AVX512 void rms_norm_rows_avx512(const T* in, const T* weight, T* out, int64_t first, int64_t end,
                                            int64_t cols, float eps) {
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    rms_norm_rows_bfloat16_avx512(in, weight, out, first, end, cols, eps);
  } else {
    rms_norm_rows_body<T, true>(in, weight, out, first, end, cols, eps);
  }
}
#endif

template <typename T>
bool run(const Tensor& in, const Tensor& weight, Tensor& out, double eps) {
  const int64_t cols = in.dim() == 0 ? 1 : in.size(in.dim() - 1);
  const int64_t rows_count = cols == 0 ? 0 : in.numel() / cols;
  const T* x = in.template const_data_ptr<T>();
  const T* w = weight.template const_data_ptr<T>();
  T* y = out.template mutable_data_ptr<T>();
#ifdef CUSTOM_OPS_X86_DISPATCH
  const bool avx512 = elementwise::detected_isa() == elementwise::Isa::kAvx512;
#else
  const bool avx512 = false;
#endif
  return rows::for_each_row(rows_count, cols * static_cast<int64_t>(sizeof(T)), [&](int64_t first, int64_t end) {
#ifdef CUSTOM_OPS_X86_DISPATCH
    if (avx512) {
      rms_norm_rows_avx512<T>(x, w, y, first, end, cols, static_cast<float>(eps));
      elementwise::count(elementwise::kAvx512Elements, static_cast<uint64_t>((end - first) * cols));
      return;
    }
#endif
    rms_norm_rows<T>(x, w, y, first, end, cols, static_cast<float>(eps));
    elementwise::count(elementwise::kBaselineElements, static_cast<uint64_t>((end - first) * cols));
  });
}

// The weight scales the last dimension: shape [H], or with leading ones ([1, 1, H]).
inline bool weight_fits(const Tensor& in, const Tensor& weight) {
  return in.dim() >= 1 && weight.dim() >= 1 && weight.dim() <= in.dim() &&
      weight.size(weight.dim() - 1) == in.size(in.dim() - 1) && weight.numel() == in.size(in.dim() - 1);
}

// One body of checks for both modes: the arguments (before `out` is resized), then the memory the loop runs over.
contract::Problem arguments_problem(const Tensor& input, const Tensor& weight, const Tensor& out) {
  if (auto p = contract::dtype_problem<Dtypes>(input, kOp, "input")) {
    return p;
  }
  if (auto p = contract::same_dtype_problem(weight, input, kOp, "weight", "input")) {
    return p;
  }
  if (auto p = contract::same_dtype_problem(out, input, kOp, "out", "input")) {
    return p;
  }
  if (!weight_fits(input, weight)) {
    return std::string(kOp) + ": weight of shape " + contract::shape_text(weight) + " does not scale the last "
        "dimension of input of shape " + contract::shape_text(input) + "; give it shape [" +
        std::to_string(input.dim() ? input.size(input.dim() - 1) : 0) + "]";
  }
  return std::nullopt;
}

contract::Problem layout_problem(const Tensor& input, const Tensor& weight, const Tensor& out) {
  for (const auto& [t, name] : {std::pair<const Tensor&, const char*>{input, "input"}, {weight, "weight"}, {out, "out"}}) {
    if (auto p = contract::dense_problem(t, kOp, name)) {
      return p;
    }
  }
  return contract::memory_problem(kOp, {{out, "out"}}, {{input, "input", true}, {weight, "weight"}});
}

} // namespace

#ifdef USE_ATEN_LIB
at::Tensor& rms_norm_out_impl(const at::Tensor& input, const at::Tensor& weight, double eps, at::Tensor& out) {
  contract::require(arguments_problem(input, weight, out));
  contract::resize_output(out, input.sym_sizes(), kOp);
  contract::check_memory(kOp, {{out, "out"}}, {{input, "input", true}, {weight, "weight"}});
  // PyTorch's tensors may be strided: the loop runs on the dense tensors an export would hold, and a strided `out`
  // gets the result copied in.
  const at::Tensor x = input.contiguous();
  const at::Tensor w = weight.contiguous();
  at::Tensor y = out.is_contiguous() ? out : at::empty_like(x);
  contract::require(layout_problem(x, w, y));
  Dtypes::visit(x.scalar_type(), [&](auto tag) { run<decltype(tag)>(x, w, y, eps); });
  if (!y.is_same(out)) {
    out.copy_(y);
  }
  return out;
}
#else
executorch::aten::Tensor& rms_norm_out_impl(
    executorch::runtime::KernelRuntimeContext& ctx,
    const executorch::aten::Tensor& input,
    const executorch::aten::Tensor& weight,
    double eps,
    executorch::aten::Tensor& out) {
  if (!contract::require(ctx, arguments_problem(input, weight, out)) ||
      !contract::resize_output(ctx, out, input.sizes(), kOp, "out") ||
      !contract::require(ctx, layout_problem(input, weight, out))) {
    return out;
  }
  bool all_rows_ran = true;
  Dtypes::visit(input.scalar_type(), [&](auto tag) { all_rows_ran = run<decltype(tag)>(input, weight, out, eps); });
  ET_KERNEL_CHECK_MSG(ctx, all_rows_ran, Internal, out, "%s: the threadpool did not run all of the rows", kOp);
  return out;
}
#endif

} // namespace native
} // namespace custom
