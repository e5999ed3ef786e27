// The last step of the flow: loads a .pte and runs one of its methods with the kernels linked into this binary
// (libcustom_ops_lib.so for my_ops::*, ExecuTorch's optimized aten kernels for the rest). The program is untrusted
// input (program_runner.h): verified, checked against a memory budget, and every failure is one "error:" line that
// names the problem and the fix, with exit code 1 (2 for a bad command line, parsed as the AOTInductor runner's is:
// command_line.h).
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "command_line.h"
#include "file_segment_loader.h"
#include "program_runner.h"

#ifdef CUSTOM_OPS_MANUAL_REGISTRATION
#include "RegisterKernels.h"  // generated with codegen's --manual_registration (CMakeLists.txt, 4b)
#endif

int main(int argc, char** argv) {
  using custom_ops_runner::Runner;
  custom_ops_runner::install_runtime_hooks(/*turn_aborts_into_errors=*/true);
  custom_ops_runner::RunOptions options;
  if (auto err = custom_ops_runner::parse_command_line(argc, argv, Runner::kExecuTorch, options)) {
    std::fputs(custom_ops_runner::usage(Runner::kExecuTorch).c_str(), stderr);
    std::fprintf(stderr, "error: %s\n", err->c_str());
    return 2;
  }
  if (options.help) {
    std::fputs(custom_ops_runner::usage(Runner::kExecuTorch).c_str(), stdout);
    return 0;
  }
#if defined(CUSTOM_OPS_MANUAL_REGISTRATION) && !defined(CUSTOM_OPS_MANUAL_REGISTRATION_NOT_CALLED)
  // A kernel library generated with --manual_registration registers nothing until the application asks, once.
  if (const auto status = torch::executor::register_all_kernels(); status != executorch::runtime::Error::Ok) {
    std::fprintf(stderr, "error: registering the kernel library failed (error 0x%x): an operator it holds is "
                 "registered already, or the registry is full\n", static_cast<unsigned>(status));
    return 1;
  }
#elif defined(CUSTOM_OPS_MANUAL_REGISTRATION)
  // The tests' runner that links the registration but never calls it, as an application that forgot the call.
  volatile auto linked = &torch::executor::register_all_kernels;
  (void)linked;
#endif
  if (options.list_registered) {
    custom_ops_runner::print_registered();
    return 0;
  }
  if (!std::ifstream(options.program, std::ios::binary)) {
    std::fprintf(stderr, "error: cannot open model file '%s': %s\n", options.program.c_str(), std::strerror(errno));
    return 1;
  }
  // The program's pieces in memory of the runner's own, its weights on huge pages where the system has them
  // (file_segment_loader.h).
  auto loader = custom_ops_runner::FileSegmentLoader::from(options.program.c_str());
  if (!loader.ok()) {
    std::fprintf(stderr, "error: cannot read model file '%s'\n", options.program.c_str());
    return 1;
  }
  // A named data file (--data_path): read whole, on huge pages (its weights are what a decode step streams).
  std::unique_ptr<custom_ops_runner::FileSegmentLoader> data_loader;
  if (!options.data_path.empty()) {
    if (!std::ifstream(options.data_path, std::ios::binary)) {
      std::fprintf(stderr, "error: cannot open data file '%s': %s\n", options.data_path.c_str(), std::strerror(errno));
      return 1;
    }
    auto data = custom_ops_runner::FileSegmentLoader::from(options.data_path.c_str(), /*whole=*/true);
    if (!data.ok()) {
      std::fprintf(stderr, "error: cannot read data file '%s'\n", options.data_path.c_str());
      return 1;
    }
    data_loader = std::make_unique<custom_ops_runner::FileSegmentLoader>(std::move(*data));
  }
  const int status = custom_ops_runner::run_program(
      std::make_unique<custom_ops_runner::FileSegmentLoader>(std::move(*loader)), options.program, options,
      std::move(data_loader));
  custom_ops_runner::print_path_counts();
  return status;
}
