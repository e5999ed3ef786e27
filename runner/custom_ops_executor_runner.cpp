// The last step of the flow: loads a .pte and runs one of its methods with the kernels linked into this binary
// (libcustom_ops_lib.so for my_ops::*, ExecuTorch's optimized aten kernels for the rest). The program is untrusted
// input (program_runner.h): verified, checked against a memory budget, and every failure is one "error:" line that
// names the problem and the fix, with exit code 1 (2 for a bad command line, parsed as the AOTInductor runner's is:
// command_line.h).
#include <executorch/extension/data_loader/file_data_loader.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "command_line.h"
#include "program_runner.h"

int main(int argc, char** argv) {
  using custom_ops_runner::Runner;
  custom_ops_runner::install_runtime_hooks(/*turn_aborts_into_errors=*/true);
  custom_ops_runner::CommandLine line;
  if (auto err = custom_ops_runner::parse_command_line(argc, argv, Runner::kExecuTorch, line)) {
    std::fputs(custom_ops_runner::usage(Runner::kExecuTorch).c_str(), stderr);
    std::fprintf(stderr, "error: %s\n", err->c_str());
    return 2;
  }
  if (line.help) {
    std::fputs(custom_ops_runner::usage(Runner::kExecuTorch).c_str(), stdout);
    return 0;
  }
  if (line.list_registered) {
    custom_ops_runner::print_registered();
    return 0;
  }
  custom_ops_runner::RunOptions options;
  options.method = line.method;
  options.inputs = line.inputs;
  options.input_shapes = line.input_shapes;
  options.outputs = line.outputs;
  options.num_executions = line.num_executions;
  options.max_memory = line.max_memory;
  options.verification = line.minimal_verification ? executorch::runtime::Program::Verification::Minimal
                                                   : executorch::runtime::Program::Verification::InternalConsistency;
  options.etdump_path = line.etdump_path;
  options.debug_buffer_path = line.debug_buffer_path;
  options.debug_buffer_size = line.debug_buffer_size;
  options.prompt = line.prompt;
  options.new_tokens = line.new_tokens;
  options.logits_path = line.logits_path;
  if (!std::ifstream(line.program, std::ios::binary)) {
    std::fprintf(stderr, "error: cannot open model file '%s': %s\n", line.program.c_str(), std::strerror(errno));
    return 1;
  }
  auto loader = executorch::extension::FileDataLoader::from(line.program.c_str());
  if (!loader.ok()) {
    std::fprintf(stderr, "error: cannot read model file '%s'\n", line.program.c_str());
    return 1;
  }
  return custom_ops_runner::run_program(
      std::make_unique<executorch::extension::FileDataLoader>(std::move(*loader)), line.program, options);
}
