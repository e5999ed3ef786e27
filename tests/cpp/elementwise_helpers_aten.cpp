// The PyTorch-side kernels kernel_helpers/elementwise.h makes for an op with several broadcast inputs
// (elementwise_functional, elementwise_meta, elementwise_out_meta), and the unary helpers given a dtype set, run
// against ATen on CPU and Meta tensors.
// tests/test_kernel_contract.py runs it (built with -DCUSTOM_OPS_BUILD_CHECKS=ON); exit 0 and "ok" when every check
// holds, else one line per failed check.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randn.h>
#include <ATen/TensorOperators.h>  // the expected values: a + alpha * b, x / 2

#include <cstdio>
#include <string>

#include "kernel_helpers/unary_elementwise.h"

namespace {

using custom::native::contract::FloatingDtypes;

struct Halve {
  template <typename T>
  static T apply(T x) {
    return x / T(2);
  }
};

struct ScaledAdd {
  double alpha;
  template <typename T>
  T apply(T x, T y) const {
    return x + static_cast<T>(alpha) * y;
  }
};

at::Tensor& scaled_add_out(const at::Tensor& input, const at::Tensor& other, double alpha, at::Tensor& out) {
  return custom::native::elementwise_out<FloatingDtypes>("my_ops::scaled_add.out", ScaledAdd{alpha}, {out, "out"},
                                                         {{input, "input"}, {other, "other"}});
}

int failures = 0;

void expect(bool ok, const std::string& what) {
  if (!ok) {
    std::printf("FAILED: %s\n", what.c_str());
    ++failures;
  }
}

// The message of what `call` throws, or "" when it does not throw.
template <typename Call>
std::string thrown(Call call) {
  try {
    call();
  } catch (const c10::Error& err) {
    return err.msg();
  }
  return "";
}

} // namespace

int main() {
  auto functional = custom::native::elementwise_functional<scaled_add_out, const at::Tensor&, double>;
  const double alpha = 0.1;
  const std::pair<std::vector<int64_t>, std::vector<int64_t>> shapes[] = {
      {{3, 40}, {40}}, {{2, 1, 5}, {4, 1}}, {{1}, {2, 3}}, {{4, 1, 3}, {1, 6, 1}}};
  for (const auto& [a_shape, b_shape] : shapes) {
    const at::Tensor a = at::randn(a_shape), b = at::randn(b_shape);
    const at::Tensor expected = a + alpha * b;  // ATen rounds the product, then the sum: so does the functor
    const at::Tensor actual = functional(a, b, alpha);
    expect(actual.sizes() == expected.sizes() && at::equal(actual, expected),
           "functional equals ATen for " + std::string(c10::str(a_shape, " and ", b_shape)));
    const at::Tensor meta = custom::native::elementwise_meta<FloatingDtypes>(
        "my_ops::scaled_add", {{a.to(at::kMeta), "input"}, {b.to(at::kMeta), "other"}});
    expect(meta.is_meta() && meta.sizes() == expected.sizes() && meta.scalar_type() == at::kFloat,
           "meta has the broadcast shape for " + std::string(c10::str(a_shape, " and ", b_shape)));
    at::Tensor out = at::empty({0}, at::TensorOptions().device(at::kMeta));
    custom::native::elementwise_out_meta<FloatingDtypes>("my_ops::scaled_add.out", {out, "out"},
                                                         {{a.to(at::kMeta), "input"}, {b.to(at::kMeta), "other"}});
    expect(out.sizes() == expected.sizes(), "out meta resizes to the broadcast shape");
  }
  const at::Tensor ints = at::ones({2, 3}, at::kInt).to(at::kMeta), floats = at::ones({2, 3}).to(at::kMeta);
  const std::string wrong_dtype = thrown([&] {
    custom::native::elementwise_meta<FloatingDtypes>("my_ops::scaled_add", {{ints, "input"}, {ints, "other"}});
  });
  expect(wrong_dtype.find("my_ops::scaled_add: input has unsupported dtype int32") != std::string::npos,
         "a dtype outside the set is refused in the out kernel's words: " + wrong_dtype);
  const std::string mixed = thrown([&] {
    custom::native::elementwise_meta<FloatingDtypes>("my_ops::scaled_add",
                                                     {{floats, "input"}, {floats.to(at::kHalf), "other"}});
  });
  expect(mixed.find("other has dtype float16 but input has float32") != std::string::npos,
         "mixed dtypes are refused: " + mixed);
  const std::string no_broadcast = thrown([&] {
    custom::native::elementwise_meta<FloatingDtypes>(
        "my_ops::scaled_add", {{floats, "input"}, {at::ones({4}).to(at::kMeta), "other"}});
  });
  expect(no_broadcast.find("my_ops::scaled_add: the inputs' shapes do not broadcast together") != std::string::npos,
         "shapes that do not broadcast are refused: " + no_broadcast);
  // A float-only unary op: the helpers refuse what its set lacks, in the same words, and run what it has.
  const std::string unary_meta = thrown([&] {
    custom::native::unary_elementwise_meta<FloatingDtypes>(ints, "my_ops::halve");
  });
  expect(unary_meta.find("my_ops::halve: input has unsupported dtype int32; supported: float32, float16, bfloat16") !=
             std::string::npos, "the unary Meta helper refuses by the op's set: " + unary_meta);
  at::Tensor int_out = at::empty({2, 3}, at::kInt);
  const std::string unary_out = thrown([&] {
    custom::native::unary_elementwise_out<Halve, FloatingDtypes>(at::ones({2, 3}, at::kInt), int_out, "my_ops::halve.out");
  });
  expect(unary_out.find("my_ops::halve.out: input has unsupported dtype int32") != std::string::npos,
         "the unary out helper refuses by the op's set: " + unary_out);
  const at::Tensor x = at::randn({5, 7}).to(at::kBFloat16);
  at::Tensor halved = at::empty({0}, at::kBFloat16);
  custom::native::unary_elementwise_out<Halve, FloatingDtypes>(x, halved, "my_ops::halve.out");
  expect(at::equal(halved, x / 2), "the unary out helper computes a dtype of its set");
  if (failures == 0) {
    std::printf("ok\n");
  }
  return failures == 0 ? 0 : 1;
}
