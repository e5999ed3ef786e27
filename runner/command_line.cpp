// The runners' one command line (command_line.h): the flag table, the parser and the checks of every combination.
#include "command_line.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <type_traits>

namespace custom_ops_runner {

const char* const kSpecDtypes[10] = {"float32", "float64", "float16", "bfloat16", "uint8",
                                     "int8",    "int16",   "int32",   "int64",    "bool"};

namespace {

enum Takes : unsigned { kExecuTorchOnly = 1, kAotInductorOnly = 2, kBoth = 3 };

struct Flag {
  const char* name;
  const char* value;  // what the value looks like in the usage; nullptr: a switch that takes none
  unsigned runners;
  const char* help;
  // Stores the value; returns the error naming the flag, or nullopt.
  std::function<std::optional<std::string>(const std::string& value, CommandLine& out)> store;
};

unsigned bit(Runner runner) { return runner == Runner::kExecuTorch ? kExecuTorchOnly : kAotInductorOnly; }

const char* binary_name(Runner runner) {
  return runner == Runner::kExecuTorch ? "custom_ops_executor_runner" : "custom_ops_aoti_runner";
}

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (size_t at; (at = text.find(separator, start)) != std::string::npos; start = at + 1) {
    parts.push_back(text.substr(start, at - start));
  }
  parts.push_back(text.substr(start));
  return parts;
}

std::optional<std::string> store_count(const char* name, const std::string& value, uint64_t& field) {
  auto n = parse_count(value, kMaxCount);
  if (!n || *n == 0) {
    return std::string(name) + " must be an integer from 1 to " + std::to_string(kMaxCount) + ", got '" + value + "'";
  }
  field = *n;
  return std::nullopt;
}

std::optional<std::string> store_bytes(const char* name, const char* examples, const std::string& value,
                                       uint64_t& field) {
  auto bytes = parse_bytes(value);
  if (!bytes || *bytes == 0) {
    return std::string(name) + " must be a positive byte count such as " + examples + ", got '" + value + "'";
  }
  field = *bytes;
  return std::nullopt;
}

std::optional<std::string> store_path(const char* name, const std::string& value, std::string& field) {
  if (value.empty()) {
    return std::string(name) + " needs a file name";
  }
  field = value;
  return std::nullopt;
}

// A comma-separated list of names (files, libraries), none empty.
std::optional<std::string> store_names(const char* name, const char* what, const std::string& value,
                                       std::vector<std::string>& field) {
  field = split(value, ',');
  for (const auto& item : field) {
    if (item.empty()) {
      return std::string(name) + " has an empty " + what + " in '" + value + "'";
    }
  }
  return std::nullopt;
}

std::optional<std::string> store_spec(const std::string& text, InputSpec& spec) {
  const size_t colon = text.find(':');
  std::string dtypes;
  bool known = false;
  for (const char* dtype : kSpecDtypes) {
    dtypes += (dtypes.empty() ? "" : ", ") + std::string(dtype);
    known = known || (colon != std::string::npos && text.compare(0, colon, dtype) == 0 && colon == std::strlen(dtype));
  }
  if (!known) {
    return "--input_specs entry '" + text + "' is not DTYPE:SHAPE such as float32:2x3 (dtypes: " + dtypes + ")";
  }
  auto shape = parse_shape(text.substr(colon + 1));
  if (!shape) {
    return "--input_specs entry '" + text + "' has a shape that is not like 2x3 (each dimension 0 to 2147483647)";
  }
  spec.dtype = text.substr(0, colon);
  spec.shape.assign(shape->begin(), shape->end());
  return std::nullopt;
}

const std::vector<Flag>& flags() {
  static const std::vector<Flag> table = {
      {"--model_path", "FILE.pte", kExecuTorchOnly, "the program to run (required)",
       [](const std::string& v, CommandLine& o) { return store_path("--model_path", v, o.program); }},
      {"--data_path", "FILE.ptd", kExecuTorchOnly,
       "the named data file holding the weights of a program exported with them outside it (ExecuTorch's .ptd, "
       "written beside the .pte by its export)",
       [](const std::string& v, CommandLine& o) { return store_path("--data_path", v, o.data_path); }},
      {"--package", "FILE.pt2", kAotInductorOnly, "the torch._inductor package to run (required)",
       [](const std::string& v, CommandLine& o) { return store_path("--package", v, o.program); }},
      {"--list_registered", nullptr, kExecuTorchOnly,
       "print the operators and backends linked in, one per line, and each operator whose kernel here replaces "
       "ExecuTorch's (`replacing NAME`), and stop",
       [](const std::string&, CommandLine& o) -> std::optional<std::string> {
         o.list_registered = true;
         return std::nullopt;
       }},
      {"--op_library", "A.so,...", kAotInductorOnly,
       "load these libraries first (RTLD_GLOBAL), in order: they register the custom ops the package calls "
       "(libcustom_ops_aot_lib.so: ops registered from C++; libcustom_ops_without_python.so: C++ kernels of the "
       "ops registered from Python)",
       [](const std::string& v, CommandLine& o) -> std::optional<std::string> {
         std::vector<std::string> libraries;
         auto err = store_names("--op_library", "library name", v, libraries);
         o.op_libraries.insert(o.op_libraries.end(), libraries.begin(), libraries.end());
         return err;
       }},
      {"--method", "NAME", kExecuTorchOnly, "method to run (default: forward)",
       [](const std::string& v, CommandLine& o) { return store_path("--method", v, o.method); }},
      {"--inputs", "A.bin,...", kBoth,
       "one raw little-endian file per tensor input, in the dtype the program declares and in its memory order "
       "(row-major unless the program declares another dim order). Repeated, one list per execution: execution N "
       "takes list N modulo their count (state across executions, e.g. a cache position per step). ExecuTorch "
       "default: every input filled with ones",
       [](const std::string& v, CommandLine& o) {
         return store_names("--inputs", "file name", v, o.inputs.emplace_back());
       }},
      {"--input_shapes", "2x3,4", kExecuTorchOnly,
       "the shape of each input, for programs exported with dynamic dimensions (default: the shapes the program "
       "declares; a 0-d tensor is written as \"\")",
       [](const std::string& v, CommandLine& o) -> std::optional<std::string> {
         o.input_shapes.emplace();
         for (const auto& text : split(v, ',')) {
           auto shape = parse_shape(text);
           if (!shape) {
             return "--input_shapes entry '" + text + "' is not a shape like 2x3 (each dimension 0 to 2147483647)";
           }
           o.input_shapes->push_back(*shape);
         }
         return std::nullopt;
       }},
      {"--input_specs", "float32:2x3,...", kAotInductorOnly,
       "each input's dtype and shape (a 0-d tensor: \"float32:\"); required with --inputs",
       [](const std::string& v, CommandLine& o) -> std::optional<std::string> {
         o.input_specs.clear();
         for (const auto& text : split(v, ',')) {
           if (auto err = store_spec(text, o.input_specs.emplace_back())) {
             return err;
           }
         }
         return std::nullopt;
       }},
      {"--outputs", "O.bin,...", kBoth, "write each output tensor's raw bytes (in its memory order) to these files",
       [](const std::string& v, CommandLine& o) { return store_names("--outputs", "file name", v, o.outputs); }},
      {"--num_executions", "N", kBoth,
       "run N times, 1 to 1000000, each on the caller's inputs, timing each run; outputs are the last run's "
       "(default: 1)",
       [](const std::string& v, CommandLine& o) { return store_count("--num_executions", v, o.num_executions); }},
      {"--verification", "LEVEL", kExecuTorchOnly,
       "internal_consistency (default): check the whole program before using it; minimal: the file header only "
       "(faster, for programs you produced yourself)",
       [](const std::string& v, CommandLine& o) -> std::optional<std::string> {
         if (v != "internal_consistency" && v != "minimal") {
           return "--verification must be internal_consistency or minimal, got '" + v + "'";
         }
         o.minimal_verification = v == "minimal";
         return std::nullopt;
       }},
      {"--max_memory", "BYTES", kExecuTorchOnly,
       "refuse programs whose planned buffers plus inputs need more (default: 1G; suffixes K, M, G)",
       [](const std::string& v, CommandLine& o) {
         return store_bytes("--max_memory", "536870912 or 512M", v, o.max_memory);
       }},
      {"--etdump_path", "FILE", kExecuTorchOnly,
       "profile: write an ETDump (every op's time in every execution) for executorch.devtools.Inspector",
       [](const std::string& v, CommandLine& o) { return store_path("--etdump_path", v, o.etdump_path); }},
      {"--debug_buffer_path", "FILE", kExecuTorchOnly,
       "with --etdump_path: also capture every intermediate output, into FILE",
       [](const std::string& v, CommandLine& o) { return store_path("--debug_buffer_path", v, o.debug_buffer_path); }},
      {"--debug_buffer_size", "BYTES", kExecuTorchOnly,
       "room for those outputs over all executions (default: 64M; suffixes K, M, G)",
       [](const std::string& v, CommandLine& o) {
         return store_bytes("--debug_buffer_size", "1048576 or 64M", v, o.debug_buffer_size);
       }},
      {"--prompt", "1,17,42", kBoth,
       "greedy decoding, for a language model taking (tokens int64 [1, T], input_pos int64 [1]) and returning the "
       "last position's logits (float32 [1, vocab]), keeping its KV cache as state: the token ids run at position "
       "0 (prefill), then each argmax is fed back at the next position",
       [](const std::string& v, CommandLine& o) -> std::optional<std::string> {
         o.prompt.clear();
         for (const auto& token : split(v, ',')) {
           auto id = parse_count(token, INT64_MAX);
           if (!id) {
             return "--prompt must be token ids (integers from 0) separated by commas, got '" + v + "'";
           }
           o.prompt.push_back(static_cast<int64_t>(*id));
         }
         return std::nullopt;
       }},
      {"--new_tokens", "N", kBoth,
       "how many tokens to generate, 1 to 1000000 (--num_executions repeats the generation)",
       [](const std::string& v, CommandLine& o) { return store_count("--new_tokens", v, o.new_tokens); }},
      {"--logits_path", "FILE", kBoth,
       "write every step's logits (float32, one row per step) of the last generation",
       [](const std::string& v, CommandLine& o) { return store_path("--logits_path", v, o.logits_path); }},
  };
  return table;
}

// The combinations, checked once every flag is read (so their order does not matter).
std::optional<std::string> check_combinations(Runner runner, const CommandLine& o) {
  if (o.list_registered) {
    return std::nullopt;
  }
  if (o.program.empty()) {
    return std::string(runner == Runner::kExecuTorch ? "--model_path" : "--package") + " is required";
  }
  // Decoding first, then the input lists among themselves, then against each runner's shapes or specs: a shared
  // mistake gets the same first error in both runners.
  if (o.prompt.empty() != (o.new_tokens == 0)) {
    return std::string("--prompt and --new_tokens go together (greedy decoding)");
  }
  if (!o.prompt.empty() && (!o.inputs.empty() || o.input_shapes || !o.input_specs.empty() || !o.outputs.empty())) {
    return std::string("--prompt feeds the model its tokens itself; it does not combine with --inputs, "
                       "--input_shapes, --input_specs or --outputs (use --logits_path for the logits)");
  }
  if (!o.logits_path.empty() && o.prompt.empty()) {
    return std::string("--logits_path needs --prompt and --new_tokens");
  }
  for (size_t i = 1; i < o.inputs.size(); ++i) {
    if (o.inputs[i].size() != o.inputs[0].size()) {
      return "--inputs list " + std::to_string(i + 1) + " names " + std::to_string(o.inputs[i].size()) +
          " file(s) but list 1 names " + std::to_string(o.inputs[0].size()) + "; every execution takes the same inputs";
    }
  }
  const size_t per_list = o.inputs.empty() ? 0 : o.inputs[0].size();
  if (runner == Runner::kAotInductor && !o.inputs.empty() && o.input_specs.size() != per_list) {
    return "--inputs names " + std::to_string(per_list) + " file(s) per list but --input_specs gives " +
        std::to_string(o.input_specs.size()) + " spec(s); give one spec per input";
  }
  if (runner == Runner::kAotInductor && o.inputs.empty() && !o.input_specs.empty()) {
    return "--input_specs describes the --inputs files; pass --inputs too";
  }
  if (o.input_shapes && !o.inputs.empty() && o.input_shapes->size() != per_list) {
    return "--inputs names " + std::to_string(per_list) + " file(s) per list but --input_shapes gives " +
        std::to_string(o.input_shapes->size()) + " shape(s); give one shape per input";
  }
  if (!o.debug_buffer_path.empty() && o.etdump_path.empty()) {
    return std::string("--debug_buffer_path needs --etdump_path: the ETDump indexes the buffer");
  }
  return std::nullopt;
}

} // namespace

std::optional<std::string> parse_command_line(int argc, char** argv, Runner runner, CommandLine& out) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      out.help = true;
      return std::nullopt;
    }
    const size_t eq = arg.find('=');
    const std::string name = arg.substr(0, eq);
    const Flag* flag = nullptr;
    for (const Flag& f : flags()) {
      flag = name == f.name ? &f : flag;
    }
    if (flag == nullptr) {
      return arg.rfind("--", 0) == 0 ? "unknown option " + name + " (see --help)"
                                     : "unexpected argument '" + arg + "': options are --name=value";
    }
    if ((flag->runners & bit(runner)) == 0) {
      return name + " is an option of " +
          binary_name(runner == Runner::kExecuTorch ? Runner::kAotInductor : Runner::kExecuTorch) + ", not of " +
          binary_name(runner) + " (see --help)";
    }
    std::string value;
    if (flag->value == nullptr) {
      if (eq != std::string::npos) {
        return name + " takes no value";
      }
    } else if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
    } else if (i + 1 < argc && std::strncmp(argv[i + 1], "--", 2) != 0) {
      value = argv[++i];
    } else {
      return "option " + name + " needs a value";
    }
    if (auto err = flag->store(value, out)) {
      return err;
    }
  }
  return check_combinations(runner, out);
}

std::string usage(Runner runner) {
  std::string text = std::string("usage: ") + binary_name(runner) +
      (runner == Runner::kExecuTorch ? " --model_path=FILE.pte [options]\n" : " --package=FILE.pt2 [options]\n");
  constexpr size_t kColumn = 28, kWidth = 118;
  for (const Flag& f : flags()) {
    if ((f.runners & bit(runner)) == 0) {
      continue;
    }
    std::string head = std::string("  ") + f.name + (f.value ? std::string("=") + f.value : std::string());
    head.resize(std::max(head.size() + 1, kColumn), ' ');
    // Wrap the help at word boundaries into the column.
    std::string line = head;
    for (const auto& word : split(f.help, ' ')) {
      if (line.size() + word.size() + 1 > kWidth && line.size() > kColumn) {
        text += line + "\n";
        line = std::string(kColumn, ' ');
      }
      line += (line.size() == kColumn || line.back() == ' ' ? "" : " ") + word;
    }
    text += line + "\n";
  }
  return text;
}

std::optional<uint64_t> parse_count(const std::string& text, uint64_t max) {
  if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos) {
    return std::nullopt;  // no sign, no space
  }
  errno = 0;
  char* end = nullptr;
  const unsigned long long value = std::strtoull(text.c_str(), &end, 10);
  if (errno == ERANGE || *end != '\0' || value > max) {
    return std::nullopt;
  }
  return value;
}

std::optional<std::vector<int32_t>> parse_shape(const std::string& text) {
  std::vector<int32_t> sizes;
  if (text.empty()) {
    return sizes;
  }
  for (const auto& dim : split(text, 'x')) {
    auto value = parse_count(dim, INT32_MAX);
    if (!value) {
      return std::nullopt;
    }
    sizes.push_back(static_cast<int32_t>(*value));
  }
  return sizes;
}

std::optional<uint64_t> parse_bytes(const std::string& text) {
  if (text.empty()) {
    return std::nullopt;
  }
  int shift = 0;
  switch (text.back()) {
    case 'K': shift = 10; break;
    case 'M': shift = 20; break;
    case 'G': shift = 30; break;
    default: break;
  }
  auto value = parse_count(shift ? text.substr(0, text.size() - 1) : text, UINT64_MAX >> shift);
  return value ? std::optional<uint64_t>(*value << shift) : std::nullopt;
}

} // namespace custom_ops_runner
