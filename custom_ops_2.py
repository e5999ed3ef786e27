"""Step 2 of the mul4 flow: loads the C++ AOT library that registers my_ops::mul4 with PyTorch (custom_ops_2.cpp, built
into libcustom_ops_aot_lib.so by CMake, or with --jit by torch.utils.cpp_extension from the same sources), then
exports a model calling mul4 to custom_ops_2.pte.

    python custom_ops_2.py [--so_library cmake-out/custom_ops_2/libcustom_ops_aot_lib.so] [--output_dir DIR]
    python custom_ops_2.py --jit [--output_dir DIR]

Importing this module registers nothing: it holds mul4's reference, the op in ATen ops.
"""

from __future__ import annotations

import torch


def mul4_reference(input: torch.Tensor) -> torch.Tensor:
    """mul4 in ATen ops, declared as its reference (custom_ops.bzl): what the verifier and the tests compare both of
    mul4's kernels with (the runtime's, and PyTorch's CPU kernel, which shares the runtime kernel's functor)."""
    return input * 4


if __name__ == "__main__":
    from flow.export import example_main

    example_main("custom_ops_2")
