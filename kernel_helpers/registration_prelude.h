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
