// What codegen's registration sources include around the kernels it writes (codegen/templates/: registered from a
// static initializer, RegisterCodegenUnboxedKernels.cpp, or when the application calls register_all_kernels(),
// RegisterKernels.cpp): ExecuTorch's kernel types and the checked unboxing every generated kernel opens with.
#pragma once

#include <executorch/runtime/core/evalue.h>
#include <executorch/runtime/core/event_tracer_hooks.h>
#include <executorch/runtime/core/exec_aten/exec_aten.h>
#include <executorch/runtime/core/exec_aten/util/tensor_util.h>
#include <executorch/runtime/core/span.h>
#include <executorch/runtime/core/tag.h>
#include <executorch/runtime/kernel/operator_registry.h>
#include <executorch/runtime/platform/log.h>
#include <executorch/runtime/platform/profiler.h>

#include "kernel_helpers/checked_unboxing.h"

#include <cstddef>

// 0 until the kernels are registered, 1 by a static initializer, 2 by register_all_kernels(), -1 when registering
// failed. The generated source defines it; a runner reads it through a weak reference (runner/program_runner.cpp).
extern "C" int custom_ops_kernels_registered;

namespace custom_ops {

// Registers a generated table of kernels and records how (`registered_as`: 1 or 2) in custom_ops_kernels_registered.
template <size_t N>
::executorch::runtime::Error register_table(const ::executorch::runtime::Kernel (&kernels)[N], int registered_as) {
  using ::executorch::runtime::Kernel;
  const auto status = ::executorch::runtime::register_kernels(::executorch::runtime::Span<const Kernel>(kernels, N));
  custom_ops_kernels_registered = status == ::executorch::runtime::Error::Ok ? registered_as : -1;
  return status;
}

}  // namespace custom_ops
