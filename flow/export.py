"""The export step of the flow: torch.export -> EXIR edge dialect -> ExecuTorch program (.pte), with the exported
program saved beside it (.pt2) so the verifier can rerun the same model in eager PyTorch.

EXIR swaps each functional custom op for its registered `.out` variant, so memory planning can give every output a
planned buffer. For any op declared in custom_ops.bzl (registered with PyTorch first):

    python -m flow.export --op NAME [--output_dir DIR] [--aot_library PATH | --jit] [--etrecord]

and `python custom_ops_1.py` / `python custom_ops_2.py` do the same for their own op (example_main()).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import warnings
from typing import Any, Sequence

import torch

from flow import REPO_ROOT, runtime_kernels


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


def runs_path(pte_path: str | os.PathLike) -> str:
    """Where export_example() saves a declared example's inputs, one tuple per execution (torch.save), for the
    verifier: beside the .pte, as .runs.pt."""
    return os.path.splitext(os.fspath(pte_path))[0] + ".runs.pt"


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
    partitioners: Sequence[Any] = (),
    decompositions: dict | None = None,
    check_kernels: bool = True,
) -> str:
    """Exports `model` to an ExecuTorch program at `pte_path` (and its ExportedProgram to pt2_path()); returns the path.

    plan_graph_inputs=False leaves graph inputs out of memory planning, so the runtime reads the caller's buffers
    directly instead of copying them into planned memory first (what a kernel benchmark wants).
    etrecord=True also writes an ETRecord to etrecord_path(): the graphs and the debug-handle map that let
    executorch.devtools.Inspector name each op in an ETDump from the runner (profile_program.py).
    partitioners: delegates to lower to (e.g. [XnnpackPartitioner()]), through to_edge_transform_and_lower; what they
    do not take (this project's custom ops among it) stays on the runtime's kernels.
    decompositions: {OpOverload: function} run on the exported graph (beside torch.export's defaults) before to_edge:
    how an op no kernel has is kept out of the program (docs/adding-an-op.md). The .pt2 keeps the model's own ops.
    check_kernels=False writes a program whose operators the runtime may lack (for another runtime's kernels);
    otherwise one is refused here, naming it (MissingKernelError), as is a declared ATen op's call in a dtype its
    kernel does not declare.
    """
    from executorch.exir import EdgeCompileConfig, ExecutorchBackendConfig, to_edge, to_edge_transform_and_lower
    from executorch.exir.passes import MemoryPlanningPass
    from executorch.exir.passes.init_mutable_pass import InitializedMutableBufferPass

    exported = torch.export.export(model, tuple(example_inputs), dynamic_shapes=dynamic_shapes, strict=True)
    pte_path = os.fspath(pte_path)
    os.makedirs(os.path.dirname(os.path.abspath(pte_path)), exist_ok=True)
    written_whole(pt2_path(pte_path), lambda f: torch.export.save(exported, f))
    if decompositions:
        exported = exported.run_decompositions({**torch.export.default_decompositions(), **decompositions})
    aten_ops = declared_aten_ops()
    if check_kernels:
        check_declared_dtypes(exported, aten_ops)
    # The edge dialect's IR validity check stays on: registered custom ops pass it, and so do ATen's ops outside the
    # core set that custom_ops.bzl gives a kernel (the edge dialect refuses other non-core ops).
    config = EdgeCompileConfig(_core_aten_ops_exception_list=list(aten_ops))
    try:
        if partitioners:
            edge = to_edge_transform_and_lower(exported, partitioner=list(partitioners), compile_config=config,
                                               generate_etrecord=etrecord)
        else:
            edge = to_edge(exported, compile_config=config, generate_etrecord=etrecord)
    except Exception as err:  # exir's SpecViolationError, which it does not export
        if type(err).__name__ != "SpecViolationError" or not NON_CORE_OP.search(str(err)):
            raise
        name = "aten::" + NON_CORE_OP.search(str(err)).group(1)
        raise MissingKernelError(runtime_kernels.missing_kernel_message([name], "the model") +
                                 f" ({name} is not a core ATen op, which ExecuTorch's edge dialect refuses unless a "
                                 "kernel is declared for it)") from None
    # State (a buffer the model mutates, e.g. a KV cache) starts as the module's buffer, as in eager; ExecuTorch leaves
    # a mutable buffer's planned memory uninitialized unless told. The names are known once to_edge functionalized the
    # mutation (a custom op mutating its argument is recorded as such only then).
    mutated = sorted(edge.exported_program().graph_signature.buffers_to_mutate.values())
    with warnings.catch_warnings(), out_variants_named():
        # (the emitter warns of uninitialized state on every mutated buffer, pass or not)
        warnings.filterwarnings("ignore", message="Mutation on a buffer in the model is detected")
        program = edge.to_executorch(
            ExecutorchBackendConfig(
                passes=[InitializedMutableBufferPass(mutated)] if mutated else [],
                memory_planning_pass=MemoryPlanningPass(alloc_graph_input=plan_graph_inputs),
            )
        )
    if check_kernels:
        check_runtime_has_kernels(program, pte_path)
    written_whole(pte_path, program.write_to_file)
    if etrecord:
        program.get_etrecord().save(etrecord_path(pte_path))
    return pte_path


class MissingKernelError(RuntimeError):
    """The program calls an operator no kernel of its runtime has: it would fail to load on the device."""


# How the edge dialect names an ATen op outside the core set it refuses: "torch._ops.aten.bucketize.Tensor".
NON_CORE_OP = re.compile(r"aten\.(\w+\.\w+) is not in Core ATen opset")


@contextlib.contextmanager
def out_variants_named():
    """Rewrites to_executorch's "Missing out variants: {...}" into a MissingKernelError naming each op and the fix."""
    try:
        yield
    except RuntimeError as err:
        found = re.search(r"Missing out variants: \{(.*)\}", str(err))
        if not found:
            raise
        names = ", ".join(name.strip(" '\"") for name in found.group(1).split(","))
        raise MissingKernelError(
            f"{names}: no out variant, which ExecuTorch's exporter needs of every op a program runs (it plans each "
            "output's memory). An op of yours: define its .out overload beside it (docs/adding-an-op.md). An op "
            "another library defines: add the out form from a file of your own, a FRAGMENT of its namespace defining "
            "<name>.out (the op's arguments, then `*, Tensor(a!) out`, tagged torch.Tag.out) with an eager and a fake "
            "kernel, then bind a runtime kernel to it and declare it (docs/adding-an-op.md, \"An out variant for an "
            "op you cannot edit\")") from None


def declared_aten_ops() -> dict:
    """The ATen ops custom_ops.bzl gives a runtime kernel, by their functional overload
    (torch.ops.aten.bucketize.Tensor: its DeclaredOp)."""
    from flow import declarations

    return {op.functional(): op for op in declarations.load().values() if op.from_aten}


def check_declared_dtypes(exported: torch.export.ExportedProgram, by_overload: dict) -> None:
    """Refuses a call of a declared ATen op (declared_aten_ops()) whose first tensor is in a dtype its kernel does not
    declare: PyTorch's own kernel takes it, so nothing else would stop the program before the runtime kernel refuses
    it on the device."""
    for node in exported.graph.nodes:
        op = by_overload.get(node.target) if node.op == "call_function" else None
        first = next((a.meta.get("val") for a in node.args if isinstance(a, torch.fx.Node)), None) if op else None
        dtype = str(first.dtype).removeprefix("torch.") if isinstance(first, torch.Tensor) else None
        if dtype is not None and dtype not in op.dtypes:
            raise MissingKernelError(f"{op.out_name}: the model calls it with {node.args[0]} in {dtype}, which its "
                                     f"kernel (custom_ops.bzl) does not take; it takes {', '.join(op.dtypes)}. "
                                     "Convert the input in the model, or add the dtype to the kernel and its "
                                     "declaration")


def check_runtime_has_kernels(program, where: str) -> None:
    """Refuses an ExecutorchProgramManager calling an operator that neither ExecuTorch's kernels nor a declared op
    has (flow/runtime_kernels.py), naming each: on the device it would be "Missing operator" at load."""
    operators = [f"{o.name}.{o.overload}" if o.overload else o.name
                 for plan in program.executorch_program.execution_plan for o in plan.operators]
    missing = runtime_kernels.without_kernel(operators)
    if missing:
        raise MissingKernelError(runtime_kernels.missing_kernel_message(missing, f"the program for {where}"))


def written_whole(path: str, write) -> str:
    """write(file) into a file beside `path`, then renamed to it: a reader (another run of the flow, in parallel) sees
    the old file or the new one, never half of one."""
    partial = f"{path}.{os.getpid()}.partial"
    try:
        with open(partial, "wb") as f:
            write(f)
        os.replace(partial, path)
    finally:
        if os.path.exists(partial):
            os.remove(partial)
    return path


def example_of(op, seed: int = 0):
    """(model, runs) of the declared op `op`: the module the flow exports, and the inputs of each execution in order
    (the first is what export traces with; more than one when the program keeps state across executions). A declared
    example_model gives both; otherwise the model is one call of the op on its example_inputs."""
    from flow.declarations import DeclarationError, import_repository_module

    if op.example_model is None:
        return CallOp(op.functional()), [op.make_example_inputs(seed)]
    module, _, function = op.example_model.rpartition(".")
    try:
        factory = getattr(import_repository_module(module), function)
    except (ImportError, AttributeError) as err:
        raise DeclarationError(f"{op.name}: its example_model {op.example_model!r} cannot be imported ({err})") from None
    model, runs = factory()
    if not (isinstance(model, torch.nn.Module) and runs and all(isinstance(run, tuple) for run in runs)):
        raise DeclarationError(f"{op.name}: {op.example_model}() must return (model, runs): a torch.nn.Module and a "
                               "non-empty list of input tuples, one per execution")
    return model, list(runs)


def export_example(op, output_dir: str | os.PathLike, *, etrecord: bool = False) -> str:
    """Exports the example model of the declared op `op` (a declarations.DeclaredOp, registered with PyTorch) to
    <output_dir>/<example_program>.pte (its ETRecord beside it with etrecord=True). A declared example_model's runs are
    saved beside it (runs_path()), so the verifier feeds the executions the example means (a cache position in range,
    positions in order) instead of random tensors."""
    model, runs = example_of(op)
    pte = export_to_pte(model, runs[0], os.path.join(output_dir, f"{op.example_program}.pte"), etrecord=etrecord)
    if op.example_model is not None:
        written_whole(runs_path(pte), lambda f: torch.save(runs, f))
    else:
        try:
            os.remove(runs_path(pte))  # an older export's: its inputs are not this program's
        except FileNotFoundError:
            pass
    return pte


def _parser(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--output_dir", default=REPO_ROOT, help="where to write the .pte (default: the repo root)")
    library = parser.add_mutually_exclusive_group()
    library.add_argument("--aot_library", "--so_library", dest="aot_library",
                         help="libcustom_ops_aot_lib.so, for ops registered from C++ (default: the op's CMake build, "
                              "cmake-out/<example_program>/)")
    library.add_argument("--jit", action="store_true", help="build the AOT library with torch.utils.cpp_extension")
    parser.add_argument("--etrecord", action="store_true", help="also write <program>.etrecord for the devtools")
    return parser


def _export(ops, args) -> int:
    from flow import declarations, registration

    try:
        if args.jit:
            cpp_ops = [op for op in ops if op.from_cpp]
            if not cpp_ops:
                raise RuntimeError(f"--jit builds the AOT library of ops registered from C++; "
                                   f"{', '.join(op.name for op in ops)} is registered from Python")
            print(f"Built and loaded {registration.build_jit_library(cpp_ops)}")
        registration.register_with_pytorch(ops, aot_library=args.aot_library)
        for op in ops:
            print(f"Exported {export_example(op, args.output_dir, etrecord=args.etrecord)}")
    except (declarations.DeclarationError, OSError, RuntimeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


def example_main(program: str) -> None:
    """The command line of an example module (custom_ops_1.py, custom_ops_2.py): registers the ops whose example
    program it is and exports them."""
    from flow import declarations

    args = _parser(f"Registers the op(s) of {program} with PyTorch and exports {program}.pte").parse_args()
    try:
        ops = declarations.with_example_program(program)
    except declarations.DeclarationError as err:
        sys.exit(f"error: {err}")
    sys.exit(_export(ops, args))


def main() -> int:
    from flow import declarations

    parser = _parser("Exports the example program of a declared op to <program>.pte")
    parser.add_argument("--op", required=True, action="append",
                        help="a declared op, e.g. mul3 or my_ops::mul3 (repeat it to export several in one process)")
    args = parser.parse_args()
    try:
        ops = [declarations.find(name) for name in args.op]
    except declarations.DeclarationError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return _export(ops, args)


if __name__ == "__main__":
    sys.exit(main())
