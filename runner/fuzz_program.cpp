// A libFuzzer target over the runner's path for untrusted programs (program_runner.h): each input is a .pte, loaded
// from memory, verified, pre-flighted against a 64 MiB budget and run on all-ones inputs with this build's kernels.
// ExecuTorch's own aborts stay aborts here (no error-line hook), so libFuzzer reports them as findings. Built with
// -DCUSTOM_OPS_FUZZ=ON and clang; tests/test_fuzz.py runs it, README says how to run it longer.
#include <executorch/extension/data_loader/buffer_data_loader.h>

#include <cstdint>
#include <memory>

#include "program_runner.h"

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  custom_ops_runner::install_runtime_hooks(/*turn_aborts_into_errors=*/false, /*print_log=*/false);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  custom_ops_runner::RunOptions options;
  options.max_memory = uint64_t{64} << 20;
  options.quiet = true;
  custom_ops_runner::run_program(
      std::make_unique<executorch::extension::BufferDataLoader>(data, size), "<fuzz input>", options);
  return 0;
}
