// my_ops::silu_mul for a process without Python (AOTInductor's C++ runner, runner/aoti_runner.cpp). PyTorch learns
// silu_mul from Python (gated.py); a package that calls it finds it, at load time, in PyTorch's dispatcher, so a C++
// process needs the schema and a CPU kernel from C++: these, with the runtime's kernel compiled in ATen mode. Built
// into libcustom_ops_without_python.so, never loaded beside gated.py.
#include <ATen/core/Tensor.h>
#include <torch/library.h>

namespace custom {
namespace native {

// silu_mul_out.cpp, ATen mode.
at::Tensor& silu_mul_out_impl(const at::Tensor& gate, const at::Tensor& up, at::Tensor& out);

namespace {

at::Tensor silu_mul_cpu(const at::Tensor& gate, const at::Tensor& up) {
  at::Tensor out = gate.new_empty({0});
  return silu_mul_out_impl(gate, up, out);
}

} // namespace

TORCH_LIBRARY_FRAGMENT(my_ops, m) {
  m.def("silu_mul(Tensor gate, Tensor up) -> Tensor");
  m.def("silu_mul.out(Tensor gate, Tensor up, *, Tensor(a!) out) -> Tensor(a!)",
        {at::Tag::out});
}

TORCH_LIBRARY_IMPL(my_ops, CPU, m) {
  m.impl("silu_mul", TORCH_FN(silu_mul_cpu));
  m.impl("silu_mul.out", TORCH_FN(silu_mul_out_impl));
}

} // namespace native
} // namespace custom
