// The kernel-call check of the runner (kernel_calls.h), over the Program's FlatBuffers tables (flat_reader.h), the
// field slots from xnnpack_layout.h and the schemas' kinds from the generated argument_kinds.h.
#include "kernel_calls.h"

#include <algorithm>
#include <cstring>
#include <string_view>
#include <vector>

#include <executorch/runtime/core/portable_type/scalar_type.h>

#include "argument_kinds.h"
#include "flat_reader.h"
#include "xnnpack_layout.h"

namespace custom_ops_runner {
namespace {

namespace L = xnnpack_layout;
namespace K = argument_kinds;

const K::Operator* find_operator(const std::string& name) {
  const auto* begin = std::begin(K::kOperators);
  const auto* end = std::end(K::kOperators);
  const auto* it = std::lower_bound(begin, end, name, [](const K::Operator& op, const std::string& key) {
    return std::strcmp(op.name, key.c_str()) < 0;
  });
  return it != end && name == it->name ? it : nullptr;
}

bool in_sorted(const char* const* begin, const char* const* end, const std::string& name) {
  const auto* it = std::lower_bound(begin, end, name, [](const char* entry, const std::string& key) {
    return std::strcmp(entry, key.c_str()) < 0;
  });
  return it != end && name == *it;
}

constexpr uint8_t kTensorTag = 5;  // KernelTypes: Tensor's tag (its index in kKernelTypes, plus one)

// flow/program.py words it the same.
std::string input_data_problem(size_t input, uint32_t buffer) {
  return "input " + std::to_string(input) + " is data the program holds (" +
      (buffer != 0 ? "constant buffer " + std::to_string(buffer) : std::string("external data")) +
      "), not planned memory or the caller's: setting it would write over the program's own bytes";
}

// A method's operators as "ns::op.overload", in the order kernel calls index them.
std::vector<std::string> operator_names(FlatReader& r, size_t plan) {
  std::vector<std::string> names;
  for (size_t op : r.tables(plan, L::ExecutionPlan::kOperators).value_or(std::vector<size_t>{})) {
    const std::string overload = r.string(op, L::Operator::kOverload).value_or("");
    names.push_back(r.string(op, L::Operator::kName).value_or("") + (overload.empty() ? "" : "." + overload));
  }
  return names;
}

} // namespace

size_t element_size(int8_t dtype) {
  switch (static_cast<executorch::runtime::etensor::ScalarType>(dtype)) {
#define CUSTOM_OPS_DTYPE_SIZE(ctype, name)               \
  case executorch::runtime::etensor::ScalarType::name: \
    return sizeof(ctype);
    ET_FORALL_SCALAR_TYPES(CUSTOM_OPS_DTYPE_SIZE)
#undef CUSTOM_OPS_DTYPE_SIZE
    default:
      return 0;
  }
}

std::optional<std::string> check_tensor_dtypes(const uint8_t* data, size_t size) {
  static_assert(std::string_view(L::kKernelTypes[kTensorTag - 1]) == "Tensor");
  FlatReader r(data, size);
  const size_t program = r.target(0);
  for (size_t plan : r.tables(program, L::Program::kExecutionPlan).value_or(std::vector<size_t>{})) {
    const auto values = r.tables(plan, L::ExecutionPlan::kValues).value_or(std::vector<size_t>{});
    for (size_t i = 0; i < values.size() && r.ok(); ++i) {
      if (r.scalar<uint8_t>(values[i], L::EValue::kValType) != kTensorTag) {
        continue;
      }
      const size_t tensor = r.child(values[i], L::EValue::kVal);
      const int8_t dtype = tensor == 0 ? 0 : r.scalar<int8_t>(tensor, L::Tensor::kScalarType);
      if (r.ok() && element_size(dtype) == 0) {
        return "value " + std::to_string(i) + " is a tensor of dtype " + std::to_string(dtype) +
            ", which this ExecuTorch does not define; the program is damaged or was written for another version";
      }
    }
  }
  return std::nullopt;
}

std::optional<std::string> check_input_data(const uint8_t* data, size_t size) {
  FlatReader r(data, size);
  const size_t program = r.target(0);
  for (size_t plan : r.tables(program, L::Program::kExecutionPlan).value_or(std::vector<size_t>{})) {
    const auto values = r.tables(plan, L::ExecutionPlan::kValues).value_or(std::vector<size_t>{});
    const auto inputs = r.scalars<int32_t>(plan, L::ExecutionPlan::kInputs).value_or(std::vector<int32_t>{});
    for (size_t i = 0; i < inputs.size() && r.ok(); ++i) {
      const int32_t value = inputs[i];
      if (value < 0 || static_cast<size_t>(value) >= values.size() ||
          r.scalar<uint8_t>(values[value], L::EValue::kValType) != kTensorTag) {
        continue;  // the pre-flight names an input outside the values; other kinds hold no data
      }
      const size_t tensor = r.child(values[value], L::EValue::kVal);
      const uint32_t buffer = tensor == 0 ? 0 : r.scalar<uint32_t>(tensor, L::Tensor::kDataBufferIdx);
      const size_t extra = tensor == 0 ? 0 : r.child(tensor, L::Tensor::kExtraTensorInfo);
      const bool external =
          extra != 0 && r.scalar<int8_t>(extra, L::ExtraTensorInfo::kLocation) == L::kTensorDataExternal;
      if (r.ok() && (buffer != 0 || external)) {
        return input_data_problem(i, buffer);
      }
    }
  }
  return std::nullopt;
}

size_t external_tensors(const uint8_t* data, size_t size) {
  FlatReader r(data, size);
  size_t count = 0;
  for (size_t plan : r.tables(r.target(0), L::Program::kExecutionPlan).value_or(std::vector<size_t>{})) {
    for (size_t value : r.tables(plan, L::ExecutionPlan::kValues).value_or(std::vector<size_t>{})) {
      if (!r.ok() || r.scalar<uint8_t>(value, L::EValue::kValType) != kTensorTag) {
        continue;
      }
      const size_t tensor = r.child(value, L::EValue::kVal);
      const size_t extra = tensor == 0 ? 0 : r.child(tensor, L::Tensor::kExtraTensorInfo);
      count += extra != 0 && r.scalar<int8_t>(extra, L::ExtraTensorInfo::kLocation) == L::kTensorDataExternal;
    }
  }
  return r.ok() ? count : 0;
}

std::vector<std::string> program_operators(const uint8_t* data, size_t size) {
  FlatReader r(data, size);
  std::vector<std::string> all;
  for (size_t plan : r.tables(r.target(0), L::Program::kExecutionPlan).value_or(std::vector<size_t>{})) {
    const std::vector<std::string> names = operator_names(r, plan);
    all.insert(all.end(), names.begin(), names.end());
  }
  return all;
}

std::optional<std::string> check_kernel_calls(const uint8_t* data, size_t size) {
  constexpr size_t kTypes = sizeof(L::kKernelTypes) / sizeof(L::kKernelTypes[0]);
  FlatReader r(data, size);
  const size_t program = r.target(0);
  for (size_t plan : r.tables(program, L::Program::kExecutionPlan).value_or(std::vector<size_t>{})) {
    std::vector<uint8_t> tags;
    for (size_t value : r.tables(plan, L::ExecutionPlan::kValues).value_or(std::vector<size_t>{})) {
      tags.push_back(r.scalar<uint8_t>(value, L::EValue::kValType));
    }
    const std::vector<std::string> names = operator_names(r, plan);
    for (size_t chain : r.tables(plan, L::ExecutionPlan::kChains).value_or(std::vector<size_t>{})) {
      for (size_t instruction : r.tables(chain, L::Chain::kInstructions).value_or(std::vector<size_t>{})) {
        if (!r.ok() || r.scalar<uint8_t>(instruction, L::Instruction::kInstrArgsType) != L::kInstructionKernelCall) {
          continue;
        }
        const size_t call = r.child(instruction, L::Instruction::kInstrArgs);
        const int32_t op_index = r.scalar<int32_t>(call, L::KernelCall::kOpIndex);
        if (op_index < 0 || static_cast<size_t>(op_index) >= names.size()) {
          return "a kernel call names operator " + std::to_string(op_index) + ", but the method has " +
              std::to_string(names.size());
        }
        const std::string& name = names[op_index];
        const K::Operator* op = find_operator(name);
        if (op == nullptr) {
          continue;
        }
        const auto args = r.scalars<int32_t>(call, L::KernelCall::kArgs).value_or(std::vector<int32_t>{});
        if (args.size() != op->count) {
          return name + " is called with " + std::to_string(args.size()) + " values, its schema has " +
              std::to_string(op->count - 1) + " arguments plus the result";
        }
        for (uint32_t i = 0; i < op->count; ++i) {  // the arguments, then the result
          const K::Argument& argument = K::kArguments[op->first + i];
          const int32_t value = args[i];
          const bool inside = value >= 0 && static_cast<size_t>(value) < tags.size();
          const uint8_t tag = inside ? tags[value] : 0;
          if (argument.kinds == 0 || (inside && tag < 32 && (argument.kinds >> tag) & 1u)) {
            continue;
          }
          const std::string kind = !inside ? "missing" : tag >= 1 && tag <= kTypes ? L::kKernelTypes[tag - 1] :
              "of unknown kind";
          return name + ": argument " + argument.name + " is " + kind + ", but the schema declares " + argument.type;
        }
      }
    }
  }
  return std::nullopt;
}

bool executorch_ships_kernel(const std::string& name) {
  return in_sorted(std::begin(K::kExecuTorchKernels), std::end(K::kExecuTorchKernels), name);
}

bool in_runtime_namespace(const std::string& name) {
  const std::string ns = name.substr(0, name.find("::"));
  return std::any_of(std::begin(K::kRuntimeNamespaces), std::end(K::kRuntimeNamespaces),
                     [&](const char* runtime) { return ns == runtime; });
}

} // namespace custom_ops_runner
