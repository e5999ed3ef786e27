// my_ops::gelu_mul for a process without Python (AOTInductor's C++ runner, runner/aoti_runner.cpp). PyTorch learns
// gelu_mul from Python (gated.py); a package that calls it finds it, at load time, in PyTorch's dispatcher, so a C++
// process needs the schema and a CPU kernel from C++: these, with the runtime's kernel compiled in ATen mode. Built
// into libcustom_ops_without_python.so, never loaded beside gated.py.
#include <ATen/core/Tensor.h>
#include <torch/library.h>

namespace custom {
namespace native {

// gelu_mul_out.cpp, ATen mode.
at::Tensor& gelu_mul_out_impl(const at::Tensor& gate, const at::Tensor& up, at::Tensor& out);

namespace {

at::Tensor gelu_mul_cpu(const at::Tensor& gate, const at::Tensor& up) {
  at::Tensor out = gate.new_empty({0});
  return gelu_mul_out_impl(gate, up, out);
}

} // namespace

TORCH_LIBRARY_FRAGMENT(my_ops, m) {
  m.def("gelu_mul(Tensor gate, Tensor up) -> Tensor");
  m.def("gelu_mul.out(Tensor gate, Tensor up, *, Tensor(a!) out) -> Tensor(a!)",
        {at::Tag::out});
}

TORCH_LIBRARY_IMPL(my_ops, CPU, m) {
  m.impl("gelu_mul", TORCH_FN(gelu_mul_cpu));
  m.impl("gelu_mul.out", TORCH_FN(gelu_mul_out_impl));
}

} // namespace native
} // namespace custom
