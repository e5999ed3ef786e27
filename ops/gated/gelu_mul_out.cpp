// The kernel of my_ops::gelu_mul.out (gated.py registers the op with PyTorch): out = gelu_tanh(gate) * up element by
// element (gelu_mul_rows.h: one exp where ExecuTorch's gelu kernel takes a tanh per lane, the gelu rounded to the
// dtype, then the product). Within a few ulp of ATen's gelu(approximate="tanh") * up, not its bits: ExecuTorch's gelu
// calls libm's tanhf lane by lane, which cost a third of Gemma 3's prefill.
// ExecuTorch mode: the runtime kernel; ATen mode: the CPU kernel gelu_mul_without_python.cpp registers.
#include "declared_dtypes/my_ops/gelu_mul.h"
#include "kernel_helpers/gated_activation.h"
#include "ops/gated/gelu_mul_rows.h"

CUSTOM_OPS_GATED_OUT_KERNEL(gelu_mul, geglu::gelu_mul_range)
