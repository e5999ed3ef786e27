// The out-variant contract every kernel keeps, whatever its arguments: the checks a kernel makes before it touches
// memory (dtypes from the op's own set, outputs resized to the shape the op computes, data present, aligned and not
// overlapping where the op cannot allow it) and the thread pool it runs on. The elementwise helper and the row-wise
// helper use it; an op with its own loop (quantize_rows_out.cpp, update_cache_out.cpp) calls it directly.
//
// Two modes, like the helpers: ExecuTorch mode (each check logs one line naming the op and argument, fails the
// KernelRuntimeContext and returns false; the kernel returns at once) and ATen mode (-DUSE_ATEN_LIB: each check throws
// c10::Error, a RuntimeError in Python).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#ifdef USE_ATEN_LIB
#include <ATen/MemoryOverlap.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/native/Resize.h>
#else
#include <executorch/runtime/core/exec_aten/util/scalar_type_util.h>
#include <executorch/runtime/core/exec_aten/util/tensor_shape_to_c_string.h>
#include <executorch/runtime/kernel/kernel_includes.h>
#include <executorch/runtime/kernel/thread_parallel_interface.h>
#endif

namespace custom {
namespace native {

#ifdef USE_ATEN_LIB
using Tensor = at::Tensor;
using ScalarType = at::ScalarType;
#else
using Tensor = executorch::aten::Tensor;
using ScalarType = executorch::aten::ScalarType;
using KernelContext = executorch::runtime::KernelRuntimeContext;
#endif

namespace contract {

// ---- Dtypes: each op compiles and accepts its own set ----------------------------------------------------------------
template <ScalarType kType>
struct cpp_type;
#define CUSTOM_OPS_CPP_TYPE(SCALAR, CTYPE) \
  template <>                              \
  struct cpp_type<ScalarType::SCALAR> {    \
    using type = CTYPE;                    \
  };
CUSTOM_OPS_CPP_TYPE(Float, float)
CUSTOM_OPS_CPP_TYPE(Double, double)
CUSTOM_OPS_CPP_TYPE(Half, c10::Half)
CUSTOM_OPS_CPP_TYPE(BFloat16, c10::BFloat16)
CUSTOM_OPS_CPP_TYPE(Byte, uint8_t)
CUSTOM_OPS_CPP_TYPE(Char, int8_t)
CUSTOM_OPS_CPP_TYPE(Short, int16_t)
CUSTOM_OPS_CPP_TYPE(Int, int32_t)
CUSTOM_OPS_CPP_TYPE(Long, int64_t)
#undef CUSTOM_OPS_CPP_TYPE

inline const char* dtype_name(ScalarType type) {
  switch (type) {
    case ScalarType::Float: return "float32";
    case ScalarType::Double: return "float64";
    case ScalarType::Half: return "float16";
    case ScalarType::BFloat16: return "bfloat16";
    case ScalarType::Byte: return "uint8";
    case ScalarType::Char: return "int8";
    case ScalarType::Short: return "int16";
    case ScalarType::Int: return "int32";
    case ScalarType::Long: return "int64";
    case ScalarType::Bool: return "bool";
    default: return "another dtype";
  }
}

// The dtypes an op supports, e.g. DtypeSet<ScalarType::Float, ScalarType::Half, ScalarType::BFloat16>: only these are
// compiled (visit instantiates the kernel once per member), every other is refused with the op's name and this list.
template <ScalarType... kTypes>
struct DtypeSet {
  static bool contains(ScalarType type) {
    return ((type == kTypes) || ...);
  }

  static std::string names() {
    std::string text;
    ((text += (text.empty() ? "" : ", "), text += dtype_name(kTypes)), ...);
    return text;
  }

  // Calls fn(T{}) with T the C++ type of `type` (a member); false when it is not one.
  template <typename Fn>
  static bool visit(ScalarType type, Fn&& fn) {
    return ((type == kTypes ? (fn(typename cpp_type<kTypes>::type{}), true) : false) || ...);
  }
};

using FloatingDtypes = DtypeSet<ScalarType::Float, ScalarType::Half, ScalarType::BFloat16>;
// Every real dtype of aten::mul on CPU.
using RealDtypes = DtypeSet<ScalarType::Float, ScalarType::Double, ScalarType::Half, ScalarType::BFloat16,
                            ScalarType::Byte, ScalarType::Char, ScalarType::Short, ScalarType::Int, ScalarType::Long>;

// ---- Threads -------------------------------------------------------------------------------------------------------
// fn(begin, end) over [begin, end) in chunks of at least `grain`, on ATen's pool or ExecuTorch's; false if the pool did
// not run all of it (ExecuTorch's reports that, ATen's throws).
template <typename Fn>
bool parallel_for(int64_t begin, int64_t end, int64_t grain, const Fn& fn) {
#ifdef USE_ATEN_LIB
  at::parallel_for(begin, end, grain, fn);
  return true;
#else
  return executorch::extension::parallel_for(begin, end, grain, fn);
#endif
}

// ---- Memory: present, aligned, and overlapping only where the op allows -----------------------------------------
struct Operand {
  const Tensor& tensor;
  const char* name;
  bool may_be_output = false;  // the kernel reads each element before writing it: exactly the output is fine
};

inline bool is_element_aligned(const Tensor& t) {
  return reinterpret_cast<uintptr_t>(t.const_data_ptr()) % t.element_size() == 0;
}

inline bool same_or_disjoint(const Tensor& a, const Tensor& b, bool may_be_same) {
  const auto x = reinterpret_cast<uintptr_t>(a.const_data_ptr());
  const auto y = reinterpret_cast<uintptr_t>(b.const_data_ptr());
  if (a.nbytes() == 0 || b.nbytes() == 0) {
    return true;
  }
  return (may_be_same && x == y && a.nbytes() == b.nbytes()) || x + a.nbytes() <= y || y + b.nbytes() <= x;
}

#ifdef USE_ATEN_LIB

template <typename Set>
void check_dtype(const Tensor& t, const char* op, const char* arg) {
  TORCH_CHECK(Set::contains(t.scalar_type()), op, ": ", arg, " has unsupported dtype ", t.scalar_type(),
              "; supported: ", Set::names());
}

inline void check_same_dtype(const Tensor& t, const Tensor& like, const char* op, const char* arg, const char* like_arg) {
  TORCH_CHECK(t.scalar_type() == like.scalar_type(), op, ": ", arg, " has dtype ", t.scalar_type(), " but ", like_arg,
              " has ", like.scalar_type(), "; they must match");
}

// out= rules as ATen's: resized (warning when a non-empty output had another shape), laid out contiguously.
inline void resize_output(Tensor& out, c10::SymIntArrayRef sizes, const char* /*op*/) {
  if (at::native::resize_output_check_symint(out, sizes)) {
    out.resize__symint(sizes);
  }
}

inline void check_memory(const char* op, std::initializer_list<Operand> outputs, std::initializer_list<Operand> inputs) {
  for (const Operand& out : outputs) {
    TORCH_CHECK(out.tensor.device().is_cpu(), op, ": ", out.name, " is on ", out.tensor.device(), "; this kernel runs "
                "on CPU tensors");
    at::assert_no_internal_overlap(out.tensor);
    TORCH_CHECK(is_element_aligned(out.tensor), op, ": ", out.name, " is not aligned to its element size; pass a copy");
    for (const Operand& in : inputs) {
      TORCH_CHECK(in.tensor.device().is_cpu(), op, ": ", in.name, " is on ", in.tensor.device(), "; this kernel runs "
                  "on CPU tensors");
      TORCH_CHECK(is_element_aligned(in.tensor), op, ": ", in.name, " is not aligned to its element size; pass a "
                  "copy (.clone())");
      at::assert_no_partial_overlap(out.tensor, in.tensor);  // PyTorch's own out= error first
      TORCH_CHECK(same_or_disjoint(out.tensor, in.tensor, in.may_be_output), op, ": ", out.name, " overlaps ", in.name,
                  in.may_be_output ? " without being it" : "", "; pass separate tensors");
    }
  }
}

#else // ExecuTorch mode

inline auto shape_string(const Tensor& t) {
  return executorch::runtime::tensor_shape_to_c_string({t.sizes().data(), t.sizes().size()});
}

inline bool fail(KernelContext& ctx) {
  ctx.fail(executorch::runtime::Error::InvalidArgument);
  return false;
}

template <typename Set>
bool check_dtype(KernelContext& ctx, const Tensor& t, const char* op, const char* arg) {
  if (Set::contains(t.scalar_type())) {
    return true;
  }
  ET_LOG(Error, "%s: %s has unsupported dtype %s; supported: %s", op, arg, dtype_name(t.scalar_type()),
         Set::names().c_str());
  return fail(ctx);
}

inline bool check_same_dtype(KernelContext& ctx, const Tensor& t, const Tensor& like, const char* op, const char* arg,
                             const char* like_arg) {
  if (t.scalar_type() == like.scalar_type()) {
    return true;
  }
  ET_LOG(Error, "%s: %s has dtype %s but %s has %s; they must match", op, arg, dtype_name(t.scalar_type()), like_arg,
         dtype_name(like.scalar_type()));
  return fail(ctx);
}

// Dynamic-shape programs plan an output at its upper bound and expect the kernel to resize it to the real shape.
inline bool resize_output(KernelContext& ctx, Tensor& out, executorch::aten::ArrayRef<executorch::aten::SizesType> sizes,
                          const char* op, const char* name) {
  if (executorch::runtime::resize_tensor(out, sizes) == executorch::runtime::Error::Ok) {
    return true;
  }
  ET_LOG(Error, "%s: %s has shape %s and cannot be resized to %s; export the program so the output's shape is the "
         "op's (or dynamic with a large enough upper bound)", op, name, shape_string(out).data(),
         executorch::runtime::tensor_shape_to_c_string({sizes.data(), sizes.size()}).data());
  return fail(ctx);
}

// Every tensor with elements has memory aligned to its elements; no output overlaps an input (or, where the op
// allows it, is exactly that input). A program's memory plan decides where tensors live, and a corrupt one can place
// them anywhere.
inline bool check_memory(KernelContext& ctx, const char* op, std::initializer_list<Operand> outputs,
                         std::initializer_list<Operand> inputs) {
  for (std::initializer_list<Operand> group : {outputs, inputs}) {
    for (const Operand& t : group) {
      if (t.tensor.numel() > 0 && (t.tensor.const_data_ptr() == nullptr || !is_element_aligned(t.tensor))) {
        ET_LOG(Error, "%s: %s has no memory or memory not aligned to its %zu-byte elements; the program's memory plan "
               "is corrupt, re-export it", op, t.name, static_cast<size_t>(t.tensor.element_size()));
        return fail(ctx);
      }
    }
  }
  for (const Operand& out : outputs) {
    for (std::initializer_list<Operand> group : {inputs, outputs}) {
      for (const Operand& other : group) {
        if (&other.tensor != &out.tensor && !same_or_disjoint(out.tensor, other.tensor, other.may_be_output)) {
          ET_LOG(Error, "%s: %s overlaps %s%s; the program's memory plan is corrupt, re-export it", op, out.name,
                 other.name, other.may_be_output ? " without being it" : "");
          return fail(ctx);
        }
      }
    }
  }
  return true;
}

inline bool check_contiguous(KernelContext& ctx, const Tensor& t, const char* op, const char* name) {
  if (executorch::runtime::tensor_is_default_dim_order(t)) {
    return true;
  }
  ET_LOG(Error, "%s: %s is not in the default (contiguous) dim order; export it contiguous", op, name);
  return fail(ctx);
}

#endif // USE_ATEN_LIB

} // namespace contract
} // namespace native
} // namespace custom
