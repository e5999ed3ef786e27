// Part of the runner's pre-load checks (program_runner.cpp): every kernel call of a .pte against the value kinds its
// operator's schema declares. ExecuTorch's own kernels (aten, prims, quantized) unbox their arguments unchecked, so a
// call passing an Int where the kernel takes a Tensor would abort the process (EValue::toTensor()'s ET_CHECK). The
// table is argument_kinds.h, generated from PyTorch's schemas at build time (flow/argument_kinds.py); flow/program.py
// makes the same check in the same words for the Python runtime.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace custom_ops_runner {

// The operators of every method of the program, as "ns::op.overload" (empty when it cannot be read).
std::vector<std::string> program_operators(const uint8_t* data, size_t size);

// The first kernel call naming an operator the method lacks, or passing a number or kinds of values its schema does
// not take; nullopt when every call matches (operators the table does not list are left to their kernels' checks).
std::optional<std::string> check_kernel_calls(const uint8_t* data, size_t size);

// The first tensor value whose dtype has no element size in this runtime (out of range, or a number ExecuTorch does
// not define): MethodMeta's tensor accessors would abort on it (elementSize's ET_CHECK) instead of returning an error.
std::optional<std::string> check_tensor_dtypes(const uint8_t* data, size_t size);

// Bytes per element of a dtype number ExecuTorch defines; 0 for any other number (the check above, the data file's).
size_t element_size(int8_t dtype);

// The first input tensor whose data is the program's own (a constant buffer, or external named data): ExecuTorch's
// set_input would copy the caller's values over those bytes, read-only where the program is mapped from a file.
std::optional<std::string> check_input_data(const uint8_t* data, size_t size);

// How many tensor values of the program keep their bytes in a named data file (.ptd) outside it: the runtime reads
// them from the data map it is given, and fails the method without one.
size_t external_tensors(const uint8_t* data, size_t size);

// Whether ExecuTorch's kernel libraries (the wheel's optimized and quantized kernels) register `name`, and whether
// `name` is of one of ExecuTorch's own namespaces (aten, prims, quantized_decomposed, ...): from the same generated
// table, for the message naming what to do about an operator no linked library registers.
bool executorch_ships_kernel(const std::string& name);
bool in_runtime_namespace(const std::string& name);

} // namespace custom_ops_runner
