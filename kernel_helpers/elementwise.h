// The elementwise helper for any number of inputs: out = op(a, b, ...) element by element, the inputs broadcast to the
// output's shape (NumPy's rules, as ATen's), for the dtypes the op lists, behind the out-variant contract (dtypes,
// resize, dim order, alignment, overlap: kernel_contract.h). The functor is an object, so it can carry runtime
// arguments such as a scale read from the program:
//
//   struct ScaledAdd {
//     double alpha;
//     template <typename T>
//     T apply(T x, T y) const { return x + static_cast<T>(alpha) * y; }
//   };
//   return elementwise_out<declared_dtypes::my_ops::scaled_add>(ctx, "my_ops::scaled_add.out", ScaledAdd{alpha},
//                                                               {out, "out"}, {{input, "input"}, {other, "other"}});
//
// (declared_dtypes/<namespace>/<name>.h, written by the build from custom_ops.bzl, holds the op's declared dtypes as
// its DtypeSet.)
//
// apply<T> follows elementwise_functor.h (T is the compute type: Half/BFloat16 arrive as float and are rounded once,
// integers wrap) and must not change the functor (threads share it). unary_elementwise.h is the one-input case: a
// stateless functor on inputs laid out like the output runs the vectorized loop of elementwise_loop.h; everything else
// runs the strided loop below, threaded over rows of the output.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "elementwise_functor.h"
#include "elementwise_loop.h"
#include "kernel_contract.h"

#include "aten_out_rules.h"

namespace custom {
namespace native {
namespace elementwise {

constexpr int kMaxDims = 16;

// The output's index space and, per operand (the output first, then each input), its element strides over it: 0
// along a dimension an input is broadcast in.
template <size_t N>
struct Layout {
  int dims = 0;
  int64_t sizes[kMaxDims];
  int64_t strides[N + 1][kMaxDims];
  int64_t numel() const {
    int64_t n = 1;
    for (int d = 0; d < dims; ++d) {
      n *= sizes[d];
    }
    return n;
  }
};

// The broadcast shape of `inputs` (right-aligned; a size-1 dimension stretches); false when two sizes conflict or
// the rank passes kMaxDims.
template <size_t N>
bool broadcast_sizes(const std::array<const Tensor*, N>& inputs, Layout<N>& layout) {
  layout.dims = 0;
  for (const Tensor* t : inputs) {
    layout.dims = std::max<int>(layout.dims, static_cast<int>(t->dim()));
  }
  if (layout.dims > kMaxDims) {
    return false;
  }
  for (int d = 0; d < layout.dims; ++d) {
    layout.sizes[d] = 1;
  }
  for (const Tensor* t : inputs) {
    const int offset = layout.dims - static_cast<int>(t->dim());
    for (int d = 0; d < static_cast<int>(t->dim()); ++d) {
      const int64_t size = t->size(d);
      int64_t& target = layout.sizes[offset + d];
      if (size != target && size != 1 && target != 1) {
        return false;
      }
      target = size == 1 ? target : size;
    }
  }
  return true;
}

template <size_t N>
void fill_strides(const Tensor& t, int operand, Layout<N>& layout) {
  const int offset = layout.dims - static_cast<int>(t.dim());
  for (int d = 0; d < layout.dims; ++d) {
    const bool present = d >= offset && t.size(d - offset) != 1;
    layout.strides[operand][d] = present ? static_cast<int64_t>(t.strides()[d - offset]) : 0;
  }
}

// One element of a functor object for storage type T: widen each operand, apply, round once.
template <typename T, typename Op, typename... Ts>
inline T apply_object(const Op& op, Ts... xs) {
  using C = compute_t<T>;
  return static_cast<T>(op.template apply<C>(static_cast<C>(xs)...));
}

// out[i] = op(in_0[i], ...) over contiguous memory of n elements, threaded like the unary loop.
template <typename T, typename Op, size_t N, size_t... I>
bool dense_loop(const Op& op, T* out, const std::array<const T*, N>& in, int64_t n, std::index_sequence<I...>) {
  const auto work = [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      out[i] = apply_object<T>(op, in[I][i]...);
    }
  };
  const int64_t grain = std::max<int64_t>(1, static_cast<int64_t>(parallel_grain_bytes() / sizeof(T)));
  if (n < 2 * grain) {
    work(0, n);
    return true;
  }
  return contract::parallel_for(int64_t{0}, n, grain, work);
}

// The general case: rows of the output's last dimension, each operand at its own strides (0 where broadcast).
template <typename T, typename Op, size_t N, size_t... I>
bool strided_loop(const Op& op, T* out, const std::array<const T*, N>& in, const Layout<N>& layout,
                  std::index_sequence<I...>) {
  const int last = layout.dims - 1;
  const int64_t inner = layout.dims == 0 ? 1 : layout.sizes[last];
  const int64_t rows = inner == 0 ? 0 : layout.numel() / inner;
  const auto work = [&](int64_t first, int64_t end) {
    for (int64_t row = first; row < end; ++row) {
      std::array<int64_t, N + 1> offset{};  // of this row's first element, per operand
      for (int64_t rest = row, d = last - 1; d >= 0; --d) {
        const int64_t index = rest % layout.sizes[d];
        rest /= layout.sizes[d];
        for (size_t k = 0; k <= N; ++k) {
          offset[k] += index * layout.strides[k][d];
        }
      }
      const int64_t step_out = layout.dims == 0 ? 0 : layout.strides[0][last];
      const std::array<int64_t, N> step{(layout.dims == 0 ? 0 : layout.strides[I + 1][last])...};
      for (int64_t j = 0; j < inner; ++j) {
        out[offset[0] + j * step_out] = apply_object<T>(op, in[I][offset[I + 1] + j * step[I]]...);
      }
    }
  };
  const int64_t grain = std::max<int64_t>(
      1, static_cast<int64_t>(parallel_grain_bytes()) / std::max<int64_t>(1, inner * static_cast<int64_t>(sizeof(T))));
  if (rows < 2 * grain) {
    work(0, rows);
    return true;
  }
  return contract::parallel_for(int64_t{0}, rows, grain, work);
}

// Every operand has the output's shape and layout, over memory without gaps: one flat loop is right. (ExecuTorch
// tensors are always dense in their dim order, which elementwise_out() checked is the output's.)
template <size_t N>
bool dense_alike(const Tensor& out, const std::array<const Tensor*, N>& inputs) {
  for (const Tensor* t : inputs) {
#ifdef USE_ATEN_LIB
    if (!contract::same_sizes(*t, out) || t->strides() != out.strides()) {
#else
    if (!contract::same_sizes(*t, out)) {
#endif
      return false;
    }
  }
#ifdef USE_ATEN_LIB
  return out.is_non_overlapping_and_dense();
#else
  return true;
#endif
}

// The loops, for storage type T, over `out` already of the broadcast shape; false when the thread pool did not run
// all of the work. Only the strided loop needs a Layout (a dense call, the common one, pays for none).
template <typename T, typename Op, size_t N>
bool run(const Op& op, Tensor& out, const std::array<const Tensor*, N>& inputs) {
  std::array<const T*, N> in{};
  for (size_t k = 0; k < N; ++k) {
    in[k] = inputs[k]->template const_data_ptr<T>();
  }
  T* dst = out.template mutable_data_ptr<T>();
  if (dense_alike(out, inputs)) {
    if constexpr (N == 1 && std::is_empty_v<Op>) {  // a stateless unary functor: the vectorized loop
      return apply_unary<T, Op>(in[0], dst, out.numel(), [](int64_t b, int64_t e, int64_t g, const auto& fn) {
        return contract::parallel_for(b, e, g, fn);
      });
    } else {
      return dense_loop<T>(op, dst, in, out.numel(), std::make_index_sequence<N>());
    }
  }
  Layout<N> layout;
  layout.dims = static_cast<int>(out.dim());
  for (int d = 0; d < layout.dims; ++d) {
    layout.sizes[d] = out.size(d);
  }
  fill_strides(out, 0, layout);
  for (size_t k = 0; k < N; ++k) {
    fill_strides(*inputs[k], static_cast<int>(k + 1), layout);
  }
  return strided_loop<T>(op, dst, in, layout, std::make_index_sequence<N>());
}

// True when every input has the first one's shape, of a rank the strided loop takes: the broadcast shape is that
// shape, nothing to work out (otherwise broadcast_sizes() works it out, or refuses it).
template <size_t N>
bool same_shapes(const std::array<const Tensor*, N>& inputs) {
  if (inputs[0]->dim() > kMaxDims) {
    return false;
  }
  for (size_t k = 1; k < N; ++k) {
    if (!contract::same_sizes(*inputs[k], *inputs[0])) {
      return false;
    }
  }
  return true;
}

} // namespace elementwise

// An input, or the output, with the name the op's messages use for it.
struct Named {
  const Tensor& tensor;
  const char* name;
};

#ifdef USE_ATEN_LIB

template <typename Dtypes, typename Op, size_t N>
at::Tensor& elementwise_out(const char* op_name, const Op& op, const Named& out, const Named (&inputs)[N]) {
  Tensor& result = const_cast<Tensor&>(out.tensor);
  std::array<const Tensor*, N> tensors{};
  for (size_t k = 0; k < N; ++k) {
    tensors[k] = &inputs[k].tensor;
    contract::check_dtype<Dtypes>(inputs[k].tensor, op_name, inputs[k].name);
    contract::check_same_dtype(result, inputs[k].tensor, op_name, out.name, inputs[k].name);
  }
  c10::IntArrayRef sizes = tensors[0]->sizes();
  elementwise::Layout<N> broadcast;
  if (!elementwise::same_shapes(tensors)) {
    TORCH_CHECK(elementwise::broadcast_sizes(tensors, broadcast), op_name, ": the inputs' shapes do not broadcast "
                "together (the first is ", contract::shape_text(*tensors[0]), ")");
    sizes = c10::IntArrayRef(broadcast.sizes, broadcast.dims);
  }
  if (at::native::resize_output_check(result, sizes)) {
    // A fresh output is laid out like the first input of its shape (channels-last stays so, as with ATen's ops).
    const Tensor& like = *tensors[0];
    result.resize_(sizes, like.sizes() == sizes ? like.suggest_memory_format() : at::MemoryFormat::Contiguous);
  }
  for (size_t k = 0; k < N; ++k) {
    const bool in_place_ok = contract::same_sizes(inputs[k].tensor, result) &&
        inputs[k].tensor.strides() == result.strides();
    const contract::Operand output{result, out.name};
    const contract::Operand input{inputs[k].tensor, inputs[k].name, in_place_ok};
    contract::check_memory(op_name, {output}, {input});
  }
  Dtypes::visit(result.scalar_type(), [&](auto zero) {
    elementwise::run<decltype(zero)>(op, result, tensors);
  });
  return result;
}

// PyTorch's other kernels of an op with several (broadcast) inputs, made from its out variant's CPU kernel, so a C++
// registration writes no shape or dtype logic of its own:
//
//   m.impl("scaled_add", TORCH_FN((elementwise_functional<scaled_add_out_impl, const at::Tensor&, double>)));  // CPU
//   m.impl("scaled_add", [](const at::Tensor& a, const at::Tensor& b, double) {                                 // Meta
//     return elementwise_meta<declared_dtypes::my_ops::scaled_add>("my_ops::scaled_add", {{a, "input"}, {b, "other"}});
//   });
//
// The functional kernel: a result of the first input's dtype, which OutKernel (first, rest..., result) resizes to the
// broadcast shape and fills; its errors under the functional op's name.
template <auto OutKernel, typename... Rest>
at::Tensor elementwise_functional(const at::Tensor& first, Rest... rest) {
  at::Tensor result = first.new_empty({0});
  contract::reported_as_functional([&] { OutKernel(first, rest..., result); });
  return result;
}

// The Meta kernel of the functional op: the out kernel's dtype checks, then an empty result of the broadcast shape,
// sizes kept symbolic (torch.export with dynamic dimensions).
template <typename Dtypes, size_t N>
at::Tensor elementwise_meta(const char* op_name, const Named (&inputs)[N]) {
  c10::SymDimVector shape(inputs[0].tensor.sym_sizes().begin(), inputs[0].tensor.sym_sizes().end());
  for (size_t k = 0; k < N; ++k) {
    contract::check_dtype<Dtypes>(inputs[k].tensor, op_name, inputs[k].name);
    contract::check_same_dtype(inputs[k].tensor, inputs[0].tensor, op_name, inputs[k].name, inputs[0].name);
    try {
      shape = at::infer_size_symdimvector(shape, inputs[k].tensor.sym_sizes());
    } catch (const c10::Error& err) {
      TORCH_CHECK(false, op_name, ": the inputs' shapes do not broadcast together: ", err.msg());
    }
  }
  return inputs[0].tensor.new_empty_symint(shape);
}

// The Meta kernel of the out variant: the functional Meta kernel's checks, the output's dtype, and its resize.
template <typename Dtypes, size_t N>
at::Tensor& elementwise_out_meta(const char* op_name, const Named& out, const Named (&inputs)[N]) {
  const at::Tensor like = elementwise_meta<Dtypes>(op_name, inputs);
  at::Tensor& result = const_cast<at::Tensor&>(out.tensor);
  contract::check_same_dtype(result, inputs[0].tensor, op_name, out.name, inputs[0].name);
  if (at::native::resize_output_check_symint(result, like.sym_sizes())) {
    result.resize__symint(like.sym_sizes());
  }
  return result;
}

#else // ExecuTorch mode

template <typename Dtypes, typename Op, size_t N>
Tensor& elementwise_out(KernelContext& ctx, const char* op_name, const Op& op, const Named& out,
                        const Named (&inputs)[N]) {
  Tensor& result = const_cast<Tensor&>(out.tensor);
  std::array<const Tensor*, N> tensors{};
  for (size_t k = 0; k < N; ++k) {
    tensors[k] = &inputs[k].tensor;
    if (!contract::check_dtype<Dtypes>(ctx, inputs[k].tensor, op_name, inputs[k].name) ||
        !contract::check_same_dtype(ctx, result, inputs[k].tensor, op_name, out.name, inputs[k].name)) {
      return result;
    }
  }
  executorch::aten::ArrayRef<executorch::aten::SizesType> sizes = tensors[0]->sizes();
  executorch::aten::SizesType broadcast[elementwise::kMaxDims];
  if (!elementwise::same_shapes(tensors)) {
    elementwise::Layout<N> layout;
    ET_KERNEL_CHECK_MSG(ctx, elementwise::broadcast_sizes(tensors, layout), InvalidArgument, result,
                        "%s: the inputs' shapes do not broadcast together (the first is %s)", op_name,
                        contract::shape_text(*tensors[0]).c_str());
    for (int d = 0; d < layout.dims; ++d) {
      broadcast[d] = static_cast<executorch::aten::SizesType>(layout.sizes[d]);
    }
    sizes = {broadcast, static_cast<size_t>(layout.dims)};
  }
  if (!contract::resize_output(ctx, result, sizes, op_name, out.name)) {
    return result;
  }
  // The strided loop follows strides, but a program states layouts as dim orders: one for all keeps them honest.
  for (size_t k = 0; k < N; ++k) {
    ET_KERNEL_CHECK_MSG(
        ctx, inputs[k].tensor.dim() != result.dim() || inputs[k].tensor.dim_order().equals(result.dim_order()) ||
                 executorch::runtime::tensors_have_same_dim_order(inputs[k].tensor, result),
        InvalidArgument, result,
        "%s: %s and %s have different dim orders (memory layouts); export them with the same memory format", op_name,
        inputs[k].name, out.name);
    const bool in_place_ok = contract::same_sizes(inputs[k].tensor, result) &&
        inputs[k].tensor.strides().equals(result.strides());
    const contract::Operand output{result, out.name};
    const contract::Operand input{inputs[k].tensor, inputs[k].name, in_place_ok};
    if (!contract::check_memory(ctx, op_name, {output}, {input})) {
      return result;
    }
  }
  bool all_work_ran = true;
  Dtypes::visit(result.scalar_type(), [&](auto zero) {
    all_work_ran = elementwise::run<decltype(zero)>(op, result, tensors);
  });
  ET_KERNEL_CHECK_MSG(ctx, all_work_ran, Internal, result, "%s: the threadpool did not run all of the work", op_name);
  return result;
}

#endif // USE_ATEN_LIB

} // namespace native
} // namespace custom
