// The C++ registration of a gated activation for a process without Python (AOTInductor's C++ runner,
// runner/aoti_runner.cpp): PyTorch learns the op from Python (gated.py); a package that calls it finds it, at load
// time, in PyTorch's dispatcher, so a C++ process needs the schemas gated.py defines (written into C++ at build time,
// codegen/python_op_schemas.py) and a CPU kernel from C++: the runtime's kernel compiled in ATen mode (NAME_out.cpp).
// Each member's NAME_without_python.cpp registers its kernels in a line.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/library.h>

#define CUSTOM_OPS_GATED_WITHOUT_PYTHON(NAME)                                                      \
  namespace custom::native {                                                                       \
  at::Tensor& NAME##_out_impl(const at::Tensor& gate, const at::Tensor& up, at::Tensor& out);     \
  namespace {                                                                                      \
  at::Tensor NAME##_cpu(const at::Tensor& gate, const at::Tensor& up) {                            \
    at::Tensor out = gate.new_empty({0});                                                          \
    return NAME##_out_impl(gate, up, out);                                                         \
  }                                                                                                \
  }                                                                                                \
  TORCH_LIBRARY_IMPL(my_ops, CPU, m) {                                                             \
    m.impl(#NAME, TORCH_FN(NAME##_cpu));                                                           \
    m.impl(#NAME ".out", TORCH_FN(NAME##_out_impl));                                               \
  }                                                                                                \
  }
