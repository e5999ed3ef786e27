"""The export step of the flow: torch.export -> EXIR edge dialect -> ExecuTorch program (.pte), with the exported
program saved beside it (.pt2) so the verifier can rerun the same model in eager PyTorch.

EXIR swaps each functional custom op for its registered `.out` variant, so memory planning can give every output a
planned buffer. custom_ops_1.py and custom_ops_2.py export their examples through export_example(); so does

    python pte_export.py --op NAME [--output_dir DIR] [--aot_library PATH] [--etrecord]

for any op declared in custom_ops.bzl (it registers the op with PyTorch first).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Sequence

import torch

REPO_ROOT = os.path.dirname(os.path.abspath(__file__))


class CallOp(torch.nn.Module):
    """A model whose forward is one call of `op` (e.g. torch.ops.my_ops.mul3.default): what the examples export."""

    def __init__(self, op):
        super().__init__()
        self.op = op

    def forward(self, x: torch.Tensor, *more: torch.Tensor) -> torch.Tensor:
        # x named apart, so dynamic_shapes=({0: Dim(...)},) addresses the first input as for any one-input model.
        return self.op(x, *more)


def pt2_path(pte_path: str | os.PathLike) -> str:
    """Where export_to_pte() saves the ExportedProgram of a .pte: beside it, as .pt2."""
    return os.path.splitext(os.fspath(pte_path))[0] + ".pt2"


def etrecord_path(pte_path: str | os.PathLike) -> str:
    """Where export_to_pte(etrecord=True) saves the ETRecord of a .pte: beside it, as .etrecord."""
    return os.path.splitext(os.fspath(pte_path))[0] + ".etrecord"


def export_to_pte(
    model: torch.nn.Module,
    example_inputs: Sequence[torch.Tensor],
    pte_path: str | os.PathLike,
    *,
    dynamic_shapes: Any = None,
    plan_graph_inputs: bool = True,
    etrecord: bool = False,
) -> str:
    """Exports `model` to an ExecuTorch program at `pte_path` (and its ExportedProgram to pt2_path()); returns the path.

    plan_graph_inputs=False leaves graph inputs out of memory planning, so the runtime reads the caller's buffers
    directly instead of copying them into planned memory first (what a kernel benchmark wants).
    etrecord=True also writes an ETRecord to etrecord_path(): the graphs and the debug-handle map that let
    executorch.devtools.Inspector name each op in an ETDump from the runner (profile_program.py).
    """
    from executorch.exir import ExecutorchBackendConfig, to_edge
    from executorch.exir.passes import MemoryPlanningPass

    exported = torch.export.export(model, tuple(example_inputs), dynamic_shapes=dynamic_shapes, strict=True)
    pte_path = os.fspath(pte_path)
    os.makedirs(os.path.dirname(os.path.abspath(pte_path)), exist_ok=True)
    torch.export.save(exported, pt2_path(pte_path))
    # The edge dialect's IR validity check stays on: registered custom ops pass it.
    edge = to_edge(exported, generate_etrecord=etrecord)
    program = edge.to_executorch(
        ExecutorchBackendConfig(memory_planning_pass=MemoryPlanningPass(alloc_graph_input=plan_graph_inputs))
    )
    with open(pte_path, "wb") as f:
        program.write_to_file(f)
    if etrecord:
        program.get_etrecord().save(etrecord_path(pte_path))
    return pte_path


def export_example(op, output_dir: str | os.PathLike, *, etrecord: bool = False) -> str:
    """Exports a model calling the declared op `op` (a declared_ops.DeclaredOp, registered with PyTorch) on its
    example inputs to <output_dir>/<example_program>.pte (and its ETRecord beside it with etrecord=True)."""
    return export_to_pte(CallOp(op.packet().default), op.make_example_inputs(),
                         os.path.join(output_dir, f"{op.example_program}.pte"), etrecord=etrecord)


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


def main() -> int:
    import declared_ops

    parser = argparse.ArgumentParser(description="Exports the example program of a declared op to <program>.pte")
    parser.add_argument("--op", required=True, help="a declared op, e.g. mul3 or my_ops::mul3")
    parser.add_argument("--output_dir", default=REPO_ROOT, help="where to write the .pte (default: the repo root)")
    parser.add_argument("--aot_library", help="libcustom_ops_aot_lib.so, for ops registered from C++")
    parser.add_argument("--etrecord", action="store_true", help="also write <program>.etrecord for the devtools")
    args = parser.parse_args()
    try:
        op = declared_ops.find(args.op)
        declared_ops.register_with_pytorch([op], aot_library=args.aot_library)
        print(f"Exported {export_example(op, args.output_dir, etrecord=args.etrecord)}")
    except (declared_ops.DeclarationError, OSError, RuntimeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
