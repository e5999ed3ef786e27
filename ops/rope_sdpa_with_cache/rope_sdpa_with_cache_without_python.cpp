// my_ops::rope_sdpa_with_cache for a process without Python (AOTInductor's C++ runner, runner/aoti_runner.cpp). PyTorch
// learns the op from Python (rope_sdpa_with_cache.py); a package that calls it finds it, at load time, in PyTorch's
// dispatcher, so a C++ process needs the schema and a CPU kernel from C++: the schemas the module defines, written into
// C++ at build time (codegen/python_op_schemas.py), and these kernels, the runtime's kernel compiled in ATen mode.
// Built into libcustom_ops_without_python.so, never loaded beside rope_sdpa_with_cache.py.
#include <ATen/core/Tensor.h>
#include <torch/library.h>

namespace custom {
namespace native {

// rope_sdpa_with_cache_out.cpp, ATen mode.
at::Tensor& rope_sdpa_with_cache_out_impl(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin,
                                          at::Tensor& key_cache, at::Tensor& value_cache, int64_t start_pos,
                                          std::optional<double> scale, int64_t window, at::Tensor& out);

namespace {

// The functional form writes the caches too (its schema says Tensor(a!) and Tensor(b!)); only the attention is new.
at::Tensor rope_sdpa_with_cache_cpu(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin,
                                    at::Tensor& key_cache, at::Tensor& value_cache, int64_t start_pos,
                                    std::optional<double> scale, int64_t window) {
  at::Tensor out = qkv.new_empty({0});
  return rope_sdpa_with_cache_out_impl(qkv, cos, sin, key_cache, value_cache, start_pos, scale, window, out);
}

} // namespace

TORCH_LIBRARY_IMPL(my_ops, CPU, m) {
  m.impl("rope_sdpa_with_cache", TORCH_FN(rope_sdpa_with_cache_cpu));
  m.impl("rope_sdpa_with_cache.out", TORCH_FN(rope_sdpa_with_cache_out_impl));
}

} // namespace native
} // namespace custom
