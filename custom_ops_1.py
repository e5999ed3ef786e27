"""Step 1 of the mul3 flow: registers my_ops::mul3 with PyTorch from Python (torch.library), then exports a model
calling it to custom_ops_1.pte. The runtime kernel is custom_ops_1_out.cpp, bound to mul3.out in custom_ops.yaml.

Importing this module registers the ops and does nothing else (it imports only torch, so it can be copied anywhere);
`python custom_ops_1.py [--output_dir DIR]` exports.
"""

from __future__ import annotations

import torch

MUL3_FACTOR = 3
# The dtypes mul3's kernels implement, as custom_ops.bzl declares them (the build stops when the two differ: the
# runtime kernel takes its set from the declaration); accepting others here would export programs it cannot run.
DTYPES = (
    torch.float32, torch.float64, torch.float16, torch.bfloat16,
    torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
)


def mul3_reference(input: torch.Tensor) -> torch.Tensor:
    """mul3 in ATen ops, declared as its reference (custom_ops.bzl): what the verifier and the tests compare the
    runtime kernel with."""
    return input * MUL3_FACTOR


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")  # float32: the runtime kernel's spelling


# The checks and messages of the runtime kernel (kernel_helpers/kernel_contract.h), so both refuse alike.
def _check_supported(op: str, input: torch.Tensor) -> None:
    torch._check(
        input.dtype in DTYPES,
        lambda: f"{op}: input has unsupported dtype {_name(input.dtype)}; supported: "
                f"{', '.join(map(_name, DTYPES))}",
    )


def _overlaps_without_being(a: torch.Tensor, b: torch.Tensor) -> bool:
    """a and b share bytes but are not the same elements (the runtime kernel's memory check). Only plain tensors have
    memory to compare: traced ones (fake, functional) have none."""
    if type(a) is not torch.Tensor or type(b) is not torch.Tensor or a.is_meta or b.is_meta:
        return False
    if a.numel() == 0 or b.numel() == 0:
        return False
    if a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride():
        return False
    def extent(t):
        return t.data_ptr(), t.data_ptr() + (sum((n - 1) * s for n, s in zip(t.shape, t.stride())) + 1) * t.element_size()
    (a0, a1), (b0, b1) = extent(a), extent(b)
    return a0 < b1 and b0 < a1


def mul3(input: torch.Tensor) -> torch.Tensor:
    _check_supported("my_ops::mul3", input)
    return input * MUL3_FACTOR


def mul3_out(input: torch.Tensor, *, output: torch.Tensor) -> torch.Tensor:
    _check_supported("my_ops::mul3.out", input)
    torch._check(
        output.dtype == input.dtype,
        lambda: f"my_ops::mul3.out: output has dtype {_name(output.dtype)} but input has {_name(input.dtype)}; "
                "they must match",
    )
    torch._check(not _overlaps_without_being(output, input),
                 lambda: "my_ops::mul3.out: output overlaps input without being it; pass separate tensors (in "
                         "ExecuTorch: the program's memory plan is corrupt, re-export it)")
    return torch.mul(input, MUL3_FACTOR, out=output)  # resizes `output` to input's shape, like every ATen out op


def _mul3_fake(input: torch.Tensor) -> torch.Tensor:
    _check_supported("my_ops::mul3", input)
    return torch.empty_like(input)


def _mul3_backward(ctx, grad: torch.Tensor) -> torch.Tensor:
    return torch.ops.my_ops.mul3.default(grad)  # through mul3 itself, so higher-order gradients work too


def _mul3_vmap(info, in_dims, input):
    # Elementwise: the batched result is mul3 of the whole batch, batched along the same dimension.
    return torch.ops.my_ops.mul3.default(input), in_dims[0]


def _register() -> torch.library.Library:
    # A fragment, not a definition: PyTorch allows one defining library per namespace, and the C++ AOT library
    # (libcustom_ops_aot_lib.so, whose schema file codegen writes) defines my_ops. Fragments load in any order.
    lib = torch.library.Library("my_ops", "FRAGMENT")
    lib.define("mul3(Tensor input) -> Tensor")
    # Tag.out marks an out= operator (mutable args are write-only outputs it returns): functionalization, and so
    # torch.compile and opcheck, need it. Codegen gives mul4.out the same tag.
    lib.define("mul3.out(Tensor input, *, Tensor(a!) output) -> Tensor(a!)", tags=(torch.Tag.out,))
    torch.library.impl("my_ops::mul3", "CompositeExplicitAutograd", lib=lib)(mul3)
    torch.library.impl("my_ops::mul3.out", "CompositeExplicitAutograd", lib=lib)(mul3_out)
    torch.library.register_fake("my_ops::mul3", _mul3_fake, lib=lib)
    torch.library.register_autograd("my_ops::mul3", _mul3_backward, lib=lib)
    torch.library.register_vmap("my_ops::mul3", _mul3_vmap, lib=lib)
    return lib


# Once per process: the my_ops wheel carries a copy of this module (my_ops.custom_ops_1), and whichever copy is
# imported first registers; the other finds the op defined and adds nothing.
_lib = None if hasattr(torch.ops.my_ops, "mul3") else _register()


if __name__ == "__main__":
    from flow.export import example_main

    example_main("custom_ops_1")
