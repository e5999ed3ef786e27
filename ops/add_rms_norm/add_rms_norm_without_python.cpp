// my_ops::add_rms_norm for a process without Python (AOTInductor's C++ runner, runner/aoti_runner.cpp). PyTorch learns
// add_rms_norm from Python (add_rms_norm.py); a package that calls it finds it, at load time, in PyTorch's dispatcher,
// so a C++ process needs the schema and a CPU kernel from C++: the schemas the module defines, written into C++ at
// build time (codegen/python_op_schemas.py), and these kernels, the runtime's kernel compiled in ATen mode. Built into
// libcustom_ops_without_python.so, never loaded beside add_rms_norm.py.
#include <ATen/core/Tensor.h>
#include <torch/library.h>

namespace custom {
namespace native {

// add_rms_norm_out.cpp, ATen mode.
std::tuple<at::Tensor&, at::Tensor&> add_rms_norm_out_impl(const at::Tensor& x, const at::Tensor& residual,
                                                           const at::Tensor& weight, double eps, at::Tensor& sum,
                                                           at::Tensor& normed);

namespace {

std::tuple<at::Tensor, at::Tensor> add_rms_norm_cpu(const at::Tensor& x, const at::Tensor& residual,
                                                    const at::Tensor& weight, double eps) {
  at::Tensor sum = x.new_empty({0});
  at::Tensor normed = x.new_empty({0});
  add_rms_norm_out_impl(x, residual, weight, eps, sum, normed);
  return {sum, normed};
}

} // namespace

TORCH_LIBRARY_IMPL(my_ops, CPU, m) {
  m.impl("add_rms_norm", TORCH_FN(add_rms_norm_cpu));
  m.impl("add_rms_norm.out", TORCH_FN(add_rms_norm_out_impl));
}

} // namespace native
} // namespace custom
