// Step 1 of the sdpa_with_cache flow: registers my_ops::sdpa_with_cache(Tensor query, Tensor key_cache,
// Tensor value_cache, SymInt start_pos, float? scale=None, int window=0) -> Tensor with PyTorch from C++ (window > 0:
// each query sees only the last `window` positions up to its own, a sliding window), with a kernel per dispatch
// key: CPU (sdpa_with_cache_out.cpp's kernel, the one the runtime runs), Meta (shapes and the kernel's checks, for
// torch.export's fake tensors, start_pos possibly unbacked) and Autograd (a refusal: an inference op has no gradient).
// sdpa_with_cache.out's schema and CPU kernel come from codegen (custom_ops.yaml); sdpa_with_cache.py holds the ATen
// reference and the example model.
#include <ATen/core/Tensor.h>
#include <ATen/core/LegacyTypeDispatch.h>  // AutoDispatchBelowADInplaceOrView
#include <ATen/core/grad_mode.h>
#include <c10/core/SymBool.h>
#include <torch/library.h>

#include "declared_dtypes/my_ops/sdpa_with_cache.h"
#include "kernel_helpers/kernel_contract.h"

namespace custom {
namespace native {

// Defined in sdpa_with_cache_out.cpp (ATen mode).
at::Tensor& sdpa_with_cache_out_impl(const at::Tensor& query, const at::Tensor& key_cache,
                                     const at::Tensor& value_cache, int64_t start_pos, std::optional<double> scale,
                                     int64_t window, at::Tensor& out);

namespace {

constexpr const char* kOpName = "my_ops::sdpa_with_cache";

// What the Meta kernel can check on symbolic shapes: the same conditions as the kernel's (which runs them on real
// ones and words them the same way), with start_pos and the lengths possibly symbolic (checked as the program's
// torch._check calls promise).
void check_symbolic(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, const c10::SymInt& start,
                    int64_t window, const char* op) {
  contract::check_dtype<declared_dtypes::my_ops::sdpa_with_cache>(query, op, "query");
  contract::check_same_dtype(key, query, op, "key_cache", "query");
  contract::check_same_dtype(value, query, op, "value_cache", "query");
  TORCH_CHECK(query.dim() == 4 && key.dim() == 4, op, ": query ", query.sym_sizes(),
              " must be [batch, length, heads, head_dim] and key_cache ", key.sym_sizes(),
              " [batch, positions, kv_heads, head_dim], 4 dimensions each");
  TORCH_CHECK(value.sym_sizes() == key.sym_sizes(), op, ": value_cache ", value.sym_sizes(),
              " must have key_cache's shape ", key.sym_sizes());
  TORCH_SYM_CHECK(key.sym_size(0).sym_eq(query.sym_size(0)), op, ": key_cache ", key.sym_sizes(), " holds batch ",
                  key.sym_size(0), " but query ", query.sym_sizes(), " has batch ", query.sym_size(0));
  TORCH_SYM_CHECK(key.sym_size(3).sym_eq(query.sym_size(3)), op, ": query ", query.sym_sizes(), " has head_dim ",
                  query.sym_size(3), " but key_cache ", key.sym_sizes(), " has ", key.sym_size(3),
                  "; they must be equal and at least 1");
  TORCH_SYM_CHECK(query.sym_size(3).sym_ge(1), op, ": query ", query.sym_sizes(), " has head_dim ", query.sym_size(3),
                  " but key_cache ", key.sym_sizes(), " has ", key.sym_size(3), "; they must be equal and at least 1");
  TORCH_CHECK(key.sym_size(2) != 0 && query.sym_size(2) % key.sym_size(2) == 0, op, ": query's ", query.sym_size(2),
              " heads are not a multiple of the cache's ", key.sym_size(2),
              " kv heads; each kv head serves heads / kv_heads query heads");
  TORCH_SYM_CHECK(start.sym_ge(0), op, ": start_pos ", start, " is negative; start_pos + length must be within [0, ",
                  "positions]");
  TORCH_SYM_CHECK((start + query.sym_size(1)).sym_le(key.sym_size(1)), op, ": ", query.sym_size(1),
                  " queries at start_pos ", start, " need cache positions up to ", start + query.sym_size(1),
                  " but the cache holds ", key.sym_size(1), "; start_pos + length must be within [0, positions]");
  TORCH_CHECK(window >= 0, op, ": window ", window, " is negative; pass the sliding window's length in positions, ",
              "or 0 to attend to every earlier position");
}

at::Tensor sdpa_with_cache_cpu(const at::Tensor& query, const at::Tensor& key_cache, const at::Tensor& value_cache,
                               int64_t start_pos, std::optional<double> scale, int64_t window) {
  at::Tensor out = query.new_empty(query.sizes());  // contiguous, whatever the query's layout
  return contract::reported_as_functional([&]() -> at::Tensor {
    return sdpa_with_cache_out_impl(query, key_cache, value_cache, start_pos, scale, window, out);
  });
}

at::Tensor sdpa_with_cache_meta(const at::Tensor& query, const at::Tensor& key_cache, const at::Tensor& value_cache,
                                c10::SymInt start_pos, std::optional<double> /*scale*/, int64_t window) {
  check_symbolic(query, key_cache, value_cache, start_pos, window, kOpName);
  return query.new_empty_symint(query.sym_sizes());  // contiguous
}

at::Tensor& sdpa_with_cache_out_meta(const at::Tensor& query, const at::Tensor& key_cache,
                                     const at::Tensor& value_cache, c10::SymInt start_pos,
                                     std::optional<double> /*scale*/, int64_t window, at::Tensor& out) {
  check_symbolic(query, key_cache, value_cache, start_pos, window, "my_ops::sdpa_with_cache.out");
  contract::check_same_dtype(out, query, "my_ops::sdpa_with_cache.out", "out", "query");
  contract::resize_output(out, query.sym_sizes(), "my_ops::sdpa_with_cache.out");
  return out;
}

// Inference only: a gradient would need the softmax's statistics kept per query, which this kernel never stores.
at::Tensor sdpa_with_cache_autograd(const at::Tensor& query, const at::Tensor& key_cache,
                                    const at::Tensor& value_cache, c10::SymInt start_pos,
                                    std::optional<double> scale, int64_t window) {
  for (const auto& [tensor, name] : {std::pair<const at::Tensor&, const char*>{query, "query"},
                                     {key_cache, "key_cache"}, {value_cache, "value_cache"}}) {
    TORCH_CHECK(!(at::GradMode::is_enabled() && tensor.requires_grad()), kOpName, ": ", name, " requires grad, but this op is for inference and has ",
                "no gradient; call it under torch.no_grad() (or torch.inference_mode()), or train with ",
                "torch.nn.functional.scaled_dot_product_attention");
  }
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("my_ops::sdpa_with_cache", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, c10::SymInt,
                                               std::optional<double>, int64_t)>();
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return op.call(query, key_cache, value_cache, start_pos, scale, window);
}

} // namespace

TORCH_LIBRARY_FRAGMENT(my_ops, m) {
  m.def("sdpa_with_cache(Tensor query, Tensor key_cache, Tensor value_cache, SymInt start_pos, float? scale=None, "
        "int window=0) -> Tensor");
}

TORCH_LIBRARY_IMPL(my_ops, CPU, m) {
  m.impl("sdpa_with_cache", TORCH_FN(sdpa_with_cache_cpu));
}

TORCH_LIBRARY_IMPL(my_ops, Meta, m) {
  m.impl("sdpa_with_cache", TORCH_FN(sdpa_with_cache_meta));
  m.impl("sdpa_with_cache.out", TORCH_FN(sdpa_with_cache_out_meta));
}

TORCH_LIBRARY_IMPL(my_ops, Autograd, m) {
  m.impl("sdpa_with_cache", TORCH_FN(sdpa_with_cache_autograd));
}

} // namespace native
} // namespace custom
