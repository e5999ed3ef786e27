// Part of the runner's pre-load checks (program_runner.cpp): the delegates of a .pte, read before ExecuTorch and the
// backend see them. XNNPACK's compiler verifies its graph's FlatBuffers structure but trusts what the fields say (a
// weight dim larger than its bytes made it read 512 MiB past them), so every field it trusts is checked here first.
// flow/xnnpack_payload.py makes the same checks for the Python runtime; both read the layout of
// flow/xnnpack_layout.py (runner/xnnpack_layout.h), and docs/untrusted-programs.md lists the fields.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace custom_ops_runner {

// The first problem found in the delegates of the program `data` (the whole .pte), or nullopt: an entry without its
// backend id, data or compile specs (ExecuTorch's BackendDelegate::Init reads them unchecked), or an XNNPACK payload
// that fails check_xnnpack_payload. A payload that cannot be located is left to the runtime, which reports it.
std::optional<std::string> check_delegates(const uint8_t* data, size_t size);

// The first list value (IntList, TensorList, OptionalTensorList: indices of other values) with an item naming a value
// of another kind, or nullopt. ExecuTorch's BoxedEvalueList reads each item with an ET_CHECK (libFuzzer: an IntList
// item naming a Tensor aborted in et_view). The same words as flow/program.py's list_problem().
std::optional<std::string> check_value_lists(const uint8_t* data, size_t size);

// What one payload's checks may compare with in the program around it.
struct PayloadContext {
  const std::map<std::string, uint64_t>* named_data = nullptr;  // key -> bytes the program holds; null: not checked
  std::optional<uint64_t> delegate_args;  // the fewest arguments any call of the delegate passes
};

// One payload: optional XH00 header, then XNNPACK's flatbuffer, then its constant data.
std::optional<std::string> check_xnnpack_payload(const uint8_t* payload, size_t size, const PayloadContext& context);

// Every field the checks read, one "name=value" line each, as flow/xnnpack_payload.py's describe() prints them (the
// serializer round-trip test compares both with what ExecuTorch's serializer wrote). Empty when unreadable.
std::vector<std::string> describe_xnnpack_payload(const uint8_t* payload, size_t size);

} // namespace custom_ops_runner
