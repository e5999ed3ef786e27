// The kernel of my_ops::quantize_rows.out (quantize_rows.py registers the op with PyTorch): per row of the last
// dimension, scale = max|x| / (2^(bits-1) - 1) and values = round_half_even(x / scale) as int8, two outputs of
// different dtypes and shapes. Bit for bit the ATen reference: the same float operations in the same order (Half and
// BFloat16 widen exactly to float first). ExecuTorch mode: the runtime kernel; ATen mode (-DUSE_ATEN_LIB): the CPU
// kernel quantize_rows_without_python.cpp registers for processes without Python (AOTInductor's C++ runner).
#include <atomic>
#include <cmath>

#include "declared_dtypes/my_ops/quantize_rows.h"
#include "kernel_helpers/kernel_contract.h"
#include "kernel_helpers/row_wise.h"

namespace custom {
namespace native {
namespace {

constexpr const char* kOp = "my_ops::quantize_rows.out";

// Returns false when the rows hold NaN or infinity (no quantized value exists).
template <typename T>
bool quantize_rows(const T* in, int8_t* values, float* scales, int64_t first, int64_t end, int64_t cols, int bits) {
  const float qmax = static_cast<float>((1 << (bits - 1)) - 1);
  alignas(64) float x[rows::kBlock];
  bool finite = true;
  for (int64_t r = first; r < end; ++r) {
    const T* row = in + r * cols;
    float amax = 0.0f;
    for (int64_t c = 0; c < cols; c += rows::kBlock) {
      const int64_t n = std::min(rows::kBlock, cols - c);
      rows::load_floats(row + c, x, n);
      for (int64_t i = 0; i < n; ++i) {
        finite &= std::isfinite(x[i]);
        amax = std::max(amax, std::fabs(x[i]));
      }
    }
    const float scale = amax / qmax;
    scales[r] = scale;
    const float divisor = scale > 0.0f ? scale : 1.0f;
    for (int64_t c = 0; c < cols; c += rows::kBlock) {
      const int64_t n = std::min(rows::kBlock, cols - c);
      rows::load_floats(row + c, x, n);
      for (int64_t i = 0; i < n; ++i) {
        const float q = std::nearbyint(x[i] / divisor);  // the default rounding mode: to nearest, ties to even
        values[r * cols + c + i] = static_cast<int8_t>(std::min(qmax, std::max(-qmax, q)));
      }
    }
  }
  return finite;
}

// Every row of the contiguous input, on the thread pool; returns whether all were finite.
bool quantize_all(const Tensor& input, Tensor& values, Tensor& scales, int bits, bool& all_rows_ran) {
  const int64_t cols = input.size(input.dim() - 1);
  const int64_t row_count = input.numel() / cols;
  std::atomic<bool> finite{true};
  declared_dtypes::my_ops::quantize_rows::visit(input.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    const T* x = input.const_data_ptr<T>();
    int8_t* v = values.mutable_data_ptr<int8_t>();
    float* s = scales.mutable_data_ptr<float>();
    all_rows_ran = rows::for_each_row(row_count, cols * static_cast<int64_t>(sizeof(T)), [&](int64_t first, int64_t end) {
      if (!quantize_rows(x, v, s, first, end, cols, bits)) {
        finite.store(false, std::memory_order_relaxed);
      }
    });
  });
  return finite.load();
}

// The arguments, before the outputs are resized (then outputs_problem): one body for both modes.
contract::Problem arguments_problem(const Tensor& input, int64_t bits, const Tensor& values, const Tensor& scales) {
  if (auto p = contract::dtype_problem<declared_dtypes::my_ops::quantize_rows>(input, kOp, "input")) {
    return p;
  }
  if (auto p = contract::dtype_problem<contract::DtypeSet<ScalarType::Char>>(values, kOp, "values")) {
    return p;
  }
  if (auto p = contract::dtype_problem<contract::DtypeSet<ScalarType::Float>>(scales, kOp, "scales")) {
    return p;
  }
  if (bits < 2 || bits > 8) {
    return std::string(kOp) + ": bits must be 2 to 8, got " + std::to_string(bits);
  }
  if (input.dim() < 1 || input.size(input.dim() - 1) == 0) {
    return std::string(kOp) + ": input needs a non-empty last dimension (the rows quantized), got shape " +
        contract::shape_text(input);
  }
  return contract::dense_problem(input, kOp, "input");
}

contract::Problem outputs_problem(const Tensor& input, const Tensor& values, const Tensor& scales) {
  if (auto p = contract::dense_problem(values, kOp, "values")) {
    return p;
  }
  if (auto p = contract::dense_problem(scales, kOp, "scales")) {
    return p;
  }
  return contract::memory_problem(kOp, {{values, "values"}, {scales, "scales"}}, {{input, "input"}});
}

} // namespace

#ifdef USE_ATEN_LIB
std::tuple<at::Tensor&, at::Tensor&> quantize_rows_out_impl(const at::Tensor& input, int64_t bits, at::Tensor& values,
                                                            at::Tensor& scales) {
  const at::Tensor x = input.contiguous();  // a strided view is read as the dense tensor an export would hold
  contract::require(arguments_problem(x, bits, values, scales));
  contract::resize_output(values, x.sym_sizes(), kOp);
  contract::resize_output(scales, x.sym_sizes().slice(0, x.dim() - 1), kOp);
  contract::check_memory(kOp, {{values, "values"}, {scales, "scales"}}, {{x, "input"}});  // PyTorch-only conditions
  contract::require(outputs_problem(x, values, scales));
  bool all_rows_ran = true;  // ATen's pool throws when it fails
  TORCH_CHECK(quantize_all(x, values, scales, static_cast<int>(bits), all_rows_ran), kOp,
              ": the input holds NaN or infinity, which has no quantized value");
  return {values, scales};
}
#else
std::tuple<executorch::aten::Tensor&, executorch::aten::Tensor&> quantize_rows_out_impl(
    executorch::runtime::KernelRuntimeContext& ctx,
    const executorch::aten::Tensor& input,
    int64_t bits,
    executorch::aten::Tensor& values,
    executorch::aten::Tensor& scales) {
  std::tuple<Tensor&, Tensor&> result{values, scales};
  if (!contract::require(ctx, arguments_problem(input, bits, values, scales))) {
    return result;
  }
  const auto sizes = input.sizes();
  if (!contract::resize_output(ctx, values, sizes, kOp, "values") ||
      !contract::resize_output(ctx, scales, {sizes.data(), sizes.size() - 1}, kOp, "scales") ||
      !contract::require(ctx, outputs_problem(input, values, scales))) {
    return result;
  }
  bool all_rows_ran = true;
  const bool finite = quantize_all(input, values, scales, static_cast<int>(bits), all_rows_ran);
  ET_KERNEL_CHECK_MSG(ctx, all_rows_ran, Internal, result, "%s: the threadpool did not run all of the rows", kOp);
  ET_KERNEL_CHECK_MSG(ctx, finite, InvalidArgument, result,
                      "%s: the input holds NaN or infinity, which has no quantized value", kOp);
  return result;
}
#endif

} // namespace native
} // namespace custom
