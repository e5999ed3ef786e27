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

// What run_program does: the parsed command line (command_line.h: inputs, outputs, executions, memory budget,
// profiling, greedy decoding), plus what only the fuzz target sets.
struct RunOptions : CommandLine {
  bool quiet = false;  // no log, no error line, no outputs (the fuzz target)

  executorch::runtime::Program::Verification verification() const {
    return minimal_verification ? executorch::runtime::Program::Verification::Minimal
                                : executorch::runtime::Program::Verification::InternalConsistency;
  }
};

// Runs `options.method` of the program `loader` reads (named `program_name` in messages), with the named data file
// `data_loader` reads (options.data_path; null: none). Returns 0, or 1 after printing one `error:` line.
int run_program(
    std::unique_ptr<executorch::runtime::DataLoader> loader,
    const std::string& program_name,
    const RunOptions& options,
    std::unique_ptr<executorch::runtime::DataLoader> data_loader = nullptr);

// Prints the operators and backends linked into this process, one per line ("operator my_ops::mul3.out",
// "backend XnnpackBackend"), sorted: what a program may use (flow/program.py's missing_from() reads this).
void print_registered();

// With CUSTOM_OPS_COUNT_PATHS=1 the kernels count which code did their work (kernel_helpers/elementwise_loop.h): prints
// "path counts:" and the counts in that enum's order on stderr (flow/runner.py reads them; a runner under an emulator
// has no other way to say). Nothing otherwise, or when the kernel library has no counters.
void print_path_counts();

// Installs the ExecuTorch log hook (keeps the details the final error line repeats) and turns ExecuTorch's own
// aborts, and uncaught exceptions, into an `error:` line naming the program instead of a signal.
void install_runtime_hooks(bool turn_aborts_into_errors, bool print_log = true);

} // namespace custom_ops_runner
