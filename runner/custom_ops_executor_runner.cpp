// The last step of the flow: loads a .pte and runs one of its methods with the kernels linked into this binary
// (libcustom_ops_lib.so for my_ops::*, ExecuTorch's optimized aten kernels for the rest).
// Every failure ends in one "error:" line that names the problem and the fix, and a non-zero exit.

#include <executorch/extension/module/module.h>
#include <executorch/extension/tensor/tensor.h>
#include <executorch/runtime/core/exec_aten/util/scalar_type_util.h>
#include <executorch/runtime/platform/platform.h>
#include <executorch/runtime/platform/runtime.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

using executorch::aten::ScalarType;
using executorch::aten::SizesType;
using executorch::aten::Tensor;
using executorch::extension::TensorPtr;
using executorch::extension::module::Module;
using executorch::runtime::Error;
using executorch::runtime::EValue;
using executorch::runtime::MethodMeta;

namespace {

constexpr const char* kUsage = R"(usage: custom_ops_executor_runner --model_path=FILE.pte [options]
  --method=NAME         method to run (default: forward)
  --inputs=A.bin,...    one raw little-endian file per tensor input, in the dtype the method declares and in
                        its memory order (its dim order: row-major unless the program declares another, e.g.
                        channels-last) (default: every input filled with ones)
  --input_shapes=2x3,4  the shape of each input, for programs exported with dynamic dimensions
                        (default: the shapes the program declares; 0-d tensors are written as "")
  --outputs=O.bin,...   write each output tensor's raw bytes (in its memory order) to these files
  --num_executions=N    run the method N times and time each run (default: 1)
)";

int fail(const std::string& message, int exit_code = 1) {
  std::fprintf(stderr, "error: %s\n", message.c_str());
  return exit_code;
}

// ---------------------------------------------------------------------------------------------------------------------
// ExecuTorch reports details (which operator is missing, why a kernel failed) only through its log. This hook keeps
// printing the log and remembers those details, so the runner's final error line can repeat them.
struct LogDetails {
  std::set<std::string> missing_operators;
  std::vector<std::string> errors;
};
LogDetails g_log;

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
  std::fprintf(stderr, "[%c %s:%zu] %s\n", static_cast<char>(level), base ? base + 1 : filename, line, text.c_str());
  constexpr const char kMissing[] = "Missing operator: ";
  if (auto pos = text.find(kMissing); pos != std::string::npos) {
    std::string rest = text.substr(pos + sizeof(kMissing) - 1);  // "[3] my_ops::mul4.out"
    g_log.missing_operators.insert(rest.substr(rest.find(']') == std::string::npos ? 0 : rest.find(']') + 2));
  } else if (level == kError && g_log.errors.size() < 8) {
    g_log.errors.push_back(text);
  }
}

std::string logged_errors() {
  std::string joined;
  for (const auto& e : g_log.errors) {
    joined += "\n  " + e;
  }
  return joined.empty() ? "" : "; ExecuTorch reported:" + joined;
}

std::string describe(Error error) {
  char code[16];
  std::snprintf(code, sizeof(code), "0x%x", static_cast<unsigned>(error));
  return std::string(executorch::runtime::to_string(error)) + " (" + code + ")";
}

// ---------------------------------------------------------------------------------------------------------------------
struct Options {
  std::string model_path;
  std::string method = "forward";
  std::vector<std::string> inputs;
  std::optional<std::vector<std::string>> input_shapes;
  std::vector<std::string> outputs;
  long num_executions = 1;
};

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  std::stringstream stream(text);
  std::string part;
  while (std::getline(stream, part, separator)) {
    parts.push_back(part);
  }
  if (!text.empty() && text.back() == separator) {
    parts.emplace_back();
  }
  return parts;
}

// Returns an error message, or nothing when the arguments parsed.
std::optional<std::string> parse_options(int argc, char** argv, Options& options) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    std::string name = arg, value;
    bool has_value = false;
    if (auto eq = arg.find('='); eq != std::string::npos) {
      name = arg.substr(0, eq);
      value = arg.substr(eq + 1);
      has_value = true;
    } else if (i + 1 < argc && std::strncmp(argv[i + 1], "--", 2) != 0) {
      value = argv[++i];
      has_value = true;
    }
    if (name == "--help" || name == "-h") {
      return std::string();
    }
    if (!has_value) {
      return "option " + name + " needs a value";
    }
    if (name == "--model_path") {
      options.model_path = value;
    } else if (name == "--method") {
      options.method = value;
    } else if (name == "--inputs") {
      options.inputs = split(value, ',');
    } else if (name == "--input_shapes") {
      options.input_shapes = split(value, ',');
    } else if (name == "--outputs") {
      options.outputs = split(value, ',');
    } else if (name == "--num_executions") {
      char* end = nullptr;
      options.num_executions = std::strtol(value.c_str(), &end, 10);
      if (*end != '\0' || options.num_executions < 1) {
        return "--num_executions must be a positive integer, got '" + value + "'";
      }
    } else {
      return "unknown option " + name;
    }
  }
  if (options.model_path.empty()) {
    return "--model_path is required";
  }
  return std::nullopt;
}

std::optional<std::vector<SizesType>> parse_shape(const std::string& text) {
  std::vector<SizesType> sizes;
  for (const auto& dim : split(text, 'x')) {
    char* end = nullptr;
    long value = std::strtol(dim.c_str(), &end, 10);
    if (dim.empty() || *end != '\0' || value < 0) {
      return std::nullopt;
    }
    sizes.push_back(static_cast<SizesType>(value));
  }
  return sizes;
}

template <typename T>
std::string list_string(executorch::aten::ArrayRef<T> values) {
  std::string s = "[";
  for (size_t i = 0; i < values.size(); ++i) {
    s += (i ? ", " : "") + std::to_string(values[i]);
  }
  return s + "]";
}

std::string shape_string(executorch::aten::ArrayRef<SizesType> sizes) {
  return list_string(sizes);
}

// ---------------------------------------------------------------------------------------------------------------------
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
  const size_t actual = static_cast<size_t>(file.tellg());
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
#define FILL_CASE(ctype, name)                                         \
  case ScalarType::name:                                               \
    std::fill_n(static_cast<ctype*>(data), numel, static_cast<ctype>(1)); \
    return true;
    ET_FORALL_REAL_TYPES_AND3(Half, BFloat16, Bool, FILL_CASE)
#undef FILL_CASE
    default:
      return false;
  }
}

std::optional<std::string> prepare_inputs(
    const Options& options,
    const MethodMeta& meta,
    std::vector<InputBuffer>& buffers,
    std::vector<EValue>& values) {
  const size_t count = meta.num_inputs();
  if (!options.inputs.empty() && options.inputs.size() != count) {
    return "--inputs names " + std::to_string(options.inputs.size()) + " file(s) but method '" + options.method +
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
    auto info = meta.input_tensor_meta(i);
    if (!info.ok()) {
      return "cannot read the metadata of input " + std::to_string(i) + ": " + describe(info.error());
    }
    std::vector<SizesType> sizes(info->sizes().begin(), info->sizes().end());
    if (options.input_shapes) {
      auto parsed = parse_shape((*options.input_shapes)[i]);
      if (!parsed) {
        return "--input_shapes entry '" + (*options.input_shapes)[i] + "' is not a shape like 2x3";
      }
      if (parsed->size() != sizes.size()) {
        return "--input_shapes entry '" + (*options.input_shapes)[i] + "' has " + std::to_string(parsed->size()) +
            " dimension(s) but input " + std::to_string(i) + " of method '" + options.method + "' has " +
            std::to_string(sizes.size());
      }
      sizes = *parsed;
    }
    size_t numel = 1;
    for (auto s : sizes) {
      numel *= static_cast<size_t>(s);
    }
    const ScalarType dtype = info->scalar_type();
    const size_t nbytes = numel * executorch::runtime::elementSize(dtype);
    InputBuffer buffer;
    buffer.data.reset(std::aligned_alloc(64, std::max<size_t>(64, (nbytes + 63) / 64 * 64)));
    if (!options.inputs.empty()) {
      if (auto err = read_file(options.inputs[i], nbytes, buffer.data.get())) {
        return *err + " (method '" + options.method + "' input " + std::to_string(i) + " is " +
            executorch::runtime::toString(dtype) + shape_string({sizes.data(), sizes.size()}) + ")";
      }
    } else if (!fill_with_ones(dtype, buffer.data.get(), numel)) {
      return std::string("input ") + std::to_string(i) + " has dtype " + executorch::runtime::toString(dtype) +
          ", which the runner cannot fill with ones; pass --inputs";
    }
    // In the declared dim order, so the bytes mean what the program expects (channels-last stays channels-last).
    std::vector<executorch::aten::DimOrderType> dim_order(info->dim_order().begin(), info->dim_order().end());
    buffer.tensor = executorch::extension::make_tensor_ptr(sizes, buffer.data.get(), dim_order, {}, dtype);
    values.emplace_back(buffer.tensor);
    buffers.push_back(std::move(buffer));
  }
  return std::nullopt;
}

// ---------------------------------------------------------------------------------------------------------------------
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
              shape_string(t.sizes()).c_str(),
              row_major ? "" : (" dim_order=" + list_string(t.dim_order())).c_str());
  constexpr size_t kShown = 8;
  switch (t.scalar_type()) {
#define PRINT_CASE(ctype, name)    \
  case ScalarType::name:           \
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

}  // namespace

int main(int argc, char** argv) {
  executorch::runtime::register_pal(executorch::runtime::PalImpl::create(log_hook, __FILE__));
  executorch::runtime::runtime_init();

  Options options;
  if (auto err = parse_options(argc, argv, options)) {
    std::fputs(kUsage, err->empty() ? stdout : stderr);
    return err->empty() ? 0 : fail(*err, 2);
  }
  if (!std::ifstream(options.model_path, std::ios::binary)) {
    return fail("cannot open model file '" + options.model_path + "': " + std::strerror(errno));
  }

  Module module(options.model_path, Module::LoadMode::File);
  if (Error err = module.load(); err != Error::Ok) {
    return fail("'" + options.model_path + "' is not a loadable ExecuTorch program: " + describe(err) +
                ". Re-export it with to_executorch() (e.g. python custom_ops_1.py)" + logged_errors());
  }
  auto method_names = module.method_names();
  if (method_names.ok() && !method_names->count(options.method)) {
    std::string known;
    for (const auto& name : *method_names) {
      known += (known.empty() ? "" : ", ") + name;
    }
    return fail("the program has no method '" + options.method + "'; it has: " + known);
  }
  auto meta = module.method_meta(options.method);
  if (!meta.ok()) {
    return fail("cannot read method '" + options.method + "': " + describe(meta.error()) + logged_errors());
  }
  if (Error err = module.load_method(options.method); err != Error::Ok) {
    if (err == Error::OperatorMissing) {
      std::string ops;
      for (const auto& op : g_log.missing_operators) {
        ops += (ops.empty() ? "" : ", ") + op;
      }
      return fail("the program calls operator(s) that no kernel library linked into this runner registers: " +
                  (ops.empty() ? std::string("(see the log above)") : ops) +
                  ". Add them to the selected root ops (CMake -DCUSTOM_OPS_ROOT_OPS or REGISTER_EXAMPLE_CUSTOM_OP), "
                  "bind each to a kernel in custom_ops.yaml, and rebuild");
    }
    return fail("cannot load method '" + options.method + "': " + describe(err) + logged_errors());
  }

  std::vector<InputBuffer> buffers;
  std::vector<EValue> inputs;
  if (auto err = prepare_inputs(options, *meta, buffers, inputs)) {
    return fail(*err);
  }

  std::vector<EValue> outputs;
  double total_us = 0;
  for (long run = 0; run < options.num_executions; ++run) {
    g_log.errors.clear();
    const auto start = std::chrono::steady_clock::now();
    auto result = module.execute(options.method, inputs);
    const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
    if (!result.ok()) {
      return fail("executing method '" + options.method + "' failed: " + describe(result.error()) + logged_errors());
    }
    total_us += us;
    if (options.num_executions > 1) {
      std::printf("Execution %ld: %.3f us\n", run + 1, us);
    }
    outputs = std::move(*result);
  }
  std::printf("Ran method '%s' %ld time(s): %.3f us average\n", options.method.c_str(), options.num_executions,
              total_us / static_cast<double>(options.num_executions));

  if (!options.outputs.empty() && options.outputs.size() != outputs.size()) {
    return fail("--outputs names " + std::to_string(options.outputs.size()) + " file(s) but method '" +
                options.method + "' returned " + std::to_string(outputs.size()) + " output(s)");
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    print_output(i, outputs[i]);
    if (!options.outputs.empty()) {
      if (auto err = write_output(options.outputs[i], outputs[i])) {
        return fail(*err);
      }
    }
  }
  return 0;
}
