// The out kernels of the block-format ops (linear_<format>.out, embedding_<format>.out), both modes, around the
// kernel body of block_linear.h: every argument checked before memory is touched (one body of checks, one message
// for PyTorch and the runtime), the output resized to the op's shape, then the kernel. A program is untrusted input:
// a weight whose shape does not hold whole blocks, or an input whose width is not the weight's, is refused, so the
// kernel never reads past the constant's bytes; so is an embedding index outside the table.
#pragma once

#include <array>
#include <string>

#include "block_linear.h"
#include "kernel_contract.h"

namespace custom {
namespace native {
namespace blocks {

// ---- Shapes ---------------------------------------------------------------------------------------------------------
// The weight of a layer with k inputs and n outputs: F32 float32 [n, k]; the quantized formats uint8 [n, k / 32 *
// block bytes] (k a multiple of 32).
template <Format F>
contract::Problem weight_problem(const Tensor& weight, const char* op) {
  const std::string name = op;
  constexpr bool kFloat = F == Format::kF32;
  if (weight.scalar_type() != (kFloat ? ScalarType::Float : ScalarType::Byte)) {
    return name + ": weight has dtype " + contract::dtype_name(weight.scalar_type()) + " but a " + Traits<F>::kName +
        " weight is " + (kFloat ? "float32" : "uint8 (the blocks' bytes, packed at export)");
  }
  if (weight.dim() != 2) {
    return name + ": weight " + contract::shape_text(weight) + " must have 2 dimensions, [outputs, " +
        (kFloat ? std::string("inputs]") : "bytes per row]");
  }
  if (!kFloat && weight.size(1) % kBlockBytes<F> != 0) {
    return name + ": weight " + contract::shape_text(weight) + " rows of " + std::to_string(weight.size(1)) +
        " bytes are not whole " + Traits<F>::kName + " blocks of " + std::to_string(kBlockBytes<F>) +
        " bytes (32 weights each); pack it with the op's Python side";
  }
  return std::nullopt;
}

// Inputs of the layer the weight holds.
template <Format F>
int64_t inputs_of(const Tensor& weight) {
  return F == Format::kF32 ? weight.size(1) : weight.size(1) / kBlockBytes<F> * kBlock;
}

template <Format F>
contract::Problem linear_problem(const Tensor& input, const Tensor& weight, const Tensor& out, const char* op) {
  if (auto p = contract::dtype_problem<contract::DtypeSet<ScalarType::Float>>(input, op, "input")) {
    return p;
  }
  if (auto p = contract::same_dtype_problem(out, input, op, "out", "input")) {
    return p;
  }
  if (auto p = weight_problem<F>(weight, op)) {
    return p;
  }
  if (input.dim() < 1 || input.size(input.dim() - 1) != inputs_of<F>(weight)) {
    return std::string(op) + ": input " + contract::shape_text(input) + " must end in the layer's " +
        std::to_string(inputs_of<F>(weight)) + " inputs (weight " + contract::shape_text(weight) + ")";
  }
  return std::nullopt;
}

template <Format F>
contract::Problem embedding_problem(const Tensor& weight, const Tensor& indices, const Tensor& out, const char* op) {
  if (auto p = weight_problem<F>(weight, op)) {
    return p;
  }
  if (indices.scalar_type() != ScalarType::Long) {
    return std::string(op) + ": indices have dtype " + contract::dtype_name(indices.scalar_type()) +
        "; they must be int64";
  }
  if (out.scalar_type() != ScalarType::Float) {
    return std::string(op) + ": out has dtype " + contract::dtype_name(out.scalar_type()) + "; it must be float32";
  }
  return std::nullopt;
}

// Read after the layout checks (dense indices): every index names a row of the table.
template <Format F>
contract::Problem index_problem(const Tensor& weight, const Tensor& indices, const char* op) {
  const int64_t* data = indices.template const_data_ptr<int64_t>();
  const int64_t rows = weight.size(0);
  for (int64_t i = 0; i < indices.numel(); ++i) {
    if (data[i] < 0 || data[i] >= rows) {
      return std::string(op) + ": index " + std::to_string(data[i]) + " (element " + std::to_string(i) +
          " of indices) is outside the table's " + std::to_string(rows) + " rows";
    }
  }
  return std::nullopt;
}

inline contract::Problem layout_problem(const char* op, std::initializer_list<contract::Operand> outputs,
                                        std::initializer_list<contract::Operand> inputs) {
  for (std::initializer_list<contract::Operand> group : {outputs, inputs}) {
    for (const contract::Operand& t : group) {
      if (auto p = contract::dense_problem(t.tensor, op, t.name)) {
        return p;
      }
    }
  }
  return contract::memory_problem(op, outputs, inputs);
}

// Leading dimensions of `lead` (all but its last when `drop_last`), then `last`.
template <typename Sizes>
void output_sizes(const Tensor& lead, bool drop_last, int64_t last, Sizes& sizes, size_t& dims) {
  dims = 0;
  for (int64_t d = 0; d < lead.dim() - (drop_last ? 1 : 0); ++d) {
    sizes[dims++] = lead.size(d);
  }
  sizes[dims++] = last;
}

// ---- The two kernels, in each mode ----------------------------------------------------------------------------------
#ifdef USE_ATEN_LIB
template <Format F>
at::Tensor& linear_out(const at::Tensor& input, const at::Tensor& weight, at::Tensor& out, const char* op) {
  contract::require(linear_problem<F>(input, weight, out, op));
  std::vector<int64_t> sizes(input.dim());
  size_t dims = 0;
  output_sizes(input, true, weight.size(0), sizes, dims);
  contract::resize_output(out, c10::fromIntArrayRefSlow(sizes), op);
  contract::check_memory(op, {{out, "out"}}, {{input, "input"}, {weight, "weight"}});
  const at::Tensor x = input.contiguous(), w = weight.contiguous();
  return contract::into_dense_out(out, [&](at::Tensor& y) {
    contract::require(layout_problem(op, {{y, "out"}}, {{x, "input"}, {w, "weight"}}));
    const int64_t k = inputs_of<F>(w);
    linear<F>(x.const_data_ptr<float>(), k == 0 ? 0 : x.numel() / k, k, w.const_data_ptr(), w.size(0),
              y.mutable_data_ptr<float>());
  });
}

template <Format F>
at::Tensor& embedding_out(const at::Tensor& weight, const at::Tensor& indices, at::Tensor& out, const char* op) {
  contract::require(embedding_problem<F>(weight, indices, out, op));
  std::vector<int64_t> sizes(indices.dim() + 1);
  size_t dims = 0;
  output_sizes(indices, false, inputs_of<F>(weight), sizes, dims);
  contract::resize_output(out, c10::fromIntArrayRefSlow(sizes), op);
  contract::check_memory(op, {{out, "out"}}, {{weight, "weight"}, {indices, "indices"}});
  const at::Tensor w = weight.contiguous(), i = indices.contiguous();
  return contract::into_dense_out(out, [&](at::Tensor& y) {
    contract::require(layout_problem(op, {{y, "out"}}, {{w, "weight"}, {i, "indices"}}));
    contract::require(index_problem<F>(w, i, op));
    embed<F>(w.const_data_ptr<uint8_t>(), w.size(0), inputs_of<F>(w), i.const_data_ptr<int64_t>(), i.numel(),
             y.mutable_data_ptr<float>());
  });
}
#else
using Sizes = std::array<executorch::aten::SizesType, executorch::runtime::kTensorDimensionLimit>;

template <Format F>
Tensor& linear_out(KernelContext& ctx, const Tensor& input, const Tensor& weight, Tensor& out, const char* op) {
  if (!contract::require(ctx, linear_problem<F>(input, weight, out, op))) {
    return out;
  }
  Sizes sizes;
  size_t dims = 0;
  output_sizes(input, true, weight.size(0), sizes, dims);
  if (!contract::resize_output(ctx, out, {sizes.data(), dims}, op, "out") ||
      !contract::require(ctx, layout_problem(op, {{out, "out"}}, {{input, "input"}, {weight, "weight"}}))) {
    return out;
  }
  const int64_t k = inputs_of<F>(weight);
  const bool ran = linear<F>(input.const_data_ptr<float>(), k == 0 ? 0 : input.numel() / k, k,
                             weight.const_data_ptr(), weight.size(0), out.mutable_data_ptr<float>());
  ET_KERNEL_CHECK_MSG(ctx, ran, Internal, out, "%s: the threadpool did not run all of the tasks", op);
  return out;
}

template <Format F>
Tensor& embedding_out(KernelContext& ctx, const Tensor& weight, const Tensor& indices, Tensor& out, const char* op) {
  if (!contract::require(ctx, embedding_problem<F>(weight, indices, out, op))) {
    return out;
  }
  Sizes sizes;
  size_t dims = 0;
  if (indices.dim() + 1 > static_cast<int64_t>(sizes.size())) {
    contract::require(ctx, std::string(op) + ": indices have " + std::to_string(indices.dim()) +
                               " dimensions; the output would have more than the runtime's limit");
    return out;
  }
  output_sizes(indices, false, inputs_of<F>(weight), sizes, dims);
  if (!contract::resize_output(ctx, out, {sizes.data(), dims}, op, "out") ||
      !contract::require(ctx, layout_problem(op, {{out, "out"}}, {{weight, "weight"}, {indices, "indices"}})) ||
      !contract::require(ctx, index_problem<F>(weight, indices, op))) {
    return out;
  }
  embed<F>(weight.const_data_ptr<uint8_t>(), weight.size(0), inputs_of<F>(weight), indices.const_data_ptr<int64_t>(),
           indices.numel(), out.mutable_data_ptr<float>());
  return out;
}
#endif

}  // namespace blocks
}  // namespace native
}  // namespace custom
