// What codegen's registration sources include around the kernels it writes (codegen/templates/: registered from a
// static initializer, RegisterCodegenUnboxedKernels.cpp, or when the application calls register_all_kernels(),
// RegisterKernels.cpp): ExecuTorch's kernel types, and register_table, which registers each generated kernel behind a
// check of its call's values against the op's schema (checked unboxing: a program is untrusted input).
#pragma once

#include <executorch/runtime/core/evalue.h>
#include <executorch/runtime/core/event_tracer_hooks.h>
#include <executorch/runtime/core/exec_aten/exec_aten.h>
#include <executorch/runtime/core/exec_aten/util/tensor_util.h>
#include <executorch/runtime/core/span.h>
#include <executorch/runtime/core/tag.h>
#include <executorch/runtime/kernel/operator_registry.h>
#include <executorch/runtime/platform/log.h>
#include <executorch/runtime/platform/profiler.h>

#include "kernel_helpers/checked_unboxing.h"

#include <cstddef>
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <utility>

// 0 until the kernels are registered, 1 by a static initializer, 2 by register_all_kernels(), -1 when registering
// failed. The generated source defines it; a runner reads it through a weak reference (runner/program_runner.cpp).
extern "C" int custom_ops_kernels_registered;

// The generated source's kernels that replace ExecuTorch's own (declared replaces_executorch; RegistrationTables.h names
// them): register_table keeps them out of the global registry, where a second kernel of a name stops ExecuTorch, and
// a runner puts them in the kernel list it passes to Program::load_method, which is searched before the global
// registry. Sets *kernels and returns how many; the generated source defines it, a runner reads it through a weak
// reference.
extern "C" size_t custom_ops_method_kernels(const ::executorch::runtime::Kernel** kernels);

// Every declared op whose kernel replaces ExecuTorch's (selected here or not), null-terminated: a runner says when
// ExecuTorch's own kernel runs for one because this library was built without it.
extern "C" const char* const* custom_ops_declared_replacing();

// For a process that cannot load a method with method-scoped kernels (ExecuTorch's pybindings): registers the method
// kernel `name` in the global registry under one specialized kernel key ("v1/6;0,1|6;0,1": each tensor argument's
// dtype and dim order, as Method builds it when it resolves a call), which ExecuTorch prefers to the fallback kernel
// its own library registers under the name. 0 registered (or already), 1 no method kernel of that name, -1 failed.
extern "C" int custom_ops_register_keyed(const char* name, const char* key);

namespace custom_ops {

inline bool named_in(const char* name, const char* const* names) {
  for (; *names != nullptr; ++names) {
    if (std::strcmp(name, *names) == 0) {
      return true;
    }
  }
  return false;
}

// One op's argument types, from its schema: codegen/run_codegen.py writes a table of them, one per kernel it binds,
// into RegistrationTables.h (kArgumentLists, ended by a null op). A call passes `count` values and its result.
struct ArgumentList {
  const char* op;
  const checked_unboxing::Argument* arguments;
  size_t count;
};

// A generated table's kernels behind their checks: register_table replaces kernel I's function with call<I>, which
// checks the call against the op's argument list before the generated function, kept in `generated`, unboxes any
// value. The state is filled when the table registers, so the table itself stays constant-initialized (no static
// initializer: firmware registering by a call has none). `Table` is a type of the generated source's own, so each
// table has its own state.
template <class Table, size_t N>
struct CheckedCalls {
  static inline ::executorch::runtime::OpFunction generated[N];
  static inline const ArgumentList* lists[N];

  template <size_t I>
  static void call(::executorch::runtime::KernelRuntimeContext& context,
                   ::executorch::runtime::Span<::executorch::runtime::EValue*> stack) {
    const ArgumentList& list = *lists[I];
    if (checked_unboxing::arguments_match(context, list.op, stack, list.arguments, list.count, list.count + 1)) {
      generated[I](context, stack);
    }
  }

  template <size_t... I>
  static constexpr const ::executorch::runtime::OpFunction* calls(std::index_sequence<I...>) {
    return table<I...>;
  }

 private:
  template <size_t... I>
  static constexpr ::executorch::runtime::OpFunction table[] = {&call<I>...};
};

inline const ArgumentList* argument_list(const ArgumentList* lists, const char* op) {
  for (; lists->op != nullptr; ++lists) {
    if (std::strcmp(lists->op, op) == 0) {
      return lists;
    }
  }
  return nullptr;
}

// Registers a generated table of kernels, each behind its argument check (CheckedCalls), but for those named in
// `replacing` (null-terminated), which it moves to `method_kernels` (`method_count` of them), and records how
// (`registered_as`: 1 or 2) in custom_ops_kernels_registered. A kernel without an argument list registers nothing.
template <class Table, size_t N>
::executorch::runtime::Error register_table(const ::executorch::runtime::Kernel (&kernels)[N],
                                            const ArgumentList* argument_lists, const char* const* replacing,
                                            ::executorch::runtime::Kernel (&method_kernels)[N], size_t& method_count,
                                            int registered_as) {
  using ::executorch::runtime::Kernel;
  using Checked = CheckedCalls<Table, N>;
  const ::executorch::runtime::OpFunction* checked = Checked::calls(std::make_index_sequence<N>());
  static Kernel global[N];  // the registry copies what it registers; static all the same, as the table is
  size_t global_count = 0;
  method_count = 0;
  for (size_t i = 0; i < N; ++i) {
    Checked::lists[i] = argument_list(argument_lists, kernels[i].name_);
    if (Checked::lists[i] == nullptr) {
      ET_LOG(Error, "%s: RegistrationTables.h has no argument list for this kernel; regenerate the build's codegen "
             "(codegen/run_codegen.py)", kernels[i].name_);
      custom_ops_kernels_registered = -1;
      return ::executorch::runtime::Error::Internal;
    }
    Checked::generated[i] = kernels[i].op_;
    Kernel kernel = kernels[i];
    kernel.op_ = checked[i];
    if (named_in(kernel.name_, replacing)) {
      method_kernels[method_count++] = kernel;
    } else {
      global[global_count++] = kernel;
    }
  }
  const auto status =
      ::executorch::runtime::register_kernels(::executorch::runtime::Span<const Kernel>(global, global_count));
  custom_ops_kernels_registered = status == ::executorch::runtime::Error::Ok ? registered_as : -1;
  return status;
}

// custom_ops_register_keyed's body: each (name, key) registered once, the key's text kept for the registry's lifetime.
inline int register_keyed(const ::executorch::runtime::Kernel* kernels, size_t count, const char* name,
                          const char* key) {
  using ::executorch::runtime::Kernel;
  const Kernel* kernel = nullptr;
  for (size_t i = 0; i < count && kernel == nullptr; ++i) {
    kernel = std::strcmp(kernels[i].name_, name) == 0 ? &kernels[i] : nullptr;
  }
  if (kernel == nullptr) {
    return 1;
  }
  static std::mutex mutex;
  static std::set<std::string> registered;
  const std::lock_guard<std::mutex> lock(mutex);
  std::string entry = std::string(name) + '\0' + key;
  if (registered.count(entry) != 0) {
    return 0;
  }
  const char* kept = (new std::string(key))->c_str();  // the registry keeps the pointer, not the text
  const Kernel keyed(kernel->name_, ::executorch::runtime::KernelKey(kept), kernel->op_);
  if (::executorch::runtime::register_kernels(::executorch::runtime::Span<const Kernel>(&keyed, 1)) !=
      ::executorch::runtime::Error::Ok) {
    return -1;
  }
  registered.insert(std::move(entry));
  return 0;
}

}  // namespace custom_ops

// The entry points above that the replacing kernels need, defined by the generated source over its table of them.
#define CUSTOM_OPS_REPLACING_KERNELS_ENTRY_POINTS(method_kernels, method_kernel_count)                                 \
  extern "C" __attribute__((visibility("default"))) size_t custom_ops_method_kernels(                                 \
      const ::executorch::runtime::Kernel** kernels) {                                                               \
    *kernels = method_kernels;                                                                                       \
    return method_kernel_count;                                                                                      \
  }                                                                                                                  \
  extern "C" __attribute__((visibility("default"))) const char* const* custom_ops_declared_replacing() {             \
    return ::custom_ops::kDeclaredReplacing;                                                                         \
  }                                                                                                                  \
  extern "C" __attribute__((visibility("default"))) int custom_ops_register_keyed(const char* name, const char* key) { \
    return ::custom_ops::register_keyed(method_kernels, method_kernel_count, name, key);                             \
  }
