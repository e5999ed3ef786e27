// The runner's load -> verify -> pre-flight -> run path, shared by the command line (custom_ops_executor_runner.cpp)
// and the fuzz target (fuzz_program.cpp). A .pte is untrusted input: the program is verified before use, every size
// it declares is checked against a memory budget before anything is allocated, planned memory is allocated here
// (checked, zeroed), and every failure ends in one `error:` line and exit code 1.
#pragma once

#include <executorch/runtime/executor/program.h>
#include <executorch/runtime/platform/compiler.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "command_line.h"

namespace executorch {
namespace runtime {
class DataLoader;
}
} // namespace executorch

namespace custom_ops_runner {

struct RunOptions {
  std::string method = "forward";
  // Raw input files, one list per --inputs flag: execution N takes list N modulo their count (a program with state
  // gets each step's inputs). Empty: every input filled with ones.
  std::vector<std::vector<std::string>> inputs;
  std::optional<std::vector<std::vector<int32_t>>> input_shapes;  // per input, for dynamic programs
  std::vector<std::string> outputs;                       // raw output files
  uint64_t num_executions = 1;
  uint64_t max_memory = kDefaultMaxMemory;
  executorch::runtime::Program::Verification verification =
      executorch::runtime::Program::Verification::InternalConsistency;
  bool quiet = false;  // no log, no error line, no outputs (the fuzz target)
  // Profiling (ExecuTorch devtools): an ETDump of every execution's events, and optionally every intermediate output
  // in a debug buffer that the ETDump indexes. Both files are opened before the program is loaded.
  std::string etdump_path;
  std::string debug_buffer_path;
  uint64_t debug_buffer_size = kDefaultDebugBufferSize;
  // Greedy decoding, for a language model whose method takes (tokens int64 [1, T], input_pos int64 [1]) and returns
  // the last position's logits (float32 [1, vocab]), keeping its KV cache as state: the prompt runs at position 0
  // (prefill), then each step's argmax is fed back at the next position. --num_executions repeats the whole
  // generation. Empty prompt: the method runs on --inputs instead.
  std::vector<int64_t> prompt;
  uint64_t new_tokens = 0;
  std::string logits_path;  // every step's logits of the last generation, float32, one row after another
};

// Runs `options.method` of the program `loader` reads (named `program_name` in messages). Returns 0, or 1 after
// printing one `error:` line.
int run_program(
    std::unique_ptr<executorch::runtime::DataLoader> loader,
    const std::string& program_name,
    const RunOptions& options);

// Prints the operators and backends linked into this process, one per line ("operator my_ops::mul3.out",
// "backend XnnpackBackend"), sorted: what a program may use (flow/program.py's missing_from() reads this).
void print_registered();

// Installs the ExecuTorch log hook (keeps the details the final error line repeats) and turns ExecuTorch's own
// aborts, and uncaught exceptions, into an `error:` line naming the program instead of a signal.
void install_runtime_hooks(bool turn_aborts_into_errors, bool print_log = true);

} // namespace custom_ops_runner
