// Part of the runner's pre-load checks (program_runner.cpp): the delegates of a .pte, read before ExecuTorch and the
// backend see them. XNNPACK's compiler verifies its flatbuffer but trusts each constant tensor's dims against the
// bytes stored for it, so a corrupt dim makes it read far past the weights (a mutated decoder.pte did: SIGSEGV in
// xnn_create_fully_connected_nc_f32). flow/program.py makes the same check for the Python runtime.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace custom_ops_runner {

// The first problem found in the delegates of the program `data` (the whole .pte), or nullopt: an entry without its
// backend id, data or compile specs (ExecuTorch's BackendDelegate::Init reads them unchecked), or an XNNPACK payload
// that fails check_xnnpack_payload. A payload that cannot be located is left to the runtime, which reports it.
std::optional<std::string> check_delegates(const uint8_t* data, size_t size);

// One payload: optional XH00 header, then XNNPACK's flatbuffer, then its constant data.
std::optional<std::string> check_xnnpack_payload(const uint8_t* payload, size_t size);

} // namespace custom_ops_runner
