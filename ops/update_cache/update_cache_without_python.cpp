// my_ops::update_cache for a process without Python (AOTInductor's C++ runner, runner/aoti_runner.cpp). PyTorch learns
// update_cache from Python (update_cache.py); a package that calls it finds it, at load time, in PyTorch's dispatcher,
// so a C++ process needs the schema and a CPU kernel from C++: the schemas the module defines, written into C++ at
// build time (codegen/python_op_schemas.py), and these kernels, the runtime's kernel compiled in ATen mode. Built into
// libcustom_ops_without_python.so, never loaded beside update_cache.py.
#include <ATen/core/Tensor.h>
#include <torch/library.h>

namespace custom {
namespace native {

// update_cache_out.cpp, ATen mode.
at::Tensor& update_cache_out_impl(const at::Tensor& value, at::Tensor& cache, int64_t start_pos, at::Tensor& out);

namespace {

// The functional form mutates the cache too (its schema says Tensor(a!) cache); only the position is new.
at::Tensor update_cache_cpu(const at::Tensor& value, at::Tensor& cache, int64_t start_pos) {
  at::Tensor next_position = value.new_empty({1}, at::kLong);
  return update_cache_out_impl(value, cache, start_pos, next_position);
}

} // namespace

TORCH_LIBRARY_IMPL(my_ops, CPU, m) {
  m.impl("update_cache", TORCH_FN(update_cache_cpu));
  m.impl("update_cache.out", TORCH_FN(update_cache_out_impl));
}

} // namespace native
} // namespace custom
