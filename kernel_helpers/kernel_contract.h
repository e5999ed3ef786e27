// The out-variant contract every kernel keeps, whatever its arguments: the checks a kernel makes before it touches
// memory (dtypes from the op's own set, outputs resized to the shape the op computes, data present, aligned and not
// overlapping where the op cannot allow it) and the thread pool it runs on. The elementwise helper and the row-wise
// helper use it; an op with its own loop (ops/quantize_rows/quantize_rows_out.cpp,
// ops/update_cache/update_cache_out.cpp) calls it directly.
//
// One body of checks for both modes: each check is a function of the tensors that returns the problem's text (or
// nothing), the same text in both; only the reporting differs. ExecuTorch mode logs that line, fails the
// KernelRuntimeContext and returns false (the kernel returns at once); ATen mode (-DUSE_ATEN_LIB) throws c10::Error, a
// RuntimeError in Python. A kernel with arguments of its own writes one `*_problem()` function from these and calls
// it from both branches (the *_out.cpp of ops/quantize_rows, ops/update_cache and ops/rms_norm).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#ifdef USE_ATEN_LIB
#include <ATen/MemoryOverlap.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>

#include "kernel_helpers/aten_out_rules.h"
#else
#include <executorch/runtime/core/exec_aten/util/scalar_type_util.h>
#include <executorch/runtime/kernel/kernel_includes.h>
#include <executorch/runtime/kernel/thread_parallel_interface.h>
#endif

#include "kernel_helpers/elementwise_loop.h"

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
    case ScalarType::ComplexHalf: return "complex32";
    case ScalarType::ComplexFloat: return "complex64";
    case ScalarType::ComplexDouble: return "complex128";
    default: return "another dtype";
  }
}

// The dtypes an op supports, e.g. DtypeSet<ScalarType::Float, ScalarType::Half, ScalarType::BFloat16>: only these are
// compiled (visit instantiates the kernel once per member), every other is refused with the op's name and this list.
// An op's own set is the one custom_ops.bzl declares: declared_dtypes::<namespace>::<name>
// (declared_dtypes/<namespace>/<name>.h, which the build writes).
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
// Threads of the pool parallel_for runs on: ATen's or ExecuTorch's.
inline int64_t thread_count() {
#ifdef USE_ATEN_LIB
  return at::get_num_threads();
#else
  return executorch::extension::get_thread_count();
#endif
}

// Who hands ranges to the pool, for the counters' split of its time (the kernels of a decode step that use it).
enum class PoolUser { kLinear, kAttention, kOther, kLayer };

template <typename Fn>
bool pool_parallel_for(int64_t begin, int64_t end, int64_t grain, const Fn& fn) {
#ifdef USE_ATEN_LIB
  at::parallel_for(begin, end, grain, fn);
  return true;
#else
  return executorch::extension::parallel_for(begin, end, grain, fn);
#endif
}

// fn(begin, end) over [begin, end) in chunks of at least `grain`, on that pool; false if the pool did not run all of
// it (ExecuTorch's reports that, ATen's throws). Under CUSTOM_OPS_COUNT_PATHS=1, each call that reaches the pool's
// workers is counted (elementwise_loop.h's kPoolHandoffs: a decode step's hand-offs, each a wake and a join, are what
// a second core pays for) and timed for `user`: the thread-time it held the pool and the time its tasks worked.
template <typename Fn>
bool parallel_for(int64_t begin, int64_t end, int64_t grain, const Fn& fn, PoolUser user = PoolUser::kOther) {
  if (!elementwise::counting_paths() || end - begin <= grain || thread_count() <= 1) {
    return pool_parallel_for(begin, end, grain, fn);
  }
  using Clock = std::chrono::steady_clock;
  const auto nanos = [](Clock::duration d) {
    return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(d).count());
  };
  std::atomic<uint64_t> work{0};
  const auto start = Clock::now();
  const bool ran = pool_parallel_for(begin, end, grain, [&](int64_t first, int64_t last) {
    const auto task_start = Clock::now();
    fn(first, last);
    work.fetch_add(nanos(Clock::now() - task_start), std::memory_order_relaxed);
  });
  const uint64_t held = nanos(Clock::now() - start) * static_cast<uint64_t>(thread_count());
  const int first_counter = elementwise::kLinearPoolNanos + 2 * static_cast<int>(user);
  elementwise::count(elementwise::kPoolHandoffs);
  elementwise::count(static_cast<elementwise::Path>(first_counter), held);
  elementwise::count(static_cast<elementwise::Path>(first_counter + 1), work.load(std::memory_order_relaxed));
  return ran;
}

// ---- Memory: present, aligned, and overlapping only where the op allows -----------------------------------------
struct Operand {
  const Tensor& tensor;
  const char* name;
  bool may_be_output = false;  // the kernel reads each element before writing it: exactly the output is fine
};

// These run on every call of every op. ExecuTorch's TensorImpl::element_size() and nbytes() are calls into the
// runtime library; the same sizes from the inline table cost none.
inline size_t element_bytes(const Tensor& t) {
#ifdef USE_ATEN_LIB
  return t.element_size();
#else
  return executorch::runtime::elementSize(t.scalar_type());
#endif
}

inline bool same_sizes(const Tensor& a, const Tensor& b) {
#ifdef USE_ATEN_LIB
  return a.sizes() == b.sizes();
#else
  return a.sizes().equals(b.sizes());
#endif
}

// Every element size is a power of two: a mask, not a division.
inline bool is_element_aligned(const Tensor& t) {
  return (reinterpret_cast<uintptr_t>(t.const_data_ptr()) & (element_bytes(t) - 1)) == 0;
}

inline bool same_or_disjoint(const Tensor& a, const Tensor& b, bool may_be_same) {
  const auto x = reinterpret_cast<uintptr_t>(a.const_data_ptr());
  const auto y = reinterpret_cast<uintptr_t>(b.const_data_ptr());
  const size_t a_bytes = static_cast<size_t>(a.numel()) * element_bytes(a);
  const size_t b_bytes = static_cast<size_t>(b.numel()) * element_bytes(b);
  if (a_bytes == 0 || b_bytes == 0) {
    return true;
  }
  return (may_be_same && x == y && a_bytes == b_bytes) || x + a_bytes <= y || y + b_bytes <= x;
}

// ---- Checks: each returns the problem's text, the same in both modes ---------------------------------------------
using Problem = std::optional<std::string>;

// "[2, 3]" in both modes.
inline std::string shape_text(const Tensor& t) {
  std::string text = "[";
  for (int64_t d = 0; d < t.dim(); ++d) {
    text += (d ? ", " : "") + std::to_string(t.size(d));
  }
  return text + "]";
}

template <typename Set>
Problem dtype_problem(const Tensor& t, const char* op, const char* arg) {
  if (Set::contains(t.scalar_type())) {
    return std::nullopt;
  }
  return std::string(op) + ": " + arg + " has unsupported dtype " + dtype_name(t.scalar_type()) + "; supported: " +
      Set::names();
}

inline Problem same_dtype_problem(const Tensor& t, const Tensor& like, const char* op, const char* arg,
                                  const char* like_arg) {
  if (t.scalar_type() == like.scalar_type()) {
    return std::nullopt;
  }
  return std::string(op) + ": " + arg + " has dtype " + dtype_name(t.scalar_type()) + " but " + like_arg + " has " +
      dtype_name(like.scalar_type()) + "; they must match";
}

// Dense in the default order: what a loop over raw memory needs. (ATen: contiguous; ExecuTorch: the default dim
// order, its tensors being always dense.)
inline bool is_dense(const Tensor& t) {
#ifdef USE_ATEN_LIB
  return t.is_contiguous();
#else
  return executorch::runtime::tensor_is_default_dim_order(t);
#endif
}

inline Problem dense_problem(const Tensor& t, const char* op, const char* name) {
  if (is_dense(t)) {
    return std::nullopt;
  }
  return std::string(op) + ": " + name + " is not contiguous (in the default dim order), which this kernel writes or "
      "reads as one block; pass a contiguous tensor (.contiguous() in PyTorch; export it so in ExecuTorch)";
}

// Every tensor with elements has memory aligned to its elements; no output overlaps an input or another output (or,
// where the op allows it, is exactly that input). In ExecuTorch a program's memory plan decides where tensors live,
// and a corrupt one can place them anywhere; in PyTorch the caller does.
inline Problem memory_problem(const char* op, std::initializer_list<Operand> outputs,
                              std::initializer_list<Operand> inputs) {
  // Plain loops over each list: a list of the two lists cost a store-forwarding stall on every call (seen in perf).
  const auto unusable = [](const Operand& t) {
    return t.tensor.numel() > 0 && (t.tensor.const_data_ptr() == nullptr || !is_element_aligned(t.tensor));
  };
  const auto unusable_problem = [op](const Operand& t) -> Problem {
    return std::string(op) + ": " + t.name + " has no memory or memory not aligned to its " +
        std::to_string(element_bytes(t.tensor)) + "-byte elements; pass separate, aligned tensors (in "
        "ExecuTorch: the program's memory plan is corrupt, re-export it)";
  };
  for (const Operand& t : outputs) {
    if (unusable(t)) {
      return unusable_problem(t);
    }
  }
  for (const Operand& t : inputs) {
    if (unusable(t)) {
      return unusable_problem(t);
    }
  }
  const auto overlapping = [](const Operand& out, const Operand& other) {
    return &other.tensor != &out.tensor && !same_or_disjoint(out.tensor, other.tensor, other.may_be_output);
  };
  const auto overlap_problem = [op](const Operand& out, const Operand& other) -> Problem {
    return std::string(op) + ": " + out.name + " overlaps " + other.name +
        (other.may_be_output ? " without being it" : "") + "; pass separate tensors (in ExecuTorch: the "
        "program's memory plan is corrupt, re-export it)";
  };
  for (const Operand& out : outputs) {
    for (const Operand& other : inputs) {
      if (overlapping(out, other)) {
        return overlap_problem(out, other);
      }
    }
    for (const Operand& other : outputs) {
      if (overlapping(out, other)) {
        return overlap_problem(out, other);
      }
    }
  }
  return std::nullopt;
}

// ---- Reporting: the one place the modes differ -----------------------------------------------------------------
#ifdef USE_ATEN_LIB

inline void require(const Problem& problem) {
  TORCH_CHECK(!problem.has_value(), problem.value_or(""));
}

template <typename Set>
void check_dtype(const Tensor& t, const char* op, const char* arg) {
  require(dtype_problem<Set>(t, op, arg));
}

inline void check_same_dtype(const Tensor& t, const Tensor& like, const char* op, const char* arg, const char* like_arg) {
  require(same_dtype_problem(t, like, op, arg, like_arg));
}

// A functional op's CPU kernel that fills its result with the out variant's kernel: the out kernel's errors name the
// out variant ("my_ops::mul4.out: input has unsupported dtype bool ..."), and a user who called the functional op
// reads them under its name, so the ".out" of the message's leading op name is dropped.
template <typename Call>
decltype(auto) reported_as_functional(Call&& call) {
  try {
    return call();
  } catch (const c10::Error& error) {
    std::string message = error.what_without_backtrace();
    const size_t colon = message.find(": ");
    constexpr std::string_view kOut = ".out";
    if (colon != std::string::npos && colon >= kOut.size() &&
        message.compare(colon - kOut.size(), kOut.size(), kOut) == 0) {
      message.erase(colon - kOut.size(), kOut.size());
    }
    TORCH_CHECK(false, message);
  }
}

// out= rules as ATen's: resized (warning when a non-empty output had another shape), laid out contiguously.
inline void resize_output(Tensor& out, c10::SymIntArrayRef sizes, const char* /*op*/) {
  if (at::native::resize_output_check_symint(out, sizes)) {
    out.resize__symint(sizes);
  }
}

// PyTorch-only conditions first (a device, an output whose elements share memory), then the shared checks.
inline void check_memory(const char* op, std::initializer_list<Operand> outputs, std::initializer_list<Operand> inputs) {
  for (std::initializer_list<Operand> group : {outputs, inputs}) {
    for (const Operand& t : group) {
      TORCH_CHECK(t.tensor.device().is_cpu(), op, ": ", t.name, " is on ", t.tensor.device(), "; this kernel runs on "
                  "CPU tensors");
    }
  }
  for (const Operand& out : outputs) {
    at::assert_no_internal_overlap(out.tensor);
  }
  require(memory_problem(op, outputs, inputs));
}

// PyTorch's tensors may be strided; the kernels' loops run on dense tensors (what an exported program holds).
// `write(y)` fills a dense output: `out` itself when it is dense, else a scratch tensor then copied into `out`.
template <typename Write>
Tensor& into_dense_out(Tensor& out, const Write& write) {
  Tensor y = out.is_contiguous() ? out : out.new_empty(out.sizes());
  write(y);
  if (!y.is_same(out)) {
    out.copy_(y);
  }
  return out;
}

#else // ExecuTorch mode

inline bool require(KernelContext& ctx, const Problem& problem) {
  if (!problem) {
    return true;
  }
  ET_LOG(Error, "%s", problem->c_str());
  ctx.fail(executorch::runtime::Error::InvalidArgument);
  return false;
}

// The passing case is tested inline: building (and destroying) an empty Problem is a call on every op call.
template <typename Set>
bool check_dtype(KernelContext& ctx, const Tensor& t, const char* op, const char* arg) {
  return Set::contains(t.scalar_type()) || require(ctx, dtype_problem<Set>(t, op, arg));
}

inline bool check_same_dtype(KernelContext& ctx, const Tensor& t, const Tensor& like, const char* op, const char* arg,
                             const char* like_arg) {
  return t.scalar_type() == like.scalar_type() || require(ctx, same_dtype_problem(t, like, op, arg, like_arg));
}

// Dynamic-shape programs plan an output at its upper bound and expect the kernel to resize it to the real shape.
inline bool resize_output(KernelContext& ctx, Tensor& out, executorch::aten::ArrayRef<executorch::aten::SizesType> sizes,
                          const char* op, const char* name) {
  // Already that shape (every static-shape program, every call): nothing to do, and the runtime's resize costs as much
  // as a 16-element op.
  if (out.sizes().equals(sizes) || executorch::runtime::resize_tensor(out, sizes) == executorch::runtime::Error::Ok) {
    return true;
  }
  std::string wanted = "[";
  for (size_t d = 0; d < sizes.size(); ++d) {
    wanted += (d ? ", " : "") + std::to_string(sizes[d]);
  }
  return require(ctx, std::string(op) + ": " + name + " has shape " + shape_text(out) + " and cannot be resized to " +
                 wanted + "]; export the program so the output's shape is the op's (or dynamic with a large enough "
                 "upper bound)");
}

inline bool check_memory(KernelContext& ctx, const char* op, std::initializer_list<Operand> outputs,
                         std::initializer_list<Operand> inputs) {
  return require(ctx, memory_problem(op, outputs, inputs));
}

inline bool check_contiguous(KernelContext& ctx, const Tensor& t, const char* op, const char* name) {
  return require(ctx, dense_problem(t, op, name));
}

#endif // USE_ATEN_LIB

} // namespace contract
} // namespace native
} // namespace custom
