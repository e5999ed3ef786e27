// The PyTorch side of my_ops::linear_blocks and embedding_blocks, shared by their registration sources
// (linear_blocks.cpp, embedding_blocks.cpp: one CUSTOM_OPS_BLOCKS_REGISTRATION each): the CPU kernel (the out kernel,
// block_ops.h, on a new output), the Meta kernels (the same checks on shapes, possibly symbolic, for torch.export's
// fake tensors) and an Autograd kernel that refuses a gradient by name: these ops are for inference, their weights
// are packed integers.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/LegacyTypeDispatch.h>  // AutoDispatchBelowADInplaceOrView
#include <ATen/core/grad_mode.h>
#include <torch/library.h>

#include "declared_dtypes/my_ops/linear_blocks.h"
#include "ops/blocks/block_ops.h"

namespace custom {
namespace native {
namespace blocks {

inline void refuse_gradients(const char* op, std::initializer_list<std::pair<const at::Tensor*, const char*>> tensors) {
  for (const auto& [tensor, name] : tensors) {
    TORCH_CHECK(!(at::GradMode::is_enabled() && tensor->requires_grad()), op, ": ", name, " requires grad, but this ",
                "op is for inference and has no gradient; call it under torch.no_grad() (or torch.inference_mode())");
  }
}

using OutImpl = at::Tensor& (*)(const at::Tensor&, const at::Tensor&, c10::string_view, at::Tensor&);

// The op called kName (both ops take two tensors and a format) run below autograd: its Autograd kernel's second half,
// once the gradients are refused.
template <const char* kName>
at::Tensor below_autograd(const at::Tensor& first, const at::Tensor& second, c10::string_view format) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow(kName, "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&, c10::string_view)>();
  at::AutoDispatchBelowADInplaceOrView below;
  return op.call(first, second, format);
}

// input [..., k] x weight (n rows, `format`) -> [..., n]. kName: the op's qualified name; Out: its out kernel.
template <const char* kName, OutImpl Out>
struct LinearOp {
  static constexpr const char* name = kName;

  static const FormatKernels& check(const at::Tensor& input, const at::Tensor& weight, c10::string_view format,
                                    const char* op) {
    const FormatKernels& f = require_format(format, op);
    contract::check_dtype<declared_dtypes::my_ops::linear_blocks>(input, op, "input");
    contract::require(weight_problem(weight, f, op));
    TORCH_CHECK(input.dim() >= 1, op, ": input ", input.sym_sizes(), " must end in the layer's ", inputs_of(weight, f),
                " inputs (weight ", weight.sizes(), ", ", f.name, ")");
    TORCH_SYM_CHECK(input.sym_size(-1).sym_eq(inputs_of(weight, f)), op, ": input ", input.sym_sizes(),
                    " must end in the layer's ", inputs_of(weight, f), " inputs (weight ", weight.sizes(), ", ", f.name,
                    ")");
    return f;
  }

  static std::vector<c10::SymInt> sizes(const at::Tensor& input, const at::Tensor& weight) {
    std::vector<c10::SymInt> sizes(input.sym_sizes().begin(), input.sym_sizes().end() - 1);
    sizes.emplace_back(weight.size(0));
    return sizes;
  }

  static at::Tensor cpu(const at::Tensor& input, const at::Tensor& weight, c10::string_view format) {
    check(input, weight, format, kName);
    at::Tensor out = input.new_empty({0});
    return Out(input, weight, format, out);
  }

  static at::Tensor meta(const at::Tensor& input, const at::Tensor& weight, c10::string_view format) {
    check(input, weight, format, kName);
    return input.new_empty_symint(sizes(input, weight));
  }

  static at::Tensor& out_meta(const at::Tensor& input, const at::Tensor& weight, c10::string_view format,
                              at::Tensor& out) {
    const std::string op = std::string(kName) + ".out";
    check(input, weight, format, op.c_str());
    contract::check_same_dtype(out, input, op.c_str(), "out", "input");
    contract::resize_output(out, sizes(input, weight), op.c_str());
    return out;
  }

  static at::Tensor autograd(const at::Tensor& input, const at::Tensor& weight, c10::string_view format) {
    refuse_gradients(kName, {{&input, "input"}, {&weight, "weight"}});
    return below_autograd<kName>(input, weight, format);
  }
};

// weight (a table of rows, `format`) x indices [...] -> [..., k] float32.
template <const char* kName, OutImpl Out>
struct EmbeddingOp {
  static constexpr const char* name = kName;

  static const FormatKernels& check(const at::Tensor& weight, const at::Tensor& indices, c10::string_view format,
                                    const char* op) {
    const FormatKernels& f = require_format(format, op);
    contract::require(weight_problem(weight, f, op));
    TORCH_CHECK(indices.scalar_type() == at::kLong, op, ": indices have dtype ",
                contract::dtype_name(indices.scalar_type()), "; they must be int64");
    return f;
  }

  static std::vector<c10::SymInt> sizes(const at::Tensor& weight, const at::Tensor& indices, const FormatKernels& f) {
    std::vector<c10::SymInt> sizes(indices.sym_sizes().begin(), indices.sym_sizes().end());
    sizes.emplace_back(inputs_of(weight, f));
    return sizes;
  }

  static at::Tensor cpu(const at::Tensor& weight, const at::Tensor& indices, c10::string_view format) {
    check(weight, indices, format, kName);
    at::Tensor out = indices.new_empty({0}, at::kFloat);
    return Out(weight, indices, format, out);
  }

  static at::Tensor meta(const at::Tensor& weight, const at::Tensor& indices, c10::string_view format) {
    const FormatKernels& f = check(weight, indices, format, kName);
    return indices.new_empty_symint(sizes(weight, indices, f), at::kFloat);
  }

  static at::Tensor& out_meta(const at::Tensor& weight, const at::Tensor& indices, c10::string_view format,
                              at::Tensor& out) {
    const std::string op = std::string(kName) + ".out";
    const FormatKernels& f = check(weight, indices, format, op.c_str());
    TORCH_CHECK(out.scalar_type() == at::kFloat, op, ": out has dtype ", contract::dtype_name(out.scalar_type()),
                "; it must be float32");
    contract::resize_output(out, sizes(weight, indices, f), op.c_str());
    return out;
  }

  static at::Tensor autograd(const at::Tensor& weight, const at::Tensor& indices, c10::string_view format) {
    refuse_gradients(kName, {{&weight, "weight"}});  // a row format's table may be float; indices are integers
    return below_autograd<kName>(weight, indices, format);
  }
};

// Defines the op of Op (a LinearOp or EmbeddingOp) in the registration source's TORCH_LIBRARY_FRAGMENT: its functional
// `schema`, and each kernel by its dispatch key: CPU, Meta for both forms (codegen defines the out form) and Autograd.
template <typename Op>
void define_op(torch::Library& m, const char* schema) {
  const std::string out = std::string(Op::name) + ".out";
  m.def(schema);
  m.impl(Op::name, torch::dispatch(c10::DispatchKey::CPU, TORCH_FN(Op::cpu)));
  m.impl(Op::name, torch::dispatch(c10::DispatchKey::Meta, TORCH_FN(Op::meta)));
  m.impl(out.c_str(), torch::dispatch(c10::DispatchKey::Meta, TORCH_FN(Op::out_meta)));
  m.impl(Op::name, torch::dispatch(c10::DispatchKey::Autograd, TORCH_FN(Op::autograd)));
}

}  // namespace blocks
}  // namespace native
}  // namespace custom

// Registers my_ops::NAME with PyTorch from its registration source, at global scope: define_op with OP (LinearOp or
// EmbeddingOp) over NAME_out_impl, the op's out kernel (NAME_out.cpp, ATen mode), and the functional SCHEMA.
#define CUSTOM_OPS_BLOCKS_REGISTRATION(NAME, OP, SCHEMA)                                                           \
  namespace custom::native {                                                                                      \
  at::Tensor& NAME##_out_impl(const at::Tensor&, const at::Tensor&, c10::string_view, at::Tensor&);               \
  namespace {                                                                                                     \
  constexpr char k_##NAME[] = "my_ops::" #NAME;                                                                   \
  }                                                                                                               \
  TORCH_LIBRARY_FRAGMENT(my_ops, m) {                                                                             \
    blocks::define_op<blocks::OP<k_##NAME, NAME##_out_impl>>(m, SCHEMA);                                          \
  }                                                                                                               \
  }
