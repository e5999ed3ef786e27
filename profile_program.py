"""Profiling and debugging a custom kernel inside a model, with ExecuTorch's devtools: the program is exported with an
ETRecord, run in the runner with an ETDump (and a debug buffer of every intermediate output), and
executorch.devtools.Inspector joins the two into a per-op table of times over the executions.

With the debug buffer, each op's runtime output is compared with eager PyTorch computing that op *on the runtime's
own inputs* (from the same buffer), in execution order: an error is pinned to the op that made it, not smeared over
every op after it. Ops declared bit_exact are compared bit for bit, the others within dtype tolerance.

    python profile_program.py --build_dir cmake-out/all_ops [--op NAME] [--num_executions N] [--output_dir DIR]

Without --op it profiles a small MLP calling every declared op between aten ops; with --op, that op's example
program. `bash test_custom_ops.sh profile [NAME]` builds the runner first. Exit code 1 when an op's output differs.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from dataclasses import dataclass

import torch

REPO_ROOT = os.path.dirname(os.path.abspath(__file__))


class MLP(torch.nn.Module):
    """Linear -> each declared op in turn, with a ReLU after each -> Linear: the custom ops between aten ops."""

    def __init__(self, ops, width: int = 64):
        super().__init__()
        self.ops = [op.packet().default for op in ops]
        self.first = torch.nn.Linear(32, width)
        self.last = torch.nn.Linear(width, 10)

    def forward(self, x):
        x = self.first(x)
        for op in self.ops:
            x = torch.relu(op(x))
        return self.last(x)


@dataclass
class OpTimes:
    name: str
    graph_op: str  # the exported graph's op this kernel call runs, e.g. my_ops.mul3.default
    microseconds: list[float]  # one per execution


def kernel_name(event_name: str) -> str:
    """'native_call_mul3.out' (the runtime's event for a kernel call) -> 'mul3.out'."""
    return event_name.removeprefix("native_call_")


def graph_op_name(target) -> str:
    """An edge graph node's op as the kernel events name it: aten.permute_copy.default -> permute_copy."""
    return str(target).split(".")[-2] if "." in str(target) else str(target)


@dataclass
class OpCheck:
    name: str
    exact: bool
    max_abs_diff: float
    ok: bool


def run_with_etdump(runner: str, pte: str, inputs, out_dir: str, num_executions: int) -> tuple[str, str]:
    from runner_check import tensor_to_file

    base = os.path.splitext(pte)[0]
    etdump, debug_buffer = base + ".etdump", base + ".debug.bin"
    files = []
    for i, t in enumerate(inputs):
        files.append(os.path.join(out_dir, f"{os.path.basename(base)}.input{i}.bin"))
        tensor_to_file(t, files[-1])
    cmd = [runner, f"--model_path={pte}", f"--inputs={','.join(files)}", f"--num_executions={num_executions}",
           f"--etdump_path={etdump}", f"--debug_buffer_path={debug_buffer}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"the runner failed ({proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}")
    return etdump, debug_buffer


def op_times(inspector) -> list[OpTimes]:
    """The operator calls of the Execute block(s), in execution order, with their times over the executions."""
    rows = []
    for block in inspector.event_blocks:
        for event in block.events:
            if event.perf_data is None or event.name in ("Method::execute", "OPERATOR_CALL") or not event.op_types:
                continue
            name = kernel_name(event.name)
            graph_op = next((t for t in event.op_types if graph_op_name(t) == name.split(".")[0]), "")
            rows.append(OpTimes(name, graph_op, list(event.perf_data.raw)))
    return rows


def print_times(rows: list[OpTimes], num_executions: int) -> None:
    print(f"\nPer-op time over {num_executions} executions (ETDump from the runner, ops named through the ETRecord):")
    print(f"{'kernel':<18} {'graph op':<26} {'runs':>5} {'avg us':>9} {'median us':>10} {'min us':>9} {'max us':>9}")
    for row in rows:
        t = sorted(row.microseconds)
        average, median = sum(t) / len(t), t[len(t) // 2]
        print(f"{row.name:<18} {row.graph_op:<26} {len(t):>5} {average:>9.2f} {median:>10.2f} {t[0]:>9.2f} {t[-1]:>9.2f}")


class RuntimeFedInterpreter(torch.fx.Interpreter):
    """Runs the edge graph in eager PyTorch, but hands every node the runtime's value of its inputs: each op's eager
    result is then compared with the runtime's output of that same op on the same inputs."""

    def __init__(self, module, runtime_outputs: dict[tuple[int, str], tuple[str, torch.Tensor]]):
        super().__init__(module)
        self.runtime_outputs = runtime_outputs
        self.pairs: list[tuple[str, torch.Tensor, torch.Tensor]] = []

    def run_node(self, node):
        eager = super().run_node(node)
        handle = node.meta.get("debug_handle")
        found = self.runtime_outputs.get((handle, graph_op_name(node.target))) if isinstance(handle, int) else None
        if found is None or not isinstance(eager, torch.Tensor):
            return eager
        name, runtime = found
        self.pairs.append((name, eager, runtime))
        return runtime.reshape(eager.shape).to(eager.dtype)


def check_intermediates(inspector, etrecord, inputs, exact_ops: set[str]) -> list[OpCheck]:
    """Each op's runtime output against eager on the runtime's inputs, in execution order."""
    # Kernel events of one debug handle (a decomposed op, e.g. linear -> permute_copy + addmm) are told apart by name.
    runtime_outputs = {}
    for block in inspector.event_blocks:
        for event in block.events:
            if not event.debug_data or event.debug_handles is None or not event.name.startswith("native_call_"):
                continue
            handle = event.debug_handles if isinstance(event.debug_handles, int) else event.debug_handles[0]
            data = event.debug_data[0] if isinstance(event.debug_data, (list, tuple)) else event.debug_data
            if isinstance(data, torch.Tensor):
                name = kernel_name(event.name)
                runtime_outputs[(handle, name.split(".")[0])] = (name, data)
    interpreter = RuntimeFedInterpreter(etrecord.edge_dialect_program.module(), runtime_outputs)
    interpreter.run(*inputs)
    checks = []
    for name, eager, runtime in interpreter.pairs:
        exact = name.split(".")[0] in exact_ops
        runtime = runtime.reshape(eager.shape).to(eager.dtype)
        try:
            tolerance = dict(rtol=0, atol=0) if exact else {}
            torch.testing.assert_close(runtime, eager, equal_nan=True, **tolerance)
            ok = True
        except AssertionError:
            ok = False
        diff = (runtime.double() - eager.double()).abs().nan_to_num(0).max().item() if eager.numel() else 0.0
        checks.append(OpCheck(name, exact, diff, ok))
    return checks


def print_checks(checks: list[OpCheck]) -> str | None:
    print("\nIntermediate outputs (debug buffer) vs eager PyTorch on the runtime's own inputs, in execution order:")
    for check in checks:
        verdict = "ok" if check.ok else "DIFFERS"
        how = "bit for bit" if check.exact else "dtype tolerance"
        print(f"  {check.name:<24} {verdict:<8} max |diff| {check.max_abs_diff:.3g} ({how})")
    first = next((c for c in checks if not c.ok), None)
    if first is not None:
        print(f"error: first op whose output differs from eager: {first.name} (max |diff| {first.max_abs_diff:.3g}); "
              "its kernel computes something other than the op PyTorch exported", file=sys.stderr)
        return first.name
    print("every op matches eager")
    return None


def main() -> int:
    import declared_ops
    from pte_export import CallOp, etrecord_path, export_to_pte

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build_dir", required=True, help="a CMake build with the runner (and the AOT library)")
    parser.add_argument("--op", help="profile this declared op's example program instead of the MLP")
    parser.add_argument("--num_executions", type=int, default=20)
    parser.add_argument("--output_dir", help="where the .pte, .etrecord, .etdump go (default: <build_dir>/profile)")
    args = parser.parse_args()
    out_dir = args.output_dir or os.path.join(args.build_dir, "profile")
    os.makedirs(out_dir, exist_ok=True)
    try:
        declared = declared_ops.load()
        ops = [declared_ops.find(args.op)] if args.op else list(declared.values())
        declared_ops.register_with_pytorch(ops, aot_library=os.path.join(args.build_dir, "libcustom_ops_aot_lib.so"))
        torch.manual_seed(0)
        if args.op:
            model, inputs, name = CallOp(ops[0].packet().default), ops[0].make_example_inputs(), ops[0].example_program
        else:
            model, inputs, name = MLP(ops).eval(), (torch.randn(4, 32),), "mlp"
        pte = export_to_pte(model, inputs, os.path.join(out_dir, f"{name}.pte"), etrecord=True)
        print(f"Exported {pte} with its ETRecord {etrecord_path(pte)}")
        runner = os.path.join(args.build_dir, "custom_ops_executor_runner")
        etdump, debug_buffer = run_with_etdump(runner, pte, inputs, out_dir, args.num_executions)
        print(f"Ran it {args.num_executions} times: ETDump {etdump}, debug buffer {debug_buffer}")

        from executorch.devtools import Inspector, parse_etrecord
        from executorch.devtools.inspector import TimeScale

        etrecord = parse_etrecord(etrecord_path(pte))
        inspector = Inspector(etdump_path=etdump, etrecord=etrecord, debug_buffer_path=debug_buffer,
                              target_time_scale=TimeScale.US)
        print_times(op_times(inspector), args.num_executions)
        exact_ops = {op.short_name for op in ops if op.bit_exact}
        return 1 if print_checks(check_intermediates(inspector, etrecord, inputs, exact_ops)) else 0
    except (declared_ops.DeclarationError, OSError, RuntimeError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.path.insert(0, REPO_ROOT)
    sys.exit(main())
