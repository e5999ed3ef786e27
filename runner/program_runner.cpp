// See program_runner.h. Order matters here: nothing the program declares is allocated or dereferenced before it has
// been checked (verification, then MethodMeta's checked accessors, then the memory budget).
#include "program_runner.h"

#include "data_file.h"
#include "greedy_decoding.h"
#include "kernel_calls.h"
#include "xnnpack_payload.h"

#include <executorch/devtools/etdump/etdump_flatcc.h>

#include <executorch/extension/flat_tensor/flat_tensor_data_map.h>
#include <executorch/extension/memory_allocator/malloc_memory_allocator.h>
#include <executorch/extension/tensor/tensor.h>
#include <executorch/runtime/core/exec_aten/util/scalar_type_util.h>
#include <executorch/runtime/backend/interface.h>
#include <executorch/runtime/core/hierarchical_allocator.h>
#include <executorch/runtime/executor/method.h>
#include <executorch/runtime/kernel/operator_registry.h>
#include <executorch/runtime/platform/platform.h>
#include <executorch/runtime/platform/runtime.h>

#include <algorithm>
#include <cmath>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <set>
#include <sstream>
#include <type_traits>
#include <utility>
#include <vector>

namespace custom_ops_runner {
namespace {

using executorch::aten::DimOrderType;
using executorch::aten::ScalarType;

// A dtype as PyTorch and the kernels' errors name it (float32, not Float), like --input_specs; ExecuTorch's name for
// the others.
const char* dtype_text(ScalarType dtype) {
  static const std::pair<ScalarType, const char*> kNames[] = {
      {ScalarType::Float, "float32"}, {ScalarType::Double, "float64"}, {ScalarType::Half, "float16"},
      {ScalarType::BFloat16, "bfloat16"}, {ScalarType::Byte, "uint8"}, {ScalarType::Char, "int8"},
      {ScalarType::Short, "int16"}, {ScalarType::Int, "int32"}, {ScalarType::Long, "int64"}, {ScalarType::Bool, "bool"}};
  for (const auto& [type, name] : kNames) {
    if (type == dtype) {
      return name;
    }
  }
  return executorch::runtime::toString(dtype);
}
using executorch::aten::SizesType;
using executorch::aten::Tensor;
using executorch::extension::TensorPtr;
using executorch::runtime::Program;
using executorch::runtime::Error;
using executorch::runtime::EValue;
using executorch::runtime::MethodMeta;
using executorch::runtime::Span;

bool g_quiet = false;

int fail(const std::string& message) {
  if (!g_quiet) {
    std::fprintf(stderr, "error: %s\n", message.c_str());
  }
  return 1;
}

// ---- ExecuTorch's log: printed, and the details the final error line repeats remembered ---------------------------
struct LogDetails {
  std::set<std::string> missing_operators;
  std::set<std::string> missing_backends;
  std::vector<std::string> errors;
};
LogDetails g_log;
std::string g_program_name = "<no program>";
bool g_print_log = true;

// What `text` holds between `prefix` at its start and `suffix` at its end, or "".
std::string between(const std::string& text, const std::string& prefix, const std::string& suffix) {
  if (text.size() <= prefix.size() + suffix.size() || text.compare(0, prefix.size(), prefix) != 0 ||
      text.compare(text.size() - suffix.size(), suffix.size(), suffix) != 0) {
    return "";
  }
  return text.substr(prefix.size(), text.size() - prefix.size() - suffix.size());
}

void log_hook(
    et_timestamp_t /*timestamp*/,
    et_pal_log_level_t level,
    const char* filename,
    const char* /*function*/,
    size_t line,
    const char* message,
    size_t length) {
  std::string text(message, length);
  while (!text.empty() && text.back() == '\n') {
    text.pop_back();
  }
  // A corrupt program can put raw bytes into messages (e.g. its file identifier); keep the output printable.
  for (char& c : text) {
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) {
      c = '?';
    }
  }
  const char* base = std::strrchr(filename, '/');
  if (g_print_log) {
    std::fprintf(stderr, "[%c %s:%zu] %s\n", static_cast<char>(level), base ? base + 1 : filename, line, text.c_str());
  }
  constexpr const char kMissing[] = "Missing operator: ";
  if (auto pos = text.find(kMissing); pos != std::string::npos) {
    std::string rest = text.substr(pos + sizeof(kMissing) - 1);  // "[3] my_ops::mul4.out"
    const size_t name = rest.find("] ");
    rest = name == std::string::npos ? rest : rest.substr(name + 2);
    g_log.missing_operators.insert(rest.empty() ? "(an operator with no name)" : rest);
  } else if (const std::string backend = between(text, "Backend ", " is not registered."); !backend.empty()) {
    g_log.missing_backends.insert(backend);  // the runtime's line for a delegate whose backend is not linked
  } else if (level == kError && g_log.errors.size() < 8) {
    g_log.errors.push_back(text);
  }
}

std::string joined(const std::set<std::string>& names) {
  std::string text;
  for (const auto& name : names) {
    text += (text.empty() ? "" : ", ") + name;
  }
  return text;
}

std::string logged_errors() {
  std::string joined;
  for (const auto& e : g_log.errors) {
    joined += "\n  " + e;
  }
  return joined.empty() ? "" : "; ExecuTorch reported:" + joined;
}

[[noreturn]] void stop_on_internal_check(const char* what) {
  std::fprintf(stderr, "error: '%s' is corrupt or unsupported: %s%s\n", g_program_name.c_str(), what,
               logged_errors().c_str());
  std::fflush(stderr);
  std::_Exit(1);
}

[[noreturn]] void abort_hook() {
  stop_on_internal_check("ExecuTorch stopped on a failed internal check (ET_CHECK) while using it");
}

// The kernel library's registration defines this (codegen/templates/): absent from the binary when the linker dropped
// it, 0 while a library generated with --manual_registration waits for its call, 1 registered by a static
// initializer, 2 by that call, -1 failed.
extern "C" __attribute__((weak)) int custom_ops_kernels_registered;

// The kernel library's kernels that replace ExecuTorch's own (declared replaces_executorch), kept out of the global
// registry: absent from the binary when the linker dropped the registration.
extern "C" __attribute__((weak)) size_t custom_ops_method_kernels(const executorch::runtime::Kernel** kernels);

executorch::runtime::Span<const executorch::runtime::Kernel> replacing_kernels() {
  const executorch::runtime::Kernel* kernels = nullptr;
  const size_t count = &custom_ops_method_kernels != nullptr ? custom_ops_method_kernels(&kernels) : 0;
  return {kernels, count};
}

extern "C" __attribute__((weak)) const char* const* custom_ops_declared_replacing();

// The program's operators that a declaration says the project's kernel replaces, where the linked library holds no
// such kernel: ExecuTorch's own runs for them.
std::vector<std::string> executorchs_in_place_of_declared(const std::vector<std::string>& operators) {
  std::vector<std::string> found;
  if (&custom_ops_declared_replacing == nullptr) {
    return found;
  }
  const auto replacing = replacing_kernels();
  for (const char* const* declared = custom_ops_declared_replacing(); *declared != nullptr; ++declared) {
    const bool called = std::find(operators.begin(), operators.end(), *declared) != operators.end();
    const bool held = std::any_of(replacing.begin(), replacing.end(), [&](const executorch::runtime::Kernel& k) {
      return std::strcmp(k.name_, *declared) == 0;
    });
    if (called && !held) {
      found.emplace_back(*declared);
    }
  }
  return found;
}

// The kernel list each method is loaded with (its method-scoped registry, which ExecuTorch looks up before the global
// one): the global registry with the replaced names' kernels swapped for the library's. Whole, because ExecuTorch logs
// an error for each operator a method-scoped list lacks before it falls back, and a load that logs an error is one
// this runner refuses. Empty (the global registry alone) when nothing is replaced.
std::vector<executorch::runtime::Kernel> method_kernel_list() {
  std::vector<executorch::runtime::Kernel> list;
  const auto replacing = replacing_kernels();
  if (replacing.size() == 0) {
    return list;
  }
  const auto replaced = [&](const char* name) {
    return std::any_of(replacing.begin(), replacing.end(),
                       [&](const executorch::runtime::Kernel& k) { return std::strcmp(k.name_, name) == 0; });
  };
  for (const auto& kernel : executorch::runtime::get_registered_kernels()) {
    if (!replaced(kernel.name_)) {
      list.push_back(kernel);
    }
  }
  list.insert(list.end(), replacing.begin(), replacing.end());
  return list;
}

// Why this binary has none of the project's kernels registered, or "" when it has them (then a missing op is one the
// library does not hold). The two link steps a static archive needs (docs/adding-an-op.md).
std::string unregistered_kernel_library() {
  if (&custom_ops_kernels_registered == nullptr) {
    return "This binary holds no registration of the project's kernel library: linked as a static archive, the "
           "registration's object is referenced by nothing and the linker drops it. Link the archive whole (CMake: "
           "$<LINK_LIBRARY:WHOLE_ARCHIVE,custom_ops_kernels>; Buck2: link_whole = True; ld: -Wl,--whole-archive), or "
           "generate it with --manual_registration and call torch::executor::register_all_kernels()";
  }
  if (custom_ops_kernels_registered < 0) {
    return "Registering the project's kernel library failed when it was loaded: an operator it holds was registered "
           "already (two kernel libraries holding the same op in one process?), or the registry is full";
  }
  if (custom_ops_kernels_registered == 0) {
    return "The project's kernel library is linked but registered nothing: it was generated with "
           "--manual_registration, so call torch::executor::register_all_kernels() (RegisterKernels.h) once before "
           "loading a program, and check that it returns Error::Ok";
  }
  if (custom_ops_kernels_registered == 2) {
    return "The project's kernel library registers by register_all_kernels() (--manual_registration), which holds the "
           "ops codegen binds in custom_ops.yaml; an op whose own source registers it (EXECUTORCH_LIBRARY, "
           "runtime_registration \"executorch_library\" in custom_ops.bzl) does so from a static initializer, which "
           "runs only when its object is linked: link the archive whole, or bind the op in custom_ops.yaml. Otherwise "
           "add the op to the selected root ops (CMake -DCUSTOM_OPS_ROOT_OPS) and rebuild";
  }
  return "";
}

// What to do about the operators no linked kernel library registers, by kind: an op of this project's namespaces
// (select it and rebuild), one ExecuTorch's kernels have (link that library), one nobody ships (write a kernel, or
// keep it out of the program). flow/runtime_kernels.py words the same kinds for the Python runtime.
std::string missing_operator_advice(const std::set<std::string>& names) {
  std::set<std::string> project, executorch, nobody;
  for (const auto& name : names) {
    (executorch_ships_kernel(name) ? executorch : in_runtime_namespace(name) ? nobody : project).insert(name);
  }
  std::string advice;
  const auto add = [&](const std::set<std::string>& kind, const char* what) {
    if (!kind.empty()) {
      advice += (advice.empty() ? "" : "; ") + joined(kind) + ": " + what;
    }
  };
  add(project, "an op of this project's: add it to the selected root ops (CMake -DCUSTOM_OPS_ROOT_OPS, "
               "-DCUSTOM_OPS_MODEL_FILE or REGISTER_EXAMPLE_CUSTOM_OP), bind it to a kernel in custom_ops.yaml, and "
               "rebuild");
  add(executorch, "ExecuTorch's kernels have it: link the library that does (ATen ops and prims: "
                  "executorch::kernels_optimized; quantized_decomposed::*: executorch::kernels_quantized)");
  add(nobody, "no kernel library ExecuTorch ships has it: write one (docs/adding-an-op.md, \"A kernel for an ATen op "
              "ExecuTorch lacks\"; one custom_ops.bzl declares already: select it and rebuild), or keep it out of the "
              "program with a decomposition at export");
  return advice.empty() ? "See the log above" : advice;
}

std::string describe(Error error) {
  char code[16];
  std::snprintf(code, sizeof(code), "0x%x", static_cast<unsigned>(error));
  return std::string(executorch::runtime::to_string(error)) + " (" + code + ")";
}

template <typename T>
std::string list_string(executorch::aten::ArrayRef<T> values) {
  std::string s = "[";
  for (size_t i = 0; i < values.size(); ++i) {
    s += (i ? ", " : "") + std::to_string(values[i]);
  }
  return s + "]";
}

// ---- Pre-flight: every size the program declares, checked before anything is allocated ---------------------------
// bytes = product(sizes) * element size, or nullopt on a negative size or overflow.
std::optional<uint64_t> tensor_bytes(Span<const SizesType> sizes, ScalarType dtype) {
  if (!executorch::runtime::isValid(dtype)) {
    return std::nullopt;
  }
  uint64_t bytes = executorch::runtime::elementSize(dtype);
  for (SizesType s : sizes) {
    if (s < 0 || __builtin_mul_overflow(bytes, static_cast<uint64_t>(s), &bytes)) {
      return std::nullopt;
    }
  }
  return bytes;
}

bool is_permutation(Span<const uint8_t> dim_order) {
  std::vector<bool> seen(dim_order.size(), false);
  for (uint8_t d : dim_order) {
    if (d >= dim_order.size() || seen[d]) {
      return false;
    }
    seen[d] = true;
  }
  return true;
}

std::string budget_hint(uint64_t needed, uint64_t budget) {
  return std::to_string(needed) + " bytes, more than --max_memory=" + std::to_string(budget) +
      "; raise --max_memory if you trust this program";
}

// Checks the method's planned buffers, inputs and outputs through MethodMeta's checked accessors (an output whose
// value index is out of range would otherwise abort in Method::get_outputs). Returns an error message or nothing;
// `planned_sizes` receives the buffer sizes.
std::optional<std::string> preflight(const MethodMeta& meta, const RunOptions& options,
                                     std::vector<size_t>& planned_sizes, uint64_t& planned_total) {
  uint64_t total = 0;
  for (size_t i = 0; i < meta.num_memory_planned_buffers(); ++i) {
    auto size = meta.memory_planned_buffer_size(i);
    if (!size.ok() || *size < 0) {
      return "memory-planned buffer " + std::to_string(i) + " has no valid size";
    }
    if (__builtin_add_overflow(total, static_cast<uint64_t>(*size), &total) || total > options.max_memory) {
      return "the method's memory-planned buffers need at least " + budget_hint(total, options.max_memory);
    }
    planned_sizes.push_back(static_cast<size_t>(*size));
  }
  planned_total = total;
  for (size_t i = 0; i < meta.num_inputs(); ++i) {
    auto tag = meta.input_tag(i);
    if (!tag.ok()) {
      return "input " + std::to_string(i) + " has unreadable metadata: " + describe(tag.error());
    }
    if (*tag != executorch::runtime::Tag::Tensor) {
      continue;  // reported when inputs are prepared: this runner feeds tensors only
    }
    auto info = meta.input_tensor_meta(i);
    if (!info.ok() || !is_permutation(info->dim_order()) || info->dim_order().size() != info->sizes().size()) {
      return "input " + std::to_string(i) + " has invalid tensor metadata (sizes, dim order or dtype)";
    }
    auto bytes = tensor_bytes(info->sizes(), info->scalar_type());
    if (!bytes || __builtin_add_overflow(total, *bytes, &total) || total > options.max_memory) {
      return "the method's buffers and inputs need at least " + budget_hint(bytes ? total : UINT64_MAX,
                                                                            options.max_memory);
    }
  }
  for (size_t i = 0; i < meta.num_outputs(); ++i) {
    auto tag = meta.output_tag(i);
    if (!tag.ok()) {
      return "output " + std::to_string(i) + " refers to no valid value: " + describe(tag.error()) + logged_errors();
    }
    if (*tag == executorch::runtime::Tag::Tensor) {
      auto info = meta.output_tensor_meta(i);
      if (!info.ok() || !is_permutation(info->dim_order()) ||
          !tensor_bytes(info->sizes(), info->scalar_type())) {
        return "output " + std::to_string(i) + " has invalid tensor metadata (sizes, dim order or dtype)";
      }
    }
  }
  return std::nullopt;
}

// Planned memory allocated here, checked and zeroed, instead of by Module (whose std::vector throws bad_alloc).
struct PlannedMemory {
  std::vector<std::unique_ptr<uint8_t, decltype(&std::free)>> buffers;
  std::vector<Span<uint8_t>> spans;
  std::unique_ptr<executorch::runtime::HierarchicalAllocator> allocator;
};

std::optional<std::string> allocate_planned_memory(const std::vector<size_t>& sizes, PlannedMemory& memory) {
  for (size_t i = 0; i < sizes.size(); ++i) {
    // On a cache line, as the exporter plans tensors (my_ops.hf: 64 bytes), so that a kernel's 64-byte loads of a KV
    // cache or an activation each touch one line; zeroed: a never-written planned tensor reads as zeros, not as
    // whatever the allocator left.
    constexpr size_t kCacheLine = 64;
    const size_t rounded = (sizes[i] + kCacheLine - 1) / kCacheLine * kCacheLine;
    auto* data = static_cast<uint8_t*>(rounded ? std::aligned_alloc(kCacheLine, rounded) : nullptr);
    if (sizes[i] != 0 && data == nullptr) {
      return "cannot allocate memory-planned buffer " + std::to_string(i) + " (" + std::to_string(sizes[i]) +
          " bytes)";
    }
    if (data != nullptr) {
      std::memset(data, 0, rounded);
    }
    memory.buffers.emplace_back(data, &std::free);
    memory.spans.emplace_back(data, sizes[i]);
  }
  memory.allocator = std::make_unique<executorch::runtime::HierarchicalAllocator>(
      Span<Span<uint8_t>>(memory.spans.data(), memory.spans.size()));
  return std::nullopt;
}

// ---- Inputs ---------------------------------------------------------------------------------------------------------
// An input tensor's bytes, 64-byte aligned so vectorized kernels see the alignment a planned buffer would have.
struct InputBuffer {
  std::unique_ptr<void, decltype(&std::free)> data{nullptr, &std::free};
  TensorPtr tensor;
};

std::optional<std::string> read_file(const std::string& path, size_t expected_bytes, void* destination) {
  std::ifstream file(path, std::ios::binary | std::ios::ate);
  if (!file) {
    return "cannot open input file '" + path + "'";
  }
  const auto actual = static_cast<uint64_t>(file.tellg());
  if (actual != expected_bytes) {
    return "input file '" + path + "' has " + std::to_string(actual) + " bytes, expected " +
        std::to_string(expected_bytes);
  }
  file.seekg(0);
  file.read(static_cast<char*>(destination), static_cast<std::streamsize>(expected_bytes));
  return file ? std::nullopt : std::optional<std::string>("failed reading input file '" + path + "'");
}

// Returns false for a dtype the runner cannot synthesize values for.
bool fill_with_ones(ScalarType dtype, void* data, size_t numel) {
  switch (dtype) {
#define FILL_CASE(ctype, name)                                            \
  case ScalarType::name:                                                  \
    std::fill_n(static_cast<ctype*>(data), numel, static_cast<ctype>(1)); \
    return true;
    ET_FORALL_REAL_TYPES_AND3(Half, BFloat16, Bool, FILL_CASE)
#undef FILL_CASE
    default:
      return false;
  }
}

// The inputs of one execution, from one --inputs list (or ones when it is empty). `total` starts at the planned
// memory's size: planned buffers plus every execution's inputs stay within --max_memory.
std::optional<std::string> prepare_input_group(const RunOptions& options, const MethodMeta& meta,
                                               const std::vector<std::string>& files, uint64_t& total,
                                               std::vector<InputBuffer>& buffers, std::vector<EValue>& values) {
  const size_t count = meta.num_inputs();
  if (!files.empty() && files.size() != count) {
    return "--inputs names " + std::to_string(files.size()) + " file(s) but method '" + options.method +
        "' takes " + std::to_string(count) + " input(s)";
  }
  if (options.input_shapes && options.input_shapes->size() != count) {
    return "--input_shapes gives " + std::to_string(options.input_shapes->size()) + " shape(s) but method '" +
        options.method + "' takes " + std::to_string(count) + " input(s)";
  }
  for (size_t i = 0; i < count; ++i) {
    auto tag = meta.input_tag(i);
    if (!tag.ok() || *tag != executorch::runtime::Tag::Tensor) {
      return "input " + std::to_string(i) + " of method '" + options.method +
          "' is not a tensor; this runner feeds tensor inputs only";
    }
    auto info = meta.input_tensor_meta(i);  // checked in preflight()
    std::vector<SizesType> sizes(info->sizes().begin(), info->sizes().end());
    if (options.input_shapes) {
      const std::vector<int32_t>& shape = (*options.input_shapes)[i];
      if (shape.size() != sizes.size()) {
        return "--input_shapes entry " + std::to_string(i + 1) + " has " + std::to_string(shape.size()) +
            " dimension(s) but input " + std::to_string(i) + " of method '" + options.method + "' has " +
            std::to_string(sizes.size());
      }
      sizes.assign(shape.begin(), shape.end());
    }
    const ScalarType dtype = info->scalar_type();
    auto nbytes = tensor_bytes({sizes.data(), sizes.size()}, dtype);
    if (!nbytes || __builtin_add_overflow(total, *nbytes, &total) || total > options.max_memory) {
      return "input " + std::to_string(i) + " of shape " + list_string<SizesType>({sizes.data(), sizes.size()}) +
          " needs " + (nbytes ? budget_hint(*nbytes, options.max_memory) : "more bytes than fit in 64 bits");
    }
    const size_t numel = *nbytes / executorch::runtime::elementSize(dtype);
    InputBuffer buffer;
    buffer.data.reset(std::aligned_alloc(64, std::max<size_t>(64, (*nbytes + 63) / 64 * 64)));
    if (!buffer.data) {
      return "cannot allocate " + std::to_string(*nbytes) + " bytes for input " + std::to_string(i);
    }
    if (!files.empty()) {
      if (auto err = read_file(files[i], *nbytes, buffer.data.get())) {
        return *err + " (method '" + options.method + "' input " + std::to_string(i) + " is " +
            dtype_text(dtype) + list_string<SizesType>({sizes.data(), sizes.size()}) + ")";
      }
    } else if (!fill_with_ones(dtype, buffer.data.get(), numel)) {
      return std::string("input ") + std::to_string(i) + " has dtype " + std::string(dtype_text(dtype)) +
          ", which the runner cannot fill with ones; pass --inputs";
    }
    // In the declared dim order, so the bytes mean what the program expects (channels-last stays channels-last).
    std::vector<DimOrderType> dim_order(info->dim_order().begin(), info->dim_order().end());
    buffer.tensor = executorch::extension::make_tensor_ptr(sizes, buffer.data.get(), dim_order, {}, dtype);
    values.emplace_back(buffer.tensor);
    buffers.push_back(std::move(buffer));
  }
  return std::nullopt;
}

// One EValue list per --inputs flag (one per execution, in turn), or one list of ones.
std::optional<std::string> prepare_inputs(const RunOptions& options, const MethodMeta& meta, uint64_t total,
                                          std::vector<InputBuffer>& buffers,
                                          std::vector<std::vector<EValue>>& groups) {
  const size_t num_groups = std::max<size_t>(1, options.inputs.size());
  groups.assign(num_groups, {});
  for (size_t g = 0; g < num_groups; ++g) {
    static const std::vector<std::string> kNoFiles;
    const std::vector<std::string>& files = options.inputs.empty() ? kNoFiles : options.inputs[g];
    if (auto err = prepare_input_group(options, meta, files, total, buffers, groups[g])) {
      return err;
    }
  }
  return std::nullopt;
}

// ---- Outputs --------------------------------------------------------------------------------------------------------
template <typename T>
void print_values(const Tensor& t, size_t limit) {
  const T* data = t.const_data_ptr<T>();
  for (size_t i = 0; i < std::min<size_t>(limit, t.numel()); ++i) {
    std::printf("%s%g", i ? ", " : "", static_cast<double>(data[i]));
  }
}

void print_output(size_t index, const EValue& value) {
  if (!value.isTensor()) {
    std::printf("Output %zu: (not a tensor, tag %d)\n", index, static_cast<int>(value.tag));
    return;
  }
  const Tensor& t = value.toTensor();
  // The dim order is printed when it is not row-major, so readers of --outputs know the bytes' order.
  bool row_major = true;
  for (size_t d = 0; d < t.dim_order().size(); ++d) {
    row_major = row_major && t.dim_order()[d] == d;
  }
  std::printf("Output %zu: %s%s%s, values: [", index, executorch::runtime::toString(t.scalar_type()),
              list_string(t.sizes()).c_str(), row_major ? "" : (" dim_order=" + list_string(t.dim_order())).c_str());
  constexpr size_t kShown = 8;
  switch (t.scalar_type()) {
#define PRINT_CASE(ctype, name)     \
  case ScalarType::name:            \
    print_values<ctype>(t, kShown); \
    break;
    ET_FORALL_REAL_TYPES_AND3(Half, BFloat16, Bool, PRINT_CASE)
#undef PRINT_CASE
    default:
      std::printf("...");
  }
  std::printf("%s]\n", static_cast<size_t>(t.numel()) > kShown ? ", ..." : "");
}

std::optional<std::string> write_output(const std::string& path, const EValue& value) {
  if (!value.isTensor()) {
    return "output written to '" + path + "' is not a tensor";
  }
  const Tensor& t = value.toTensor();
  std::ofstream file(path, std::ios::binary);
  file.write(static_cast<const char*>(t.const_data_ptr()), static_cast<std::streamsize>(t.nbytes()));
  return file ? std::nullopt : std::optional<std::string>("cannot write output file '" + path + "'");
}

} // namespace

// The kernel library's path counters (kernel_helpers/elementwise_loop.h), absent from a library without them.
extern "C" __attribute__((weak)) int custom_ops_elementwise_stats(uint64_t* counts, int n);

void print_path_counts() {
  constexpr int kAtMost = 64;  // more than the enum holds: the rest stay zero, and the reader takes its own count
  uint64_t counts[kAtMost] = {};
  if (&custom_ops_elementwise_stats == nullptr || custom_ops_elementwise_stats(counts, kAtMost) != 1) {
    return;
  }
  std::fputs("path counts:", stderr);
  for (const uint64_t count : counts) {
    std::fprintf(stderr, " %llu", static_cast<unsigned long long>(count));
  }
  std::fputc('\n', stderr);
}

void print_registered() {
  std::set<std::string> lines;
  for (const auto& kernel : executorch::runtime::get_registered_kernels()) {
    lines.insert(std::string("operator ") + kernel.name_);
  }
  for (const auto& kernel : replacing_kernels()) {
    lines.insert(std::string("replacing ") + kernel.name_);  // the project's kernel, run in place of ExecuTorch's
  }
  for (size_t i = 0; i < executorch::runtime::get_num_registered_backends(); ++i) {
    if (auto name = executorch::runtime::get_backend_name(i); name.ok() && *name != nullptr) {
      lines.insert(std::string("backend ") + *name);
    }
  }
  for (const auto& line : lines) {
    std::printf("%s\n", line.c_str());
  }
}

void install_runtime_hooks(bool turn_aborts_into_errors, bool print_log) {
  g_print_log = print_log;
  executorch::runtime::register_pal(executorch::runtime::PalImpl::create(
      nullptr, turn_aborts_into_errors ? abort_hook : nullptr, nullptr, nullptr, log_hook, nullptr, nullptr,
      __FILE__));
  executorch::runtime::runtime_init();
  if (turn_aborts_into_errors) {
    std::set_terminate([] { stop_on_internal_check("an exception escaped ExecuTorch (e.g. an allocation failed)"); });
  }
}

namespace {

// ETDumpGen with a debug buffer that may be too small: ETDumpGen aborts (ET_CHECK) when a tensor does not fit, so each
// value is measured first, and one that would not fit is skipped and remembered, for a clear error after the run.
class CheckedETDumpGen : public executorch::etdump::ETDumpGen {
 public:
  executorch::runtime::Result<bool> attach_debug_buffer(executorch::runtime::Span<uint8_t> buffer) {
    capacity_ = buffer.size();
    return set_debug_buffer(buffer);
  }

  executorch::runtime::Result<bool> log_evalue(
      const EValue& evalue, executorch::runtime::LoggedEValueType type) override {
    if (capacity_ != 0 && get_data_sink() != nullptr &&
        get_data_sink()->get_used_bytes() + bytes_to_log(evalue) > capacity_) {
      lost_outputs_ = true;
      return Error::MemoryAllocationFailed;
    }
    return ETDumpGen::log_evalue(evalue, type);
  }
  bool lost_outputs() const { return lost_outputs_; }

 private:
  static constexpr size_t kSinkAlignment = 64;  // BufferDataSink's default: each tensor starts 64-byte aligned

  static size_t bytes_to_log(const EValue& value) {
    size_t bytes = 0;
    if (value.isTensor()) {
      bytes = value.toTensor().nbytes() + kSinkAlignment;
    } else if (value.isTensorList()) {
      for (const auto& t : value.toTensorList()) {
        bytes += t.nbytes() + kSinkAlignment;
      }
    }
    return bytes;
  }

  size_t capacity_ = 0;
  bool lost_outputs_ = false;
};

struct FileCloser {
  void operator()(FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<FILE, FileCloser>;

// Opens `path` for writing up front, so a bad path fails before any work.
std::optional<std::string> open_for_writing(const std::string& path, const char* what, File& file) {
  file.reset(std::fopen(path.c_str(), "wb"));
  if (!file) {
    return std::string("cannot write the ") + what + " to '" + path + "': " + std::strerror(errno) +
        "; pass a path in a writable directory";
  }
  return std::nullopt;
}

std::optional<std::string> write_all(FILE* file, const void* data, size_t size, const std::string& path) {
  if ((size != 0 && std::fwrite(data, 1, size, file) != size) || std::fflush(file) != 0) {
    return "writing '" + path + "' failed: " + std::strerror(errno);
  }
  return std::nullopt;
}

// The profiling side of a run: the event tracer, its files and its debug buffer.
struct Profiling {
  CheckedETDumpGen tracer;
  File etdump_file;
  File debug_buffer_file;
  std::unique_ptr<uint8_t, decltype(&std::free)> debug_buffer{nullptr, &std::free};

  std::optional<std::string> open(const RunOptions& options) {
    if (options.etdump_path.empty()) {
      return options.debug_buffer_path.empty()
          ? std::nullopt
          : std::optional<std::string>("--debug_buffer_path needs --etdump_path: the ETDump indexes the buffer");
    }
    if (auto err = open_for_writing(options.etdump_path, "ETDump", etdump_file)) {
      return err;
    }
    if (options.debug_buffer_path.empty()) {
      return std::nullopt;
    }
    if (auto err = open_for_writing(options.debug_buffer_path, "debug buffer", debug_buffer_file)) {
      return err;
    }
    if (options.debug_buffer_size > options.max_memory) {
      return "--debug_buffer_size (" + std::to_string(options.debug_buffer_size) + " bytes) exceeds --max_memory (" +
          std::to_string(options.max_memory) + "); lower it or raise --max_memory";
    }
    debug_buffer.reset(static_cast<uint8_t*>(std::calloc(options.debug_buffer_size, 1)));
    if (!debug_buffer) {
      return "cannot allocate a debug buffer of " + std::to_string(options.debug_buffer_size) + " bytes";
    }
    if (auto set = tracer.attach_debug_buffer({debug_buffer.get(), static_cast<size_t>(options.debug_buffer_size)});
        !set.ok()) {
      return "the ETDump generator refused the debug buffer: " + describe(set.error());
    }
    tracer.set_event_tracer_debug_level(executorch::runtime::EventTracerDebugLogLevel::kIntermediateOutputs);
    return std::nullopt;
  }

  // Writes the ETDump and the used part of the debug buffer.
  std::optional<std::string> write(const RunOptions& options) {
    if (tracer.lost_outputs()) {
      return "the intermediate outputs did not fit the debug buffer (--debug_buffer_size=" +
          std::to_string(options.debug_buffer_size) + "); raise it, or run fewer --num_executions";
    }
    executorch::etdump::ETDumpResult dump = tracer.get_etdump_data();
    if (dump.buf == nullptr || dump.size == 0) {
      return std::string("the ETDump generator produced no data");
    }
    std::unique_ptr<void, decltype(&std::free)> owned(dump.buf, &std::free);  // malloc'ed by ETDumpGen
    if (auto err = write_all(etdump_file.get(), dump.buf, dump.size, options.etdump_path)) {
      return err;
    }
    if (debug_buffer) {
      const size_t used = tracer.get_data_sink()->get_used_bytes();
      if (auto err = write_all(debug_buffer_file.get(), debug_buffer.get(), used, options.debug_buffer_path)) {
        return err;
      }
    }
    return std::nullopt;
  }
};

// The bytes of a .pte's FlatBuffers data, the file less its segments (constant data, delegate payloads): a file with
// segments says where its program ends in the extended header exir writes at offset 8 ("eh00", the header's length,
// then the program's size, little-endian); without one, the whole file is the program. A size the file cannot hold
// (Program::load has verified the header) falls back to the whole file.
size_t program_data_bytes(const executorch::runtime::DataLoader& loader, size_t file_size) {
  constexpr size_t kHeaderAt = 8, kMinimumHeader = 24;
  if (file_size < kHeaderAt + kMinimumHeader) {
    return file_size;
  }
  auto head = loader.load(0, kHeaderAt + kMinimumHeader, executorch::runtime::DataLoader::SegmentInfo(
                                                             executorch::runtime::DataLoader::SegmentInfo::Type::Program));
  if (!head.ok()) {
    return file_size;
  }
  const auto* bytes = static_cast<const uint8_t*>(head->data()) + kHeaderAt;
  uint32_t length = 0;
  uint64_t program_size = 0;
  std::memcpy(&length, bytes + 4, sizeof(length));
  std::memcpy(&program_size, bytes + 8, sizeof(program_size));
  const bool extended = std::memcmp(bytes, "eh00", 4) == 0 && length >= kMinimumHeader;
  return extended && program_size > 0 && program_size <= file_size ? static_cast<size_t>(program_size) : file_size;
}

// What the runtime and a backend trust unchecked, read first: every kernel call's values and every tensor's dtype
// (kernel_calls.h), every list value's items and the delegates' entries and payloads (xnnpack_payload.h). The program
// was verified already; its FlatBuffers data is read once more here, and the whole file when a delegate's payload (in
// a segment) must be read: a copy of the constant segments beside the loaded program would double the runner's memory
// for a model whose weights are most of its file.
std::optional<std::string> check_program_data(const executorch::runtime::DataLoader& loader, bool delegated,
                                              std::vector<std::string>& operators, size_t& external) {
  auto size = loader.size();
  if (!size.ok()) {
    return std::nullopt;  // Program::load read it; nothing to add
  }
  const size_t checked = delegated ? *size : program_data_bytes(loader, *size);
  auto file = loader.load(0, checked, executorch::runtime::DataLoader::SegmentInfo(
                                          executorch::runtime::DataLoader::SegmentInfo::Type::Program));
  if (!file.ok()) {
    return "cannot be read whole to check its values and delegates: " + describe(file.error());
  }
  const auto* data = static_cast<const uint8_t*>(file->data());
  operators = program_operators(data, file->size());
  external = external_tensors(data, file->size());
  if (auto problem = check_kernel_calls(data, file->size())) {
    return "has a kernel call the runtime cannot unbox safely: " + *problem;
  }
  if (auto problem = check_value_lists(data, file->size())) {
    return "has a value the runtime cannot read safely: " + *problem;
  }
  if (auto problem = check_tensor_dtypes(data, file->size())) {
    return "has a value the runtime cannot read safely: " + *problem;
  }
  if (auto problem = check_input_data(data, file->size())) {
    return "has an input the runtime cannot set safely: " + *problem;
  }
  if (auto problem = delegated ? check_delegates(data, file->size()) : std::nullopt) {
    return "has a delegate the runtime cannot read safely: " + *problem;
  }
  return std::nullopt;
}

// ---- Greedy decoding (RunOptions::prompt) ---------------------------------------------------------------------------
// The method must take (tokens int64 [1, T<=max], input_pos int64 [1]) and return logits float32 [1, vocab]; returns
// max (the longest sequence the program accepts) and vocab, or the error naming what differs.
std::optional<std::string> check_decoder_signature(const MethodMeta& meta, int64_t& max_length, int64_t& vocab) {
  const std::string expected = "; decoding needs a method taking (tokens int64 [1, T], input_pos int64 [1]) and "
                               "returning the last position's logits (float32 [1, vocab])";
  if (meta.num_inputs() != 2 || meta.num_outputs() != 1) {
    return "takes " + std::to_string(meta.num_inputs()) + " input(s) and returns " +
        std::to_string(meta.num_outputs()) + " output(s)" + expected;
  }
  for (size_t i = 0; i < 2; ++i) {
    auto tag = meta.input_tag(i);
    auto info = meta.input_tensor_meta(i);
    if (!tag.ok() || *tag != executorch::runtime::Tag::Tensor || !info.ok() ||
        info->scalar_type() != ScalarType::Long || info->sizes().size() != (i == 0 ? 2u : 1u) ||
        info->sizes()[0] != 1) {
      return "input " + std::to_string(i) + " is not an int64 tensor of shape " + (i == 0 ? "[1, T]" : "[1]") +
          expected;
    }
    if (i == 0) {
      max_length = info->sizes()[1];
    }
  }
  auto tag = meta.output_tag(0);
  auto info = meta.output_tensor_meta(0);
  if (!tag.ok() || *tag != executorch::runtime::Tag::Tensor || !info.ok() ||
      info->scalar_type() != ScalarType::Float || info->sizes().size() != 2 || info->sizes()[0] != 1 ||
      info->sizes()[1] <= 0) {
    return "output 0 is not a float32 tensor of shape [1, vocab]" + expected;
  }
  vocab = info->sizes()[1];
  return std::nullopt;
}

// One generation: prefill, then new_tokens - 1 decode steps. Appends the tokens; times prefill and decode apart.
std::optional<std::string> generate(executorch::runtime::Method& method, const RunOptions& options, int64_t vocab,
                                    std::vector<int64_t>& generated, std::vector<float>& all_logits,
                                    double& prefill_us, double& decode_us) {
  std::vector<int64_t> step_tokens = options.prompt;
  int64_t position = 0;
  prefill_us = decode_us = 0;
  for (uint64_t step = 0; step < options.new_tokens; ++step) {
    auto tokens = executorch::extension::make_tensor_ptr(
        {1, static_cast<SizesType>(step_tokens.size())}, std::vector<int64_t>(step_tokens));
    auto input_pos = executorch::extension::make_tensor_ptr({1}, std::vector<int64_t>{position});
    for (auto [index, tensor] : {std::pair<size_t, const TensorPtr*>{0, &tokens}, {1, &input_pos}}) {
      if (Error err = method.set_input(EValue(*tensor), index); err != Error::Ok) {
        return "step " + std::to_string(step) + ": input " + std::to_string(index) + " does not fit method '" +
            options.method + "': " + describe(err) + logged_errors();
      }
    }
    g_log.errors.clear();
    const auto start = std::chrono::steady_clock::now();
    if (Error err = method.execute(); err != Error::Ok) {
      return "step " + std::to_string(step) + " (position " + std::to_string(position) + ") failed: " +
          describe(err) + logged_errors();
    }
    (step == 0 ? prefill_us : decode_us) +=
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
    const EValue& output = method.get_output(0);
    if (!output.isTensor() || output.toTensor().scalar_type() != ScalarType::Float ||
        output.toTensor().numel() != vocab) {
      return "step " + std::to_string(step) + " returned no float32 logits of " + std::to_string(vocab) + " values";
    }
    const float* logits = output.toTensor().const_data_ptr<float>();
    if (!take_greedy_token(logits, vocab, options.logits_path.empty() ? nullptr : &all_logits, generated)) {
      return "step " + std::to_string(step) + " (position " + std::to_string(position) + ") produced NaN logits";
    }
    position += static_cast<int64_t>(step_tokens.size());
    step_tokens = {generated.back()};
  }
  return std::nullopt;
}

int decode(executorch::runtime::Method& method, const MethodMeta& meta, const RunOptions& options,
           Profiling* profiling) {
  int64_t max_length = 0, vocab = 0;
  if (auto err = check_decoder_signature(meta, max_length, vocab)) {
    return fail("method '" + options.method + "' " + *err);
  }
  if (options.new_tokens == 0) {
    return fail("--prompt needs --new_tokens (1 or more)");
  }
  // The cache holds the prompt and every generated token but the last (which is never fed back).
  const uint64_t length = options.prompt.size() + options.new_tokens - 1;
  if (length > static_cast<uint64_t>(max_length)) {
    return fail("a prompt of " + std::to_string(options.prompt.size()) + " token(s) and " +
                std::to_string(options.new_tokens) + " new token(s) need " + std::to_string(length) +
                " positions; the program holds " + std::to_string(max_length) + ". Shorten one of them");
  }
  for (int64_t token : options.prompt) {
    if (token < 0 || token >= vocab) {
      return fail("prompt token " + std::to_string(token) + " is outside the vocabulary [0, " +
                  std::to_string(vocab) + ")");
    }
  }
  std::vector<int64_t> generated;
  std::vector<float> logits;
  double prefill_total = 0, decode_total = 0;
  for (uint64_t run = 0; run < options.num_executions; ++run) {
    generated.clear();
    logits.clear();
    double prefill_us = 0, decode_us = 0;
    if (auto err = generate(method, options, vocab, generated, logits, prefill_us, decode_us)) {
      return fail("decoding: " + *err);
    }
    prefill_total += prefill_us;
    decode_total += decode_us;
    if (options.num_executions > 1 && !options.quiet) {
      std::printf("Generation %" PRIu64 ": prefill %.3f us, decode %.3f us\n", run + 1, prefill_us, decode_us);
    }
  }
  if (profiling != nullptr) {
    if (auto err = profiling->write(options)) {
      return fail(*err);
    }
  }
  if (!options.logits_path.empty()) {
    File file;
    if (auto err = open_for_writing(options.logits_path, "logits", file)) {
      return fail(*err);
    }
    if (auto err = write_all(file.get(), logits.data(), logits.size() * sizeof(float), options.logits_path)) {
      return fail(*err);
    }
  }
  if (options.quiet) {
    return 0;
  }
  print_decode_summary(generated, options.prompt.size(), options.new_tokens, prefill_total, decode_total,
                       options.num_executions);
  return 0;
}

// The named data file (.ptd) a program exported with its weights outside it reads them from: required when the program
// names external tensors, refused when it names none (the wrong file, or the wrong program). `loader` reads
// `data_path` (null when none was given); the map keeps a pointer to it.
std::optional<std::string> open_data_map(executorch::runtime::DataLoader* loader, const std::string& data_path,
                                         const std::string& program_name, size_t external,
                                         std::optional<executorch::extension::FlatTensorDataMap>& map) {
  if (loader == nullptr) {
    if (external == 0) {
      return std::nullopt;
    }
    return "'" + program_name + "' keeps " + std::to_string(external) + " tensor(s) in a named data file outside "
        "it (exported with its weights in a .ptd): pass that file with --data_path=FILE.ptd, the one written beside "
        "the program by the same export";
  }
  if (external == 0) {
    return "--data_path gives '" + data_path + "', but '" + program_name + "' names no data outside itself (its "
        "weights are inside it): drop --data_path, or give the program exported with that data file";
  }
  if (auto problem = check_data_file(*loader)) {
    return "'" + data_path + "' is not a usable ExecuTorch data file (.ptd): " + *problem +
        ". Write it again with its program's export";
  }
  g_log.errors.clear();
  auto loaded = executorch::extension::FlatTensorDataMap::load(loader);
  if (!loaded.ok()) {
    return "'" + data_path + "' is not a loadable ExecuTorch data file (.ptd): " + describe(loaded.error()) +
        ". Write it again with its program's export" + logged_errors();
  }
  map.emplace(std::move(*loaded));
  return std::nullopt;
}

} // namespace

int run_program(
    std::unique_ptr<executorch::runtime::DataLoader> loader,
    const std::string& program_name,
    const RunOptions& options,
    std::unique_ptr<executorch::runtime::DataLoader> data_loader) {
  g_program_name = program_name;
  g_quiet = options.quiet;
  g_log = LogDetails();
  Profiling profiling;
  if (auto err = profiling.open(options)) {
    return fail(*err);
  }
  const bool profile = !options.etdump_path.empty();
  // Program and Method directly, not extension::Module: Module's conveniences call Result::get() unchecked (its
  // method_names() aborts on a method without a name, a verified program can still have one).
  auto program = Program::load(loader.get(), options.verification());
  if (!program.ok()) {
    return fail("'" + program_name + "' is not a loadable ExecuTorch program: " + describe(program.error()) +
                ". Re-export it with to_executorch() (e.g. python custom_ops_1.py)" + logged_errors());
  }
  std::string known;
  bool found = false;
  for (size_t i = 0; i < program->num_methods(); ++i) {
    auto name = program->get_method_name(i);
    if (!name.ok() || *name == nullptr) {
      return fail("method " + std::to_string(i) + " of '" + program_name + "' has no name; the program is corrupt");
    }
    known += (known.empty() ? "" : ", ") + std::string(*name);
    found = found || options.method == *name;
  }
  if (!found) {
    return fail("the program has no method '" + options.method + "'; it has: " + known);
  }
  auto meta = program->method_meta(options.method.c_str());
  if (!meta.ok()) {
    return fail("cannot read method '" + options.method + "': " + describe(meta.error()) + logged_errors());
  }
  std::vector<std::string> operators;
  size_t external = 0;
  if (auto err = check_program_data(*loader, meta->num_backends() != 0, operators, external)) {
    return fail("'" + program_name + "' " + *err + ". Re-export it");
  }
  std::optional<executorch::extension::FlatTensorDataMap> data_map;
  if (auto err = open_data_map(data_loader.get(), options.data_path, program_name, external, data_map)) {
    return fail(*err);
  }
  for (const std::string& name : executorchs_in_place_of_declared(operators)) {
    std::fprintf(stderr, "warning: ExecuTorch's own kernel runs for %s: custom_ops.bzl declares a kernel in its place "
                 "(replaces_executorch), but this runner's kernel library was built without it; select it "
                 "(-DCUSTOM_OPS_ROOT_OPS, -DCUSTOM_OPS_MODEL_FILE) and rebuild\n", name.c_str());
  }
  std::vector<size_t> planned_sizes;
  uint64_t planned_total = 0;
  if (auto err = preflight(*meta, options, planned_sizes, planned_total)) {
    return fail("method '" + options.method + "' of '" + program_name + "': " + *err);
  }
  PlannedMemory planned;
  if (auto err = allocate_planned_memory(planned_sizes, planned)) {
    return fail(*err);
  }
  // The method's own structures and kernels' scratch space: malloc-backed, so a failure is a null the runtime
  // reports (MemoryAllocationFailed), not an exception.
  executorch::extension::MallocMemoryAllocator method_allocator;
  executorch::extension::MallocMemoryAllocator temp_allocator;
  executorch::runtime::MemoryManager memory_manager(&method_allocator, planned.allocator.get(), &temp_allocator);
  g_log.errors.clear();
  const std::vector<executorch::runtime::Kernel> kernels = method_kernel_list();
  auto method = program->load_method(options.method.c_str(), &memory_manager, profile ? &profiling.tracer : nullptr,
                                     data_map ? &*data_map : nullptr, /*backend_options=*/nullptr,
                                     {kernels.data(), kernels.size()});
  // ExecuTorch 1.5 can report success for a method one of whose operators it failed to resolve (a later operator's
  // success overwrites the delayed error; e.g. a name over its 100-character buffer): executing it calls a null kernel.
  // An error logged during loading means the method is not usable, whatever load_method returned.
  if (method.ok() && !g_log.errors.empty()) {
    return fail("cannot load method '" + options.method + "': ExecuTorch failed part of it" + logged_errors());
  }
  if (!method.ok()) {
    // Named from the runtime's log, as missing operators are: it reads a delegate's backend name only once it has
    // checked the entry (MethodMeta's accessor does not; the fuzzer found a corrupt name pointer through it).
    if (!g_log.missing_backends.empty()) {
      return fail("method '" + options.method + "' of '" + program_name + "' is delegated to backend(s) this runner "
                  "does not link: " + joined(g_log.missing_backends) + ". Link the backend's library into the runner "
                  "(XnnpackBackend: executorch::backend_xnnpack, the CMake option CUSTOM_OPS_RUNNER_XNNPACK=ON) or "
                  "export without that partitioner");
    }
    if (method.error() == Error::OperatorMissing) {
      const std::string ops = joined(g_log.missing_operators);
      const std::string calls = "the program calls operator(s) that no kernel library linked into this runner "
                                "registers: " + (ops.empty() ? std::string("(see the log above)") : ops);
      if (const std::string why = unregistered_kernel_library(); !why.empty()) {
        return fail(calls + ". " + why);
      }
      return fail(calls + ". " + missing_operator_advice(g_log.missing_operators));
    }
    if (data_map) {
      return fail("cannot load method '" + options.method + "' with the data in '" + options.data_path + "': " +
                  describe(method.error()) + ". The data file must be the one exported with this program (the "
                  "same export writes both)" + logged_errors());
    }
    return fail("cannot load method '" + options.method + "': " + describe(method.error()) + logged_errors());
  }

  if (!options.prompt.empty()) {
    return decode(*method, *meta, options, profile ? &profiling : nullptr);
  }
  std::vector<InputBuffer> buffers;
  std::vector<std::vector<EValue>> input_groups;
  if (auto err = prepare_inputs(options, *meta, planned_total, buffers, input_groups)) {
    return fail(*err);
  }
  double total_us = 0;
  for (uint64_t run = 0; run < options.num_executions; ++run) {
    // Every execution gets the caller's inputs again, before its timer starts: memory planning may reuse a planned
    // input's buffer for intermediates once the input is dead, so an execution can leave it overwritten. (A planned
    // input is copied into its buffer here; an unplanned one is pointed at, which costs nothing.)
    const std::vector<EValue>& inputs = input_groups[run % input_groups.size()];
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (Error err = method->set_input(inputs[i], i); err != Error::Ok) {
        return fail("input " + std::to_string(i) + " does not fit method '" + options.method + "': " + describe(err) +
                    logged_errors());
      }
    }
    g_log.errors.clear();
    const auto start = std::chrono::steady_clock::now();
    if (Error err = method->execute(); err != Error::Ok) {
      return fail("executing method '" + options.method + "' failed: " + describe(err) + logged_errors());
    }
    const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
    total_us += us;
    if (options.num_executions > 1 && !options.quiet) {
      std::printf("Execution %" PRIu64 ": %.3f us\n", run + 1, us);
    }
  }
  if (profile) {
    if (auto err = profiling.write(options)) {
      return fail(*err);
    }
  }
  if (options.quiet) {
    return 0;
  }
  std::printf("Ran method '%s' %" PRIu64 " time(s): %.3f us average\n", options.method.c_str(),
              options.num_executions, total_us / static_cast<double>(options.num_executions));
  if (auto kib = huge_page_kib()) {
    std::printf("On huge pages: %llu KiB\n", static_cast<unsigned long long>(*kib));
  }
  const size_t num_outputs = method->outputs_size();  // output value indices were range-checked by preflight()
  if (!options.outputs.empty() && options.outputs.size() != num_outputs) {
    return fail("--outputs names " + std::to_string(options.outputs.size()) + " file(s) but method '" +
                options.method + "' returned " + std::to_string(num_outputs) + " output(s)");
  }
  for (size_t i = 0; i < num_outputs; ++i) {
    print_output(i, method->get_output(i));
    if (!options.outputs.empty()) {
      if (auto err = write_output(options.outputs[i], method->get_output(i))) {
        return fail(*err);
      }
    }
  }
  return 0;
}

} // namespace custom_ops_runner
