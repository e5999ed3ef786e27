// The last step of the flow: loads a .pte and runs one of its methods with the kernels linked into this binary
// (libcustom_ops_lib.so for my_ops::*, ExecuTorch's optimized aten kernels for the rest). The program is untrusted
// input (program_runner.h): verified, checked against a memory budget, and every failure is one "error:" line that
// names the problem and the fix, with exit code 1 (2 for a bad command line).
#include <executorch/extension/data_loader/file_data_loader.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "program_runner.h"

namespace {

using custom_ops_runner::RunOptions;
using executorch::runtime::Program;

constexpr const char* kUsage = R"(usage: custom_ops_executor_runner --model_path=FILE.pte [options]
       custom_ops_executor_runner --list_registered   (the operators and backends linked in, one per line)
  --method=NAME             method to run (default: forward)
  --inputs=A.bin,...        one raw little-endian file per tensor input, in the dtype the method declares and in
                            its memory order (its dim order: row-major unless the program declares another, e.g.
                            channels-last) (default: every input filled with ones). Repeated, one list
                            per execution: execution N takes list N modulo their count (state across
                            executions, e.g. a cache position per step)
  --input_shapes=2x3,4      the shape of each input, for programs exported with dynamic dimensions
                            (default: the shapes the program declares; 0-d tensors are written as "")
  --outputs=O.bin,...       write each output tensor's raw bytes (in its memory order) to these files
  --num_executions=N        run the method N times, 1 to 1000000, each on the caller's inputs, and time each run
                            (the inputs are set before the timer starts); outputs are the last run's (default: 1)
  --verification=LEVEL      internal_consistency (default): check the whole program before using it;
                            minimal: the file header only (faster, for programs you produced yourself)
  --max_memory=BYTES        refuse programs whose planned buffers plus inputs need more (default: 1G;
                            suffixes K, M, G)
  --etdump_path=FILE        profile: write an ETDump (every op's time in every execution) for
                            executorch.devtools.Inspector
  --debug_buffer_path=FILE  with --etdump_path: also capture every intermediate output, into FILE
  --debug_buffer_size=BYTES room for those outputs over all executions (default: 64M; suffixes K, M, G)
Greedy decoding, for a language model whose method takes (tokens int64 [1, T], input_pos int64 [1]) and returns the
last position's logits (float32 [1, vocab]), keeping its KV cache as state (decoder.py):
  --prompt=1,17,42          token ids: run at position 0 (prefill), then each argmax is fed back at the next position
  --new_tokens=N            how many tokens to generate, 1 to 1000000 (--num_executions repeats the generation)
  --logits_path=FILE        write every step's logits (float32, one row per step) of the last generation
)";

// A positive byte count (512, 64K, 256M, 2G) for flag `name` into `field`; or the error naming the flag.
std::optional<std::string> parse_byte_count(const std::string& name, const std::string& value, const char* examples,
                                            uint64_t& field) {
  auto bytes = custom_ops_runner::parse_bytes(value);
  if (!bytes || *bytes == 0) {
    return name + " must be a positive byte count such as " + examples + ", got '" + value + "'";
  }
  field = *bytes;
  return std::nullopt;
}

// Returns an error message ("" for --help), or nothing when the arguments parsed.
// list_registered: --list_registered was given (no program is run).
std::optional<std::string> parse_options(int argc, char** argv, std::string& model_path, RunOptions& options,
                                         bool& list_registered) {
  auto split = [](const std::string& text) {
    std::vector<std::string> parts;
    size_t start = 0;
    for (size_t comma; (comma = text.find(',', start)) != std::string::npos; start = comma + 1) {
      parts.push_back(text.substr(start, comma - start));
    }
    parts.push_back(text.substr(start));
    return parts;
  };
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
    if (name == "--list_registered" && !has_value) {
      list_registered = true;
      continue;
    }
    if (!has_value) {
      return "option " + name + " needs a value";
    }
    if (name == "--model_path") {
      model_path = value;
    } else if (name == "--method") {
      options.method = value;
    } else if (name == "--inputs") {
      options.inputs.push_back(split(value));
    } else if (name == "--input_shapes") {
      options.input_shapes = split(value);
      for (const auto& shape : *options.input_shapes) {
        if (!custom_ops_runner::parse_shape(shape)) {
          return "--input_shapes entry '" + shape + "' is not a shape like 2x3 (each dimension 0 to 2147483647)";
        }
      }
    } else if (name == "--outputs") {
      options.outputs = split(value);
    } else if (name == "--num_executions") {
      auto n = custom_ops_runner::parse_count(value, custom_ops_runner::kMaxExecutions);
      if (!n || *n == 0) {
        return "--num_executions must be an integer from 1 to " + std::to_string(custom_ops_runner::kMaxExecutions) +
            ", got '" + value + "'";
      }
      options.num_executions = *n;
    } else if (name == "--max_memory") {
      if (auto err = parse_byte_count(name, value, "536870912 or 512M", options.max_memory)) {
        return err;
      }
    } else if (name == "--etdump_path") {
      options.etdump_path = value;
    } else if (name == "--debug_buffer_path") {
      options.debug_buffer_path = value;
    } else if (name == "--debug_buffer_size") {
      if (auto err = parse_byte_count(name, value, "1048576 or 64M", options.debug_buffer_size)) {
        return err;
      }
    } else if (name == "--prompt") {
      for (const auto& token : split(value)) {
        auto id = custom_ops_runner::parse_count(token, INT64_MAX);
        if (!id) {
          return "--prompt must be token ids (integers from 0) separated by commas, got '" + value + "'";
        }
        options.prompt.push_back(static_cast<int64_t>(*id));
      }
    } else if (name == "--new_tokens") {
      auto n = custom_ops_runner::parse_count(value, custom_ops_runner::kMaxExecutions);
      if (!n || *n == 0) {
        return "--new_tokens must be an integer from 1 to " + std::to_string(custom_ops_runner::kMaxExecutions) +
            ", got '" + value + "'";
      }
      options.new_tokens = *n;
    } else if (name == "--logits_path") {
      options.logits_path = value;
    } else if (name == "--verification") {
      if (value == "internal_consistency") {
        options.verification = Program::Verification::InternalConsistency;
      } else if (value == "minimal") {
        options.verification = Program::Verification::Minimal;
      } else {
        return "--verification must be internal_consistency or minimal, got '" + value + "'";
      }
    } else {
      return "unknown option " + name;
    }
  }
  if (list_registered) {
    return std::nullopt;
  }
  if (model_path.empty()) {
    return "--model_path is required";
  }
  if (options.prompt.empty() != (options.new_tokens == 0)) {
    return "--prompt and --new_tokens go together (greedy decoding)";
  }
  if (!options.logits_path.empty() && options.prompt.empty()) {
    return "--logits_path needs --prompt and --new_tokens";
  }
  return std::nullopt;
}

} // namespace

int main(int argc, char** argv) {
  custom_ops_runner::install_runtime_hooks(/*turn_aborts_into_errors=*/true);
  std::string model_path;
  RunOptions options;
  bool list_registered = false;
  if (auto err = parse_options(argc, argv, model_path, options, list_registered)) {
    std::fputs(kUsage, err->empty() ? stdout : stderr);
    if (err->empty()) {
      return 0;
    }
    std::fprintf(stderr, "error: %s\n", err->c_str());
    return 2;
  }
  if (list_registered) {
    custom_ops_runner::print_registered();
    return 0;
  }
  if (!std::ifstream(model_path, std::ios::binary)) {
    std::fprintf(stderr, "error: cannot open model file '%s': %s\n", model_path.c_str(), std::strerror(errno));
    return 1;
  }
  auto loader = executorch::extension::FileDataLoader::from(model_path.c_str());
  if (!loader.ok()) {
    std::fprintf(stderr, "error: cannot read model file '%s'\n", model_path.c_str());
    return 1;
  }
  return custom_ops_runner::run_program(
      std::make_unique<executorch::extension::FileDataLoader>(std::move(*loader)), model_path, options);
}
