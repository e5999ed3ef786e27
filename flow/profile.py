"""Profiling and debugging a custom kernel inside a model, with ExecuTorch's devtools: the program is exported with an
ETRecord, run in the runner with an ETDump (and a debug buffer of every intermediate output of every execution), and
executorch.devtools.Inspector joins the ETDump and the ETRecord into a per-op table of times over the executions.

Then every op of every execution is checked: its output from the debug buffer against the reference computing that op
*on the runtime's own inputs to it* (the edge graph in eager PyTorch, each declared custom op replaced by its declared
ATen reference, each node fed the runtime's values), in execution order. An error is pinned to the op and the
execution that made it, not smeared over every op after it. Ops declared bit_exact are compared bit for bit
(flow.compare), the others within dtype tolerance.

    python -m flow.profile --build_dir cmake-out/all_ops [--op NAME | --pte X.pte] [--num_executions N]

Without --op or --pte it profiles a program calling every declared op (the elementwise ones in a small MLP between
aten ops, the others through their example models); with --op, that op's example
program; with --pte, a program exported with flow.export.export_to_pte(..., etrecord=True) (its .etrecord beside it).
`bash test_custom_ops.sh profile [NAME]` builds the runner first. Exit code 1 when an op's output differs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass
from typing import Callable

import torch

from flow import compare
from flow.reference import ReferenceInterpreter, custom_op_name, references


class MLP(torch.nn.Module):
    """Linear -> each elementwise declared op in turn, with a ReLU after each -> Linear: the custom ops between aten
    ops."""

    def __init__(self, ops, width: int = 64):
        super().__init__()
        self.ops = [op.functional() for op in ops]
        self.first = torch.nn.Linear(32, width)
        self.last = torch.nn.Linear(width, 10)

    def forward(self, x):
        x = self.first(x)
        for op in self.ops:
            x = torch.relu(op(x))
        return self.last(x)


class EveryOp(torch.nn.Module):
    """One program calling every declared op with its own argument kinds: the elementwise ops inside the MLP, and each
    other op through its declared example model (scalars, several inputs and outputs, a mutable buffer) on that
    example's first inputs, which follow the MLP's input."""

    def __init__(self, ops):
        from flow.export import example_of

        super().__init__()
        self.mlp = MLP([op for op in ops if op.elementwise])
        examples = [example_of(op) for op in ops if not op.elementwise]
        self.examples = torch.nn.ModuleList(model for model, _ in examples)
        self.arity = [len(runs[0]) for _, runs in examples]
        self.example_inputs = tuple(t for _, runs in examples for t in runs[0])

    def forward(self, x, *example_inputs):
        outputs, start = [self.mlp(x)], 0
        for model, arity in zip(self.examples, self.arity):
            result = model(*example_inputs[start:start + arity])
            outputs += list(result) if isinstance(result, (tuple, list)) else [result]
            start += arity
        return tuple(outputs)


@dataclass
class OpTimes:
    name: str
    graph_op: str  # the exported graph's op this kernel call runs, e.g. my_ops.mul3.default
    microseconds: list[float]  # one per execution


@dataclass
class OpCheck:
    execution: int  # 1-based
    name: str  # the kernel, e.g. mul4.out
    exact: bool
    max_abs_diff: float
    problem: str | None  # None: matches the reference


def kernel_name(event_name: str) -> str:
    """'native_call_mul3.out' (the runtime's event for a kernel call) -> 'mul3.out'."""
    return event_name.removeprefix("native_call_")


def graph_op_name(target) -> str:
    """An edge graph node's op as the kernel events name it: aten.permute_copy.default -> permute_copy."""
    from flow.reference import op_overload

    op = op_overload(target)
    return op._schema.name.split("::")[-1] if op is not None else str(target)


def run_with_etdump(runner: str, pte: str, out_dir: str, run_args: list[str], suffix: str = "",
                    debug_buffer: bool = True) -> tuple[str, str | None, str]:
    """Runs `pte` in the runner with `run_args` (its inputs and executions, or a decode loop), an ETDump and a debug
    buffer; returns the ETDump's and the buffer's paths and the runner's output."""
    base = os.path.join(out_dir, os.path.splitext(os.path.basename(pte))[0] + suffix)
    etdump, buffer = base + ".etdump", (base + ".debug.bin" if debug_buffer else None)
    cmd = [runner, f"--model_path={pte}", *run_args, f"--etdump_path={etdump}"]
    cmd += [f"--debug_buffer_path={buffer}"] if buffer else []
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"the runner failed ({proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}")
    return etdump, buffer, proc.stdout


def input_args(inputs, num_executions: int, out_dir: str, name: str) -> list[str]:
    """The runner's arguments for `num_executions` executions on `inputs` (written to files in out_dir)."""
    from flow.runner import tensor_to_file

    files = []
    for i, t in enumerate(inputs):
        files.append(os.path.join(out_dir, f"{name}.input{i}.bin"))
        tensor_to_file(t, files[-1])
    return [f"--inputs={','.join(files)}", f"--num_executions={num_executions}"]


# The runtime's events around the kernels: a delegate's call (the ops it reports, and its own overhead) and a whole
# execution.
WHOLE = {"DELEGATE_CALL": "(whole delegate call)", "Method::execute": "(whole execution)"}


def op_times(inspector) -> list[OpTimes]:
    """The operator calls of the Execute block(s), in execution order, with their times over the executions: each
    kernel call, and each op a delegate reports inside its call (graph op: the backend's name)."""
    rows = []
    for block in inspector.event_blocks:
        for event in block.events:
            if event.perf_data is None:
                continue
            if event.is_delegated_op:
                rows.append(OpTimes(event.name, event.delegate_backend_name or "delegate", list(event.perf_data.raw)))
                continue
            if event.name in WHOLE:
                rows.append(OpTimes(event.name, WHOLE[event.name], list(event.perf_data.raw)))
                continue
            if not event.name.startswith("native_call_"):
                continue
            name = kernel_name(event.name)
            # A kernel EXIR re-inplaced (a mutating op such as update_cache) has lost its debug handle: no graph op.
            graph_op = next((t for t in event.op_types if t.split(".")[-2:-1] == [name.split(".")[0]]), "")
            rows.append(OpTimes(name, graph_op, list(event.perf_data.raw)))
    return rows


def print_times(rows: list[OpTimes], num_executions: int) -> None:
    print(f"\nPer-op time over {num_executions} executions (ETDump from the runner, ops named through the ETRecord):")
    print(f"{'kernel':<18} {'graph op':<30} {'runs':>5} {'avg us':>9} {'median us':>10} {'min us':>9} {'max us':>9}")
    for row in rows:
        t = sorted(row.microseconds)
        average, median = sum(t) / len(t), t[len(t) // 2]
        print(f"{row.name:<18} {row.graph_op:<30} {len(t):>5} {average:>9.2f} {median:>10.2f} {t[0]:>9.2f} {t[-1]:>9.2f}")


def print_step_times(rows: list[OpTimes]) -> None:
    """A decoding run's table: each kernel and each delegated op summed over its calls in one execution, for the
    prefill (the first execution) and the median decode step (the others); the largest decode cost first."""
    totals: dict[tuple[str, str], tuple[int, list[float]]] = {}
    for row in rows:
        calls, times = totals.get((row.name, row.graph_op), (0, [0.0] * len(row.microseconds)))
        totals[(row.name, row.graph_op)] = (calls + 1, [a + b for a, b in zip(times, row.microseconds)])
    steps = min((len(times) - 1 for _, times in totals.values()), default=0)
    if steps < 1:
        raise ValueError("a decoding profile needs a prefill and at least one decode step (--new_tokens >= 2)")
    table = sorted(((name, where, calls, times[0], statistics.median(times[1:]))
                    for (name, where), (calls, times) in totals.items()), key=lambda r: -r[4])
    print(f"\nTime per execution, each kernel and each delegated op summed over its calls (ETDump of the runner's "
          f"decode loop: the prefill, then the median of {steps} decode steps):")
    print(f"{'kernel or delegated op':<42} {'runs in':<30} {'calls':>5} {'prefill us':>11} {'decode us':>10}")
    for name, where, calls, prefill, decode in table:
        print(f"{name:<42} {where:<30} {calls:>5} {prefill:>11.2f} {decode:>10.2f}")


# ---- Every execution's intermediate outputs, from the ETDump and its debug buffer ----------------------------------
def _tensor_from_debug_buffer(tensor, buffer: bytes) -> torch.Tensor:
    from flow.dtypes import from_scalar_type

    dtype = from_scalar_type(tensor.scalar_type.name)
    numel = 1
    for size in tensor.sizes:
        numel *= size
    data = bytearray(buffer[tensor.offset: tensor.offset + numel * dtype.itemsize])
    flat = torch.frombuffer(data, dtype=dtype) if numel else torch.empty(0, dtype=dtype)
    # The buffer holds the tensor's memory as it was (its dim order); its strides say how to read it.
    return flat.as_strided(tensor.sizes, tensor.strides) if numel else flat.reshape(tensor.sizes)


def outputs_per_execution(etdump: str, debug_buffer: str, etrecord, method: str = "forward"):
    """For each execution, in order: {(debug handle, op name): [(kernel name, [output tensors]), ...]} of every kernel
    call, in the order of the calls (an op with several outputs logs each), and {(DELEGATE, debug handles): [its
    inputs, then its outputs]} of every delegate call."""
    from executorch.devtools.etdump.serialize import deserialize_from_etdump_flatcc

    with open(etdump, "rb") as f:
        dump = deserialize_from_etdump_flatcc(f.read())
    with open(debug_buffer, "rb") as f:
        buffer = f.read()
    handle_map = etrecord._debug_handle_map[method]  # instruction id -> debug handles, as Inspector reads it
    executions = []
    for run in dump.run_data:
        names, outputs = {}, {}
        for event in run.events or []:
            name = event.profile_event.name if event.profile_event is not None else None
            if name and name.startswith("native_call_"):  # the kernel's own event (OPERATOR_CALL shares its id)
                names[event.profile_event.instruction_id] = name
            debug = event.debug_event
            if debug is None or debug.debug_entry.val != "Tensor" or debug.debug_entry.tensor is None:
                continue
            if debug.debug_entry.output is not None and debug.debug_entry.output.bool_val:
                continue  # the method's outputs, logged at the end under an instruction id of their own
            outputs.setdefault(debug.instruction_id, []).append(
                _tensor_from_debug_buffer(debug.debug_entry.tensor, buffer))
        found = {}
        for instruction, tensor in outputs.items():
            name = names.get(instruction)
            handles = handle_map.get(str(instruction))
            if not handles:
                continue
            if name is None:  # a delegate's call: its outputs, under the handles of every node it runs
                found[DELEGATE, tuple(handles) if isinstance(handles, list) else (handles,)] = tensor
                continue
            handle = handles if isinstance(handles, int) else handles[0]
            kernel = kernel_name(name)
            # EXIR can give several nodes one debug handle (a where's two scalars, split out of it): in order.
            found.setdefault((handle, kernel.split(".")[0]), []).append((kernel, tensor))
        if found:
            executions.append(found)
    return executions


DELEGATE = "delegate"


def delegate_outputs(module: torch.fx.GraphModule, runtime_outputs) -> dict[str, torch.Tensor]:
    """The runtime's value of each edge-graph node whose value leaves a delegate (the delegate's outputs, in graph
    order, which is the order the lowered call returns them), by node name. The interpreter takes one only where its
    shape is the node's in this execution, so a delegate whose outputs do not line up feeds nothing (its consumers
    then get the reference's values)."""
    values = {}
    for key, logged in runtime_outputs.items():
        if key[0] != DELEGATE:
            continue
        inside = {n for n in module.graph.nodes if n.meta.get("debug_handle") in key[1]}
        leaving = [n for n in module.graph.nodes if n in inside and any(u not in inside for u in n.users)]
        if leaving and len(logged) >= len(leaving):  # the call's arguments are logged: its inputs, then outputs
            values.update((n.name, t) for n, t in zip(leaving, logged[len(logged) - len(leaving):]))
    return values


class RuntimeFedInterpreter(ReferenceInterpreter):
    """Runs the edge graph with the references, but hands every node the runtime's value of its inputs: each op's
    reference result is then compared with the runtime's output of that same op on the same inputs. A delegate's ops
    run as their references too, and what leaves the delegate is the runtime's value."""

    def __init__(self, module, reference_functions, runtime_outputs):
        super().__init__(module, reference_functions)
        self.runtime_outputs = {key: list(calls) for key, calls in runtime_outputs.items()}  # each taken once
        self.delegated = delegate_outputs(module, runtime_outputs)
        self.pairs: list[tuple[str, str | None, torch.Tensor, torch.Tensor]] = []

    def run_node(self, node):
        expected = super().run_node(node)
        fed = self.delegated.get(node.name)
        if fed is not None and isinstance(expected, torch.Tensor) and fed.shape == expected.shape:
            return fed
        handle = node.meta.get("debug_handle")
        calls = self.runtime_outputs.get((handle, graph_op_name(node.target))) if isinstance(handle, int) else None
        found = calls.pop(0) if calls else None
        several = isinstance(expected, (tuple, list))
        wanted = list(expected) if several else [expected]
        if found is None or len(found[1]) != len(wanted) or not all(isinstance(t, torch.Tensor) for t in wanted):
            return expected
        name, runtime = found
        runtime = [r.reshape(e.shape) if r.shape != e.shape else r for r, e in zip(runtime, wanted)]
        for e, r in zip(wanted, runtime):
            self.pairs.append((name, custom_op_name(node.target), e, r))
        return type(expected)(runtime) if several else runtime[0]


def check_executions(executions, etrecord, runs, declared_ops) -> list[OpCheck]:
    """Each op's runtime output against its reference on the runtime's inputs, for every execution in order; runs:
    the method's inputs of each execution. One module runs them all, so state the program keeps (a cache) carries
    from one to the next as in the runtime."""
    exact_ops = {op.name for op in declared_ops if op.bit_exact}
    functions = references(declared_ops)
    module = etrecord.edge_dialect_program.module()
    checks = []
    for number, (runtime_outputs, inputs) in enumerate(zip(executions, runs), start=1):
        interpreter = RuntimeFedInterpreter(module, functions, runtime_outputs)
        with torch.no_grad():
            interpreter.run(*inputs)
        for name, op, expected, runtime in interpreter.pairs:
            exact = op in exact_ops
            problem = (compare.bit_difference if exact else compare.tolerance_difference)(runtime, expected)
            diff = 0.0
            if expected.numel() and runtime.dtype == expected.dtype and runtime.shape == expected.shape:
                diff = (runtime.double() - expected.double()).abs().nan_to_num(0).max().item()
            checks.append(OpCheck(number, name, exact, diff, problem))
    return checks


def print_checks(checks: list[OpCheck], num_executions: int) -> OpCheck | None:
    """Prints one line per op (over all executions) and returns the first failing check, if any."""
    print(f"\nIntermediate outputs (debug buffer) of all {num_executions} executions vs the reference on the "
          "runtime's own inputs, in execution order:")
    by_op: dict[str, list[OpCheck]] = {}
    for check in checks:
        by_op.setdefault(check.name, []).append(check)
    for name, op_checks in by_op.items():
        failed = [c for c in op_checks if c.problem is not None]
        verdict = "ok" if not failed else "DIFFERS"
        how = "bit for bit" if op_checks[0].exact else "dtype tolerance"
        worst = max(c.max_abs_diff for c in op_checks)
        where = "" if not failed else f", differs in execution(s) {', '.join(str(c.execution) for c in failed[:8])}"
        print(f"  {name:<24} {verdict:<8} max |diff| {worst:.3g} ({how}; {len(op_checks)} calls in "
              f"{len({c.execution for c in op_checks})} executions{where})")
    first = next((c for c in checks if c.problem is not None), None)
    if first is not None:
        print(f"error: first op whose output differs from its reference: {first.name} in execution {first.execution} "
              f"({first.problem}); its kernel computes something other than the op PyTorch exported", file=sys.stderr)
        return first
    if len({c.execution for c in checks}) != num_executions:
        print(f"error: the ETDump holds intermediate outputs of {len({c.execution for c in checks})} executions, "
              f"expected {num_executions}", file=sys.stderr)
        return OpCheck(0, "(missing executions)", False, 0.0, "missing")
    print("every op of every execution matches its reference")
    return None


def profile(pte: str, runner: str, out_dir: str, declared_ops, run_args: list[str], runs_of: Callable[[str], list],
            decoding: bool = False) -> int:
    """Runs `pte` (exported with its ETRecord) in the runner with `run_args` and an ETDump, prints the per-op table
    (per decode step when `decoding`) and checks every execution's ops; runs_of: the inputs of each execution, from
    what the runner printed. Returns the exit code."""
    from executorch.devtools import Inspector, parse_etrecord
    from executorch.devtools.inspector import TimeScale

    from flow.export import etrecord_path

    etdump, debug_buffer, output = run_with_etdump(runner, pte, out_dir, run_args)
    runs = runs_of(output)
    print(f"Ran it {len(runs)} times: ETDump {etdump}, debug buffer {debug_buffer}")
    etrecord = parse_etrecord(etrecord_path(pte))
    if decoding:
        # Inspector requires every execution's intermediate outputs to be equal, which a decode loop's are not: the
        # times come from a second run without them.
        timed, _, _ = run_with_etdump(runner, pte, out_dir, run_args, suffix=".timing", debug_buffer=False)
        print_step_times(op_times(Inspector(etdump_path=timed, etrecord=etrecord, target_time_scale=TimeScale.US)))
    else:  # Timing only: Inspector keeps one execution's intermediate outputs, so they are read per execution below.
        inspector = Inspector(etdump_path=etdump, etrecord=etrecord, target_time_scale=TimeScale.US)
        print_times(op_times(inspector), len(runs))
    executions = outputs_per_execution(etdump, debug_buffer, etrecord)
    return 1 if print_checks(check_executions(executions, etrecord, runs, declared_ops), len(runs)) else 0


def decoding_runs(prompt, tokens) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The inputs of each execution of a greedy decode loop that generated `tokens`: the prompt at position 0, then
    each generated token but the last at the next position."""
    runs = [(torch.tensor([list(prompt)]), torch.tensor([0]))]
    for i, token in enumerate(tokens[:-1]):
        runs.append((torch.tensor([[token]]), torch.tensor([len(prompt) + i])))
    return runs


def main() -> int:
    from flow import declarations, registration
    from flow.export import etrecord_path, example_of, export_to_pte
    from flow.verify import VerificationError

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build_dir", required=True, help="a CMake build with the runner (and the AOT library)")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--op", help="profile this declared op's example program instead of the MLP")
    which.add_argument("--pte", help="profile this program (exported with its .etrecord beside it)")
    parser.add_argument("--num_executions", type=int, default=20)
    parser.add_argument("--output_dir", help="where the .pte, .etrecord, .etdump go (default: <build_dir>/profile)")
    args = parser.parse_args()
    out_dir = args.output_dir or os.path.join(args.build_dir, "profile")
    os.makedirs(out_dir, exist_ok=True)
    aot_library = os.path.join(args.build_dir, "libcustom_ops_aot_lib.so")
    try:
        declared = declarations.load()
        runner = os.path.join(args.build_dir, "custom_ops_executor_runner")
        if args.pte:
            return profile_program(args.pte, args.build_dir, out_dir, args.num_executions, declared)
        ops = [declarations.find(args.op)] if args.op else list(declared.values())
        registration.register_with_pytorch(ops, aot_library=aot_library)
        torch.manual_seed(0)
        if args.op:
            model, runs = example_of(ops[0])
            inputs, name = runs[0], ops[0].example_program
        else:
            model = EveryOp(ops).eval()
            inputs, name = (torch.randn(4, 32), *model.example_inputs), "every_op"
        pte = export_to_pte(model, inputs, os.path.join(out_dir, f"{name}.pte"), etrecord=True)
        print(f"Exported {pte} with its ETRecord {etrecord_path(pte)}")
        run_args = input_args(inputs, args.num_executions, out_dir, os.path.splitext(os.path.basename(pte))[0])
        return profile(pte, runner, out_dir, ops, run_args, lambda _: [inputs] * args.num_executions)
    except (declarations.DeclarationError, VerificationError, OSError, RuntimeError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


def profile_program(pte: str, build_dir: str, out_dir: str, num_executions: int, declared) -> int:
    """--pte: a program exported with its ETRecord, run on seeded random inputs in the build's runner and checked op by
    op against the declared references (registered from the build's AOT library). Returns the exit code."""
    from flow import program, registration
    from flow.verify import program_custom_ops, random_input

    method = program.read(pte).method("forward")
    ops, _ = program_custom_ops(method.operators, declared)
    registration.register_with_pytorch(ops, aot_library=os.path.join(build_dir, "libcustom_ops_aot_lib.so"))
    generator = torch.Generator().manual_seed(0)
    inputs = [random_input(value, generator) for value in method.inputs]
    run_args = input_args(inputs, num_executions, out_dir, os.path.splitext(os.path.basename(pte))[0])
    runner = os.path.join(build_dir, "custom_ops_executor_runner")
    return profile(pte, runner, out_dir, ops, run_args, lambda _: [inputs] * num_executions)


if __name__ == "__main__":
    sys.exit(main())
