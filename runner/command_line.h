// The command line of both runners: custom_ops_executor_runner (a .pte through ExecuTorch) and custom_ops_aoti_runner
// (a torch._inductor package through AOTInductor). One table of flags says which runner takes each; one parser reads
// them the same way (--name=value or --name value) and checks every combination before anything is read, so a flag
// means the same in both, and a flag a runner does not support is an error there, never ignored. Neither ExecuTorch
// nor ATen is needed here.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace custom_ops_runner {

enum class Runner { kExecuTorch, kAotInductor };

// Largest --num_executions / --new_tokens accepted (a typo such as 99999999999999999999 is an error, not an endless
// run).
constexpr uint64_t kMaxCount = 1000000;
// Default --max_memory: planned buffers plus inputs (1 GiB).
constexpr uint64_t kDefaultMaxMemory = uint64_t{1} << 30;
// Default --debug_buffer_size: room for the intermediate outputs of every execution (64 MiB).
constexpr uint64_t kDefaultDebugBufferSize = uint64_t{64} << 20;

// An input's dtype and shape as --input_specs gives it ("float32:2x3"; a 0-d tensor: "float32:").
struct InputSpec {
  std::string dtype;  // one of kSpecDtypes
  std::vector<int64_t> shape;
};
extern const char* const kSpecDtypes[10];

struct CommandLine {
  bool help = false;
  bool list_registered = false;
  std::string program;  // --model_path (ExecuTorch) or --package (AOTInductor)
  std::string data_path;  // ExecuTorch: the named data file (.ptd) holding the weights the program names
  std::string method = "forward";
  // One list per --inputs flag: execution N takes list N modulo their count (state across executions).
  std::vector<std::vector<std::string>> inputs;
  std::optional<std::vector<std::vector<int32_t>>> input_shapes;  // ExecuTorch: shapes for dynamic programs
  std::vector<InputSpec> input_specs;                             // AOTInductor: each input's dtype and shape
  std::vector<std::string> outputs;
  std::vector<std::string> op_libraries;
  uint64_t num_executions = 1;
  uint64_t max_memory = kDefaultMaxMemory;
  bool minimal_verification = false;
  std::string etdump_path;
  std::string debug_buffer_path;
  uint64_t debug_buffer_size = kDefaultDebugBufferSize;
  std::vector<int64_t> prompt;
  uint64_t new_tokens = 0;
  std::string logits_path;
};

// Parses and checks `argv` for `runner`. Returns the error message, or nullopt when the command line is usable
// (`help` set: print usage(runner) and stop).
std::optional<std::string> parse_command_line(int argc, char** argv, Runner runner, CommandLine& out);

// The usage text of `runner`, from the same table the parser reads.
std::string usage(Runner runner);

// Checked number parsing, no sign, no overflow, no trailing junk: nullopt on any of those.
std::optional<uint64_t> parse_count(const std::string& text, uint64_t max);
// A byte count with an optional binary suffix: 512, 64K, 256M, 2G.
std::optional<uint64_t> parse_bytes(const std::string& text);
// A shape like 2x3 ("" for a 0-d tensor), each dimension 0 to INT32_MAX (ExecuTorch's sizes are int32).
std::optional<std::vector<int32_t>> parse_shape(const std::string& text);

} // namespace custom_ops_runner
