// Checked unboxing, for both ways a kernel is registered with the ExecuTorch runtime: a program is untrusted input,
// and unboxing its values (EValue::to<T>(), toTensor()) aborts the process on a value of the wrong type, or reads past
// the argument list when the program passes too few. arguments_match() checks a kernel call's values against the
// types the kernel takes before any is unboxed, and fails the call with InvalidArgument and one line naming the op and
// the argument.
//   - codegen (custom_ops.yaml): register_table (registration_prelude.h) puts every generated kernel behind a call
//     over its schema's types, which codegen/run_codegen.py writes into the generated RegistrationTables.h.
//   - EXECUTORCH_LIBRARY_CHECKED(ns, "op.out", kernel): upstream's EXECUTORCH_LIBRARY (extension/kernel_util), the
//     types read from the kernel function's C++ parameters.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include <executorch/extension/kernel_util/make_boxed_from_unboxed_functor.h>
#include <executorch/runtime/core/evalue.h>
#include <executorch/runtime/core/span.h>
#include <executorch/runtime/core/tag.h>
#include <executorch/runtime/kernel/kernel_runtime_context.h>
#include <executorch/runtime/kernel/operator_registry.h>
#include <executorch/runtime/platform/log.h>

namespace custom_ops {
namespace checked_unboxing {

using ::executorch::runtime::EValue;
using ::executorch::runtime::KernelRuntimeContext;
using ::executorch::runtime::Span;
using ::executorch::runtime::Tag;

struct Argument {
  const char* name;  // the schema's argument name (nullptr where only the C++ type is known)
  uint32_t tags;     // one bit per accepted Tag
  const char* type;  // the type the kernel takes, for the message
};

constexpr uint32_t bit(Tag tag) {
  return 1u << static_cast<uint32_t>(tag);
}

inline const char* tag_name(Tag tag) {
  switch (tag) {
#define CUSTOM_OPS_TAG_NAME(x) \
  case Tag::x:                 \
    return #x;
    EXECUTORCH_FORALL_TAGS(CUSTOM_OPS_TAG_NAME)
#undef CUSTOM_OPS_TAG_NAME
    default:
      return "an invalid tag";
  }
}

// stack_size: the values a call passes, the arguments plus the result (one value, a list for a tuple of outputs).
inline bool arguments_match(
    KernelRuntimeContext& context,
    const char* op,
    Span<EValue*> stack,
    const Argument* arguments,
    size_t num_arguments,
    size_t stack_size) {
  if (stack.size() != stack_size) {
    ET_LOG(Error, "%s: the program passes %zu values, the kernel takes %zu arguments plus the result; the program "
           "does not match the op's schema", op, stack.size(), stack_size - 1);
    context.fail(::executorch::runtime::Error::InvalidArgument);
    return false;
  }
  for (size_t i = 0; i < num_arguments; ++i) {
    const EValue* value = stack[i];
    const auto tag = value == nullptr ? 32u : static_cast<uint32_t>(value->tag);
    if (tag >= 32 || (arguments[i].tags & (1u << tag)) == 0) {
      ET_LOG(Error, "%s: argument %zu%s%s%s is %s where the kernel takes %s; the program does not match the op's "
             "schema", op, i, arguments[i].name != nullptr ? " (" : "",
             arguments[i].name != nullptr ? arguments[i].name : "", arguments[i].name != nullptr ? ")" : "",
             value == nullptr ? "missing" : tag_name(value->tag), arguments[i].type);
      context.fail(::executorch::runtime::Error::InvalidArgument);
      return false;
    }
  }
  return true;
}

// The tags a kernel parameter of C++ type T accepts (the types EXECUTORCH_LIBRARY can unbox).
template <class T>
struct TagsOf {
  static_assert(sizeof(T) == 0, "EXECUTORCH_LIBRARY_CHECKED: no EValue tag is known for this kernel parameter type");
};
#define CUSTOM_OPS_TAGS_OF(cpp_type, schema_type, tag_bits) \
  template <>                                                \
  struct TagsOf<cpp_type> {                                  \
    static constexpr uint32_t tags = tag_bits;               \
    static constexpr const char* type = schema_type;         \
  }
CUSTOM_OPS_TAGS_OF(::executorch::aten::Tensor, "Tensor", bit(Tag::Tensor));
CUSTOM_OPS_TAGS_OF(int64_t, "int", bit(Tag::Int));
CUSTOM_OPS_TAGS_OF(double, "float", bit(Tag::Double));
CUSTOM_OPS_TAGS_OF(bool, "bool", bit(Tag::Bool));
CUSTOM_OPS_TAGS_OF(::executorch::aten::ScalarType, "ScalarType", bit(Tag::Int));
CUSTOM_OPS_TAGS_OF(::executorch::aten::Scalar, "Scalar", bit(Tag::Int) | bit(Tag::Double) | bit(Tag::Bool));
CUSTOM_OPS_TAGS_OF(std::string_view, "str", bit(Tag::String));
CUSTOM_OPS_TAGS_OF(::executorch::aten::ArrayRef<int64_t>, "int[]", bit(Tag::ListInt));
CUSTOM_OPS_TAGS_OF(::executorch::aten::ArrayRef<double>, "float[]", bit(Tag::ListDouble));
CUSTOM_OPS_TAGS_OF(::executorch::aten::ArrayRef<bool>, "bool[]", bit(Tag::ListBool));
CUSTOM_OPS_TAGS_OF(::executorch::aten::ArrayRef<::executorch::aten::Tensor>, "Tensor[]", bit(Tag::ListTensor));
CUSTOM_OPS_TAGS_OF(::executorch::aten::ArrayRef<std::optional<::executorch::aten::Tensor>>, "Tensor?[]",
                   bit(Tag::ListOptionalTensor));
#undef CUSTOM_OPS_TAGS_OF
template <class T>
struct TagsOf<std::optional<T>> {
  static constexpr uint32_t tags = TagsOf<T>::tags | bit(Tag::None);
  static constexpr const char* type = "optional";
};

template <class T>
using Bare = std::remove_cv_t<std::remove_reference_t<T>>;

template <class ParameterList>
struct ArgumentsOf;
template <class... Parameters>
struct ArgumentsOf<::executorch::extension::kernel_util_internal::typelist<Parameters...>> {
  static constexpr size_t count = sizeof...(Parameters);
  static constexpr Argument list[count == 0 ? 1 : count] = {
      Argument{nullptr, TagsOf<Bare<Parameters>>::tags, TagsOf<Bare<Parameters>>::type}...};
};

// upstream's boxed kernel, behind arguments_match() over the kernel function's parameters. (FunctionPointer's name
// is the kernel's profiling event, "native_call_<op>" as codegen's kernels name theirs; kOpName names it in messages.)
template <class FunctionPointer, const char* kOpName>
struct CheckedBoxedKernel {
  using Upstream = ::executorch::extension::WrapUnboxedIntoFunctor<FunctionPointer>;
  using Arguments = ArgumentsOf<typename Upstream::ContextRemovedArgsType>;

  static void call(KernelRuntimeContext& context, Span<EValue*> stack) {
    if (arguments_match(context, kOpName, stack, Arguments::list, Arguments::count, Arguments::count + 1)) {
      Upstream::call(context, stack);
    }
  }
};

// CheckedBoxedKernel for an out variant whose schema gained `kAdded` optional arguments (default None) just before
// `out`: a program exported before then passes that many values fewer, and runs as if it passed None for each. Every
// other count is checked as CheckedBoxedKernel checks it. kAdded 0: CheckedBoxedKernel itself.
template <class FunctionPointer, const char* kOpName, size_t kAdded>
struct CheckedBoxedKernelOfAnOlderSchemaToo {
  using Checked = CheckedBoxedKernel<FunctionPointer, kOpName>;
  static constexpr size_t kValues = Checked::Arguments::count + 1;  // the arguments, out among them, and the result

  static void call(KernelRuntimeContext& context, Span<EValue*> stack) {
    static_assert(kAdded == 0 || kAdded + 2 <= kValues, "the added arguments come before out and the result");
    if (kAdded == 0 || stack.size() + kAdded != kValues) {
      Checked::call(context, stack);
      return;
    }
    EValue none;
    EValue* values[kValues];
    const size_t before = kValues - kAdded - 2;  // the arguments before the added ones
    for (size_t i = 0; i < kValues; ++i) {
      values[i] = i < before ? stack[i] : i < before + kAdded ? &none : stack[i - kAdded];
    }
    Checked::call(context, Span<EValue*>(values, kValues));
  }
};

} // namespace checked_unboxing
} // namespace custom_ops

// EXECUTORCH_LIBRARY(ns, "op.out", kernel) with checked unboxing: registers `kernel` as ns::op.out when the library
// loads, no custom_ops.yaml entry and no codegen (so no selective build of it: linking its source registers it).
#define EXECUTORCH_LIBRARY_CHECKED(ns, op_name, func) EXECUTORCH_LIBRARY_CHECKED_ADDED(ns, op_name, func, 0)
// The same for an out variant that gained `added` optional arguments just before `out`: programs of the older schema
// keep running (CheckedBoxedKernelOfAnOlderSchemaToo).
#define EXECUTORCH_LIBRARY_CHECKED_ADDED(ns, op_name, func, added) \
  CUSTOM_OPS_LIBRARY_CHECKED_IMPL(ns, op_name, func, added, __LINE__)
#define CUSTOM_OPS_LIBRARY_CHECKED_IMPL(ns, op_name, func, added, uid) \
  CUSTOM_OPS_LIBRARY_CHECKED_IMPL2(ns, op_name, func, added, uid)
#define CUSTOM_OPS_LIBRARY_CHECKED_IMPL2(ns, op_name, func, added, uid)                                              \
  static constexpr const char custom_ops_op_name_##uid[] = #ns "::" op_name;                                           \
  static constexpr const char custom_ops_event_name_##uid[] = "native_call_" op_name;                                  \
  static const auto custom_ops_registration_##uid = ::executorch::runtime::register_kernel(                           \
      ::executorch::runtime::Kernel(custom_ops_op_name_##uid,                                                          \
                                    ::custom_ops::checked_unboxing::CheckedBoxedKernelOfAnOlderSchemaToo<              \
                                        EXECUTORCH_FN_TYPE(func, custom_ops_event_name_##uid),                         \
                                        custom_ops_op_name_##uid, added>::call))
