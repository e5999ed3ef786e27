// The out kernel of a running reduction along one dimension (aten::cumsum.out, aten::cumprod.out): the arguments
// checked, `out` resized, the input converted to the result's dtype and scanned in place, columns split over the pool.
// ATen's CPU kernels are the reference, bit for bit: the running value is kept in ATen's CPU accumulation type (double
// for float32 and float64, float for the half types, int64 wrapping for the integers) and rounded to the output's dtype
// at every step. An op gives its name and its step: `Step::identity` and `Step::apply(running, x)`.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>

#include "kernel_helpers/kernel_contract.h"

namespace custom {
namespace native {
namespace scan_along_dim {

template <typename T>
using Accumulated = std::conditional_t<std::is_integral_v<T>, int64_t,
                                       std::conditional_t<std::is_same_v<T, double> || std::is_same_v<T, float>,
                                                          double, float>>;

inline bool is_integral(ScalarType t) {
  return t == ScalarType::Byte || t == ScalarType::Char || t == ScalarType::Short || t == ScalarType::Int ||
      t == ScalarType::Long;
}

// SelfDtypes: the op's declared set (declared_dtypes::aten::<name>); out may be any real dtype, as ATen's.
template <typename SelfDtypes>
contract::Problem arguments_problem(const char* op, const Tensor& self, int64_t dim,
                                    std::optional<ScalarType> dtype, const Tensor& out) {
  if (auto p = contract::dtype_problem<SelfDtypes>(self, op, "self")) {
    return p;
  }
  // ATen's rule for the result's dtype: the one asked for, else int64 for integers, else the input's.
  const ScalarType result = dtype ? *dtype : is_integral(self.scalar_type()) ? ScalarType::Long : self.scalar_type();
  if (out.scalar_type() != result) {
    return std::string(op) + ": out has dtype " + contract::dtype_name(out.scalar_type()) + " but the result is " +
        contract::dtype_name(result) + (dtype ? " (the dtype argument)" : " (ATen's result dtype for this input)");
  }
  if (auto p = contract::dtype_problem<contract::RealDtypes>(out, op, "out")) {
    return p;
  }
  const int64_t dims = std::max<int64_t>(self.dim(), 1);
  if (dim < -dims || dim >= dims) {
    return std::string(op) + ": dim " + std::to_string(dim) + " is out of range for a tensor of " +
        std::to_string(self.dim()) + " dimension(s)";
  }
  if (auto p = contract::dense_problem(self, op, "self")) {
    return p;
  }
  return contract::dense_problem(out, op, "out");
}

// A value rounded to T. Half through the helpers' narrowing, which keeps a NaN's sign and top payload bits (quieted)
// as F16C and ATen's CPU kernels do, where c10's software conversion makes every NaN 0x7E00.
template <typename T, typename V>
T rounded(V value) {
  if constexpr (std::is_same_v<T, V>) {
    return value;  // a copy: a signaling NaN stays one, as ATen's .to() of the same dtype leaves it
  } else if constexpr (std::is_same_v<T, c10::Half>) {
    const float single = static_cast<float>(value);
    T half;
    elementwise::narrow(&single, &half, 1);
    return half;
  } else {
    return static_cast<T>(value);
  }
}

// The input converted to the output's dtype, element by element (ATen's self.to(result dtype)).
template <typename From, typename To>
void convert(const From* in, To* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    out[i] = rounded<To>(in[i]);
  }
}

constexpr int64_t kColumns = 64;

// out [outer, length, inner] (dense) holds the converted input; scanned in place along its middle dimension, a block
// of kColumns inner positions at a time so the running values stay in registers and the loop vectorizes.
template <typename Step, typename T>
void scan(T* out, int64_t length, int64_t inner, int64_t task_begin, int64_t task_end, int64_t blocks_per_row) {
  using Acc = Accumulated<T>;
  for (int64_t task = task_begin; task < task_end; ++task) {
    const int64_t o = task / blocks_per_row, first = (task % blocks_per_row) * kColumns;
    const int64_t columns = std::min(kColumns, inner - first);
    Acc running[kColumns];
    for (int64_t c = 0; c < columns; ++c) {
      running[c] = Step::template identity<Acc>();
    }
    T* row = out + o * length * inner + first;
    for (int64_t i = 0; i < length; ++i, row += inner) {
      for (int64_t c = 0; c < columns; ++c) {
        running[c] = Step::apply(running[c], static_cast<Acc>(row[c]));
        row[c] = rounded<T>(running[c]);
      }
    }
  }
}

template <typename SelfDtypes, typename Step>
Tensor& out_kernel(KernelContext& ctx, const char* op, const Tensor& self, int64_t dim,
                   std::optional<ScalarType> dtype, Tensor& out) {
  if (!contract::require(ctx, arguments_problem<SelfDtypes>(op, self, dim, dtype, out)) ||
      !contract::resize_output(ctx, out, self.sizes(), op, "out") ||
      !contract::check_memory(ctx, op, {{out, "out"}}, {{self, "self"}})) {
    return out;
  }
  SelfDtypes::visit(self.scalar_type(), [&](auto from) {
    contract::RealDtypes::visit(out.scalar_type(), [&](auto to) {
      convert(self.const_data_ptr<decltype(from)>(), out.mutable_data_ptr<decltype(to)>(), self.numel());
    });
  });
  if (self.dim() == 0 || self.numel() == 0) {
    return out;  // a 0-d tensor is its own running value; an empty one has none
  }
  const int64_t d = dim < 0 ? dim + self.dim() : dim;
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < d; ++i) {
    outer *= self.size(i);
  }
  for (int64_t i = d + 1; i < self.dim(); ++i) {
    inner *= self.size(i);
  }
  const int64_t length = self.size(d), blocks_per_row = (inner + kColumns - 1) / kColumns;
  contract::RealDtypes::visit(out.scalar_type(), [&](auto to) {
    using T = decltype(to);
    T* data = out.mutable_data_ptr<T>();
    // Tasks of whole columns: about 2^14 elements each.
    const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 14) / std::max<int64_t>(1, length * kColumns));
    if (!contract::parallel_for(0, outer * blocks_per_row, grain, [&](int64_t begin, int64_t end) {
          scan<Step>(data, length, inner, begin, end, blocks_per_row);
        })) {
      contract::require(ctx, std::string(op) + ": the thread pool did not run every range");
    }
  });
  return out;
}

} // namespace scan_along_dim
} // namespace native
} // namespace custom
