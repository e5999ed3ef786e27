// The runner's check of a named data file (.ptd: the weights of a program exported with them outside it) before
// ExecuTorch reads it. ExecuTorch's FlatTensorDataMap trusts the file's FlatBuffers tables (no verifier runs): a
// damaged offset, a missing layout or a layout larger than its bytes is a crash or a read past the data. Every table,
// offset and size is checked here first, through the bounds-checked reader (flat_reader.h) and the layout the program
// checks use (xnnpack_layout.h).
#pragma once

#include <executorch/runtime/core/data_loader.h>

#include <optional>
#include <string>

namespace custom_ops_runner {

// The first problem of the data file `loader` reads, as words for "'<file>' is not a usable data file: ...";
// nullopt when every named tensor's layout and bytes lie within the file.
std::optional<std::string> check_data_file(executorch::runtime::DataLoader& loader);

} // namespace custom_ops_runner
