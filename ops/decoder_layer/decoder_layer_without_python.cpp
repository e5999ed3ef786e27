// my_ops::decoder_layer for a process without Python (AOTInductor's C++ runner, runner/aoti_runner.cpp). PyTorch learns
// the op from Python (decoder_layer.py); a package that calls it finds it, at load time, in PyTorch's dispatcher, so a
// C++ process needs the schema and a CPU kernel from C++: the schemas the module defines, written into C++ at build
// time (codegen/python_op_schemas.py), and these kernels, the runtime's kernel compiled in ATen mode. Built into
// libcustom_ops_without_python.so, never loaded beside decoder_layer.py.
#include <ATen/core/Tensor.h>
#include <torch/library.h>

namespace custom {
namespace native {

// decoder_layer_out.cpp, ATen mode.
at::Tensor& decoder_layer_out_impl(const at::Tensor& hidden, const at::Tensor& input_norm,
                                   const at::Tensor& qkv_weight, c10::string_view qkv_format, const at::Tensor& cos,
                                   const at::Tensor& sin, at::Tensor& key_cache, at::Tensor& value_cache,
                                   int64_t start_pos, std::optional<double> scale, const at::Tensor& o_weight,
                                   c10::string_view o_format, const at::Tensor& post_norm,
                                   const at::Tensor& gate_up_weight, c10::string_view gate_up_format,
                                   const at::Tensor& down_weight, c10::string_view down_format, double eps,
                                   const std::optional<at::Tensor>& v_weight, std::optional<c10::string_view> v_format,
                                   at::Tensor& out);

namespace {

// The functional form writes the caches too (its schema says Tensor(a!) and Tensor(b!)); only the output is new.
at::Tensor decoder_layer_cpu(const at::Tensor& hidden, const at::Tensor& input_norm, const at::Tensor& qkv_weight,
                             c10::string_view qkv_format, const at::Tensor& cos, const at::Tensor& sin,
                             at::Tensor& key_cache, at::Tensor& value_cache, int64_t start_pos,
                             std::optional<double> scale, const at::Tensor& o_weight, c10::string_view o_format,
                             const at::Tensor& post_norm, const at::Tensor& gate_up_weight,
                             c10::string_view gate_up_format, const at::Tensor& down_weight,
                             c10::string_view down_format, double eps, const std::optional<at::Tensor>& v_weight,
                             std::optional<c10::string_view> v_format) {
  at::Tensor out = hidden.new_empty({0});
  return decoder_layer_out_impl(hidden, input_norm, qkv_weight, qkv_format, cos, sin, key_cache, value_cache,
                                start_pos, scale, o_weight, o_format, post_norm, gate_up_weight, gate_up_format,
                                down_weight, down_format, eps, v_weight, v_format, out);
}

} // namespace

TORCH_LIBRARY_IMPL(my_ops, CPU, m) {
  m.impl("decoder_layer", TORCH_FN(decoder_layer_cpu));
  m.impl("decoder_layer.out", TORCH_FN(decoder_layer_out_impl));
}

} // namespace native
} // namespace custom
