"""Writes a copy of a valid .pte whose output tensor declares other metadata (dtype, shape, dim order, where it sits in
planned memory), to reach the kernel's own checks and branches through a real program: no export path produces such
a program on purpose."""

from __future__ import annotations

import math

from executorch.exir._serialize._program import deserialize_pte_binary, serialize_pte_binary
from executorch.exir.schema import ScalarType, TensorShapeDynamism


def rewrite_output_tensor(src: str, dst: str, *, scalar_type: str | None = None, sizes: list[int] | None = None,
                          dim_order: list[int] | None = None, static: bool = False,
                          memory_offset: int | None = None) -> str:
    with open(src, "rb") as f:
        pte = deserialize_pte_binary(f.read())
    plan = pte.program.execution_plan[0]
    tensor = plan.values[plan.outputs[0]].val
    if scalar_type is not None:
        tensor.scalar_type = ScalarType[scalar_type]
    if sizes is not None:
        tensor.sizes = sizes
    if dim_order is not None:
        tensor.dim_order = dim_order
    if static:
        tensor.shape_dynamism = TensorShapeDynamism.STATIC
    if memory_offset is not None:  # byte offset of the output in its planned buffer, which grows to keep it inside
        tensor.allocation_info.memory_offset_low = memory_offset
        buffer = tensor.allocation_info.memory_id
        largest = math.prod(tensor.sizes) * 8  # bytes at the widest dtype
        plan.non_const_buffer_sizes[buffer] = max(plan.non_const_buffer_sizes[buffer], memory_offset + largest)
    with open(dst, "wb") as f:
        f.write(bytes(serialize_pte_binary(pte)))
    return dst


def edit_plan(src: str, dst: str, edit) -> str:
    """Writes a copy of a valid .pte after `edit(plan)` changed its first execution plan (an executorch.exir.schema
    ExecutionPlan: values, inputs, outputs, non_const_buffer_sizes, ...)."""
    with open(src, "rb") as f:
        pte = deserialize_pte_binary(f.read())
    edit(pte.program.execution_plan[0])
    with open(dst, "wb") as f:
        f.write(bytes(serialize_pte_binary(pte)))
    return dst


def _kernel_call(pte, operator: str | None):
    """The first kernel call of the first plan, or the first call of `operator` ("my_ops::update_cache.out")."""
    plan = pte.program.execution_plan[0]
    names = [f"{o.name}.{o.overload}" if o.overload else o.name for o in plan.operators]
    for chain in plan.chains:
        for instruction in chain.instructions:
            index = getattr(instruction.instr_args, "op_index", None)
            if index is not None and (operator is None or names[index] == operator):
                return instruction.instr_args
    raise ValueError(f"no call of {operator} in the program")


def replace_kernel_argument(src: str, dst: str, argument: int, value, operator: str | None = None) -> str:
    """Writes a copy of a valid .pte whose first kernel call (of `operator`, if given) passes `value` (an
    executorch.exir.schema value such as Int(7)) as its `argument`-th argument."""
    from executorch.exir.schema import EValue

    with open(src, "rb") as f:
        pte = deserialize_pte_binary(f.read())
    plan = pte.program.execution_plan[0]
    plan.values.append(EValue(value))
    _kernel_call(pte, operator).args[argument] = len(plan.values) - 1
    with open(dst, "wb") as f:
        f.write(bytes(serialize_pte_binary(pte)))
    return dst


def drop_kernel_argument(src: str, dst: str, argument: int, operator: str | None = None) -> str:
    """Writes a copy of a valid .pte whose first kernel call (of `operator`, if given) passes one value fewer."""
    with open(src, "rb") as f:
        pte = deserialize_pte_binary(f.read())
    del _kernel_call(pte, operator).args[argument]
    with open(dst, "wb") as f:
        f.write(bytes(serialize_pte_binary(pte)))
    return dst
