// my_ops::gelu_mul for a process without Python: its CPU kernels registered from C++ (gated_without_python.h; its
// schemas come from gated.py at build time), built into libcustom_ops_without_python.so, never loaded beside gated.py.
#include "ops/gated/gated_without_python.h"

CUSTOM_OPS_GATED_WITHOUT_PYTHON(gelu_mul)
