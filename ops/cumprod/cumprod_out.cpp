// The runtime kernel of aten::cumprod.out, an ATen op that ExecuTorch's kernel libraries lack (a scan along one
// dimension): custom_ops.yaml binds it (`- op: aten::cumprod.out`), codegen registers it. PyTorch ships the op, so ATen's
// own kernel is the reference, bit for bit: like it, the input is first converted to the output's dtype, and the
// running product is kept in ATen's CPU accumulation type (double for float32 and float64, float for the half types,
// int64 wrapping for the integers) and rounded to the output's dtype at every step.
#include <cstdint>
#include <optional>
#include <type_traits>

#include "kernel_helpers/kernel_contract.h"

namespace custom {
namespace native {
namespace {

constexpr const char* kOp = "aten::cumprod.out";

template <typename T>
using Accumulated = std::conditional_t<std::is_integral_v<T>, int64_t,
                                       std::conditional_t<std::is_same_v<T, double> || std::is_same_v<T, float>,
                                                          double, float>>;

bool is_integral(ScalarType t) {
  return t == ScalarType::Byte || t == ScalarType::Char || t == ScalarType::Short || t == ScalarType::Int ||
      t == ScalarType::Long;
}

contract::Problem arguments_problem(const Tensor& self, int64_t dim, std::optional<ScalarType> dtype, const Tensor& out) {
  if (auto p = contract::dtype_problem<contract::RealDtypes>(self, kOp, "self")) {
    return p;
  }
  // ATen's rule for the result's dtype: the one asked for, else int64 for integers, else the input's.
  const ScalarType result = dtype ? *dtype : is_integral(self.scalar_type()) ? ScalarType::Long : self.scalar_type();
  if (out.scalar_type() != result) {
    return std::string(kOp) + ": out has dtype " + contract::dtype_name(out.scalar_type()) + " but the result is " +
        contract::dtype_name(result) + (dtype ? " (the dtype argument)" : " (ATen's result dtype for this input)");
  }
  if (auto p = contract::dtype_problem<contract::RealDtypes>(out, kOp, "out")) {
    return p;
  }
  const int64_t dims = std::max<int64_t>(self.dim(), 1);
  if (dim < -dims || dim >= dims) {
    return std::string(kOp) + ": dim " + std::to_string(dim) + " is out of range for a tensor of " +
        std::to_string(self.dim()) + " dimension(s)";
  }
  if (auto p = contract::dense_problem(self, kOp, "self")) {
    return p;
  }
  return contract::dense_problem(out, kOp, "out");
}

// The running product times the next element. Integers wrap, as ATen's int64 product does (two's complement),
// without signed overflow. Floats keep the running product's NaN once it is one: when both operands are NaN an x86
// multiply returns its first operand's, and the compiler may order a product's operands either way; ATen's
// `product *= x` keeps the product's (its sign and payload are part of the bits compared).
inline int64_t times(int64_t product, int64_t x) {
  return static_cast<int64_t>(static_cast<uint64_t>(product) * static_cast<uint64_t>(x));
}
template <typename F>
inline F times(F product, F x) {
  return product != product ? product : product * x;
}

// The input converted to the output's dtype, element by element (ATen's self.to(result dtype)).
template <typename From, typename To>
void convert(const From* in, To* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    out[i] = static_cast<To>(in[i]);
  }
}

// out [outer, length, inner] (dense) holds the converted input; scanned in place along its middle dimension, a block
// of kColumns inner positions at a time so the running products stay in registers and the loop vectorizes.
template <typename T>
void scan(T* out, int64_t length, int64_t inner, int64_t task_begin, int64_t task_end, int64_t blocks_per_row) {
  using Acc = Accumulated<T>;
  constexpr int64_t kColumns = 64;
  for (int64_t task = task_begin; task < task_end; ++task) {
    const int64_t o = task / blocks_per_row, first = (task % blocks_per_row) * kColumns;
    const int64_t columns = std::min(kColumns, inner - first);
    Acc product[kColumns];
    for (int64_t c = 0; c < columns; ++c) {
      product[c] = 1;
    }
    T* row = out + o * length * inner + first;
    for (int64_t i = 0; i < length; ++i, row += inner) {
      for (int64_t c = 0; c < columns; ++c) {
        product[c] = times(product[c], static_cast<Acc>(row[c]));
        row[c] = static_cast<T>(product[c]);
      }
    }
  }
}

} // namespace

executorch::aten::Tensor& cumprod_out_impl(
    executorch::runtime::KernelRuntimeContext& ctx,
    const executorch::aten::Tensor& self,
    int64_t dim,
    std::optional<executorch::aten::ScalarType> dtype,
    executorch::aten::Tensor& out) {
  if (!contract::require(ctx, arguments_problem(self, dim, dtype, out)) ||
      !contract::resize_output(ctx, out, self.sizes(), kOp, "out") ||
      !contract::check_memory(ctx, kOp, {{out, "out"}}, {{self, "self"}})) {
    return out;
  }
  contract::RealDtypes::visit(self.scalar_type(), [&](auto from) {
    contract::RealDtypes::visit(out.scalar_type(), [&](auto to) {
      convert(self.const_data_ptr<decltype(from)>(), out.mutable_data_ptr<decltype(to)>(), self.numel());
    });
  });
  if (self.dim() == 0 || self.numel() == 0) {
    return out;  // a 0-d tensor is its own product; an empty one has none
  }
  const int64_t d = dim < 0 ? dim + self.dim() : dim;
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < d; ++i) {
    outer *= self.size(i);
  }
  for (int64_t i = d + 1; i < self.dim(); ++i) {
    inner *= self.size(i);
  }
  const int64_t length = self.size(d), blocks_per_row = (inner + 63) / 64;
  contract::RealDtypes::visit(out.scalar_type(), [&](auto to) {
    using T = decltype(to);
    T* data = out.mutable_data_ptr<T>();
    // Tasks of whole columns: about 2^14 elements each.
    const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 14) / std::max<int64_t>(1, length * 64));
    if (!contract::parallel_for(0, outer * blocks_per_row, grain, [&](int64_t begin, int64_t end) {
          scan(data, length, inner, begin, end, blocks_per_row);
        })) {
      contract::require(ctx, std::string(kOp) + ": the thread pool did not run every range");
    }
  });
  return out;
}

} // namespace native
} // namespace custom
