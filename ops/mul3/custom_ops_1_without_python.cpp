// my_ops::mul3 for a process without Python (AOTInductor's C++ runner, runner/aoti_runner.cpp). PyTorch learns mul3
// from Python (custom_ops_1.py); a package that calls it finds it, at load time, in PyTorch's dispatcher, so a C++
// process needs the schema and a CPU kernel from C++: the schemas the module defines, written into C++ at build time
// (codegen/python_op_schemas.py), and these kernels, the runtime's kernel compiled in ATen mode. Built into
// libcustom_ops_without_python.so, never loaded beside custom_ops_1.py (PyTorch refuses a second definition).
#include <torch/library.h>

#include "kernel_helpers/unary_elementwise.h"

namespace custom {
namespace native {

at::Tensor& mul3_out_impl(const at::Tensor& input, at::Tensor& output);  // custom_ops_1_out.cpp, ATen mode

TORCH_LIBRARY_IMPL(my_ops, CPU, m) {
  m.impl("mul3", TORCH_FN(unary_elementwise_functional<mul3_out_impl>));
  m.impl("mul3.out", TORCH_FN(mul3_out_impl));
}

} // namespace native
} // namespace custom
