// my_ops::rope for a process without Python (AOTInductor's C++ runner, runner/aoti_runner.cpp). PyTorch learns rope
// from Python (rope.py); a package that calls it finds it, at load time, in PyTorch's dispatcher, so a C++ process
// needs the schema and a CPU kernel from C++: the schemas the module defines, written into C++ at build time
// (codegen/python_op_schemas.py), and these kernels, the runtime's kernel compiled in ATen mode. Built into
// libcustom_ops_without_python.so, never loaded beside rope.py.
#include <ATen/core/Tensor.h>
#include <torch/library.h>

namespace custom {
namespace native {

// rope_out.cpp, ATen mode.
at::Tensor& rope_out_impl(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, at::Tensor& out);

namespace {

at::Tensor rope_cpu(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  at::Tensor out = x.new_empty({0});
  return rope_out_impl(x, cos, sin, out);
}

} // namespace

TORCH_LIBRARY_IMPL(my_ops, CPU, m) {
  m.impl("rope", TORCH_FN(rope_cpu));
  m.impl("rope.out", TORCH_FN(rope_out_impl));
}

} // namespace native
} // namespace custom
