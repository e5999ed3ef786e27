"""Shared export step of the flow: torch.export -> EXIR edge dialect -> ExecuTorch program (.pte).

custom_ops_1.py and custom_ops_2.py call export_to_pte() once their op is registered with PyTorch. EXIR swaps each
functional custom op for its registered `.out` variant, so memory planning can give every output a planned buffer.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import torch


class CallOp(torch.nn.Module):
    """A model whose forward is one call of `op` (e.g. torch.ops.my_ops.mul3.default): what the examples export."""

    def __init__(self, op):
        super().__init__()
        self.op = op

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.op(x)


def export_to_pte(
    model: torch.nn.Module,
    example_inputs: Sequence[torch.Tensor],
    pte_path: str | os.PathLike,
    *,
    dynamic_shapes: Any = None,
    plan_graph_inputs: bool = True,
) -> str:
    """Exports `model` to an ExecuTorch program at `pte_path` and returns the path.

    plan_graph_inputs=False leaves graph inputs out of memory planning, so the runtime reads the caller's buffers
    directly instead of copying them into planned memory first (what a kernel benchmark wants).
    """
    from executorch.exir import ExecutorchBackendConfig, to_edge
    from executorch.exir.passes import MemoryPlanningPass

    exported = torch.export.export(model, tuple(example_inputs), dynamic_shapes=dynamic_shapes, strict=True)
    edge = to_edge(exported)  # with the edge dialect's IR validity check on: registered custom ops pass it
    program = edge.to_executorch(
        ExecutorchBackendConfig(memory_planning_pass=MemoryPlanningPass(alloc_graph_input=plan_graph_inputs))
    )
    pte_path = os.fspath(pte_path)
    os.makedirs(os.path.dirname(os.path.abspath(pte_path)), exist_ok=True)
    with open(pte_path, "wb") as f:
        program.write_to_file(f)
    return pte_path


def operators_in_program(pte_path: str | os.PathLike) -> list[str]:
    """Names of the operators a .pte program calls, e.g. ["my_ops::mul3.out"] (read back from the file itself)."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    with open(pte_path, "rb") as f:
        program = deserialize_pte_binary(f.read())
    program = getattr(program, "program", program)  # newer versions wrap the Program with its data segments
    names = set()
    for plan in program.execution_plan:
        for op in plan.operators:
            names.add(f"{op.name}.{op.overload}" if op.overload else op.name)
    return sorted(names)
