// my_ops::quantize_rows for a process without Python (AOTInductor's C++ runner, runner/aoti_runner.cpp). PyTorch learns
// quantize_rows from Python (quantize_rows.py, torch.library.custom_op); a package that calls it finds it, at load
// time, in PyTorch's dispatcher, so a C++ process needs the schema and a CPU kernel from C++: the schemas the module
// defines, written into C++ at build time (codegen/python_op_schemas.py), and these kernels, the runtime's kernel
// compiled in ATen mode. Built into libcustom_ops_without_python.so, never loaded beside quantize_rows.py.
#include <ATen/core/Tensor.h>
#include <torch/library.h>

namespace custom {
namespace native {

// quantize_rows_out.cpp, ATen mode.
std::tuple<at::Tensor&, at::Tensor&> quantize_rows_out_impl(const at::Tensor& input, int64_t bits, at::Tensor& values,
                                                            at::Tensor& scales);

namespace {

std::tuple<at::Tensor, at::Tensor> quantize_rows_cpu(const at::Tensor& input, int64_t bits) {
  at::Tensor values = input.new_empty({0}, at::kChar);
  at::Tensor scales = input.new_empty({0}, at::kFloat);
  quantize_rows_out_impl(input, bits, values, scales);
  return {values, scales};
}

} // namespace

TORCH_LIBRARY_IMPL(my_ops, CPU, m) {
  m.impl("quantize_rows", TORCH_FN(quantize_rows_cpu));
  m.impl("quantize_rows.out", TORCH_FN(quantize_rows_out_impl));
}

} // namespace native
} // namespace custom
