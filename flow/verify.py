"""The verifier, the flow's last step, for any program: runs a .pte in the C++ runner and/or the ExecuTorch Python
runtime on random inputs that match the program's declared inputs, computes the reference on the same inputs (the
exported program saved beside it, .pt2, with each declared custom op replaced by its declared ATen reference), and
compares. Each runtime executes the program several times (--num_executions) and every execution must match.

    python -m flow.verify --pte x.pte [--pte y.pte ...] --runner cmake-out/x/custom_ops_executor_runner
    python -m flow.verify --pte x.pte --kernel_library cmake-out/x/libcustom_ops_lib.so     (the Python runtime)

It needs no op-specific flags: the custom ops the program calls are registered with PyTorch from their declarations
(custom_ops.bzl); an op registered from C++ comes from libcustom_ops_aot_lib.so beside the runner or kernel library
(or --aot_library). Outputs must be equal bit for bit (flow.compare) when every op the program calls is a custom op
declared bit_exact; otherwise integers exactly and floats within torch.testing's per-dtype tolerance (--tolerance
overrides). A mismatch, a missing .pt2 or an undeclared custom op is exit 1 with an `error:` line.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from typing import Sequence

import torch

from flow import compare, program
from flow.runner import RunnerError, run_pte

DEFAULT_EXECUTIONS = 3


class VerificationError(RuntimeError):
    """The program cannot be verified as asked (no .pt2, an undeclared op, an input it cannot make, ...)."""


def random_input(spec: program.ValueSpec, generator: torch.Generator) -> torch.Tensor:
    """A seeded random tensor matching an input's declared dtype, sizes and dim order."""
    tensor = spec.tensor
    if tensor is None:
        raise VerificationError(f"input {spec.index} is {spec.kind}, not a tensor; the verifier feeds tensor inputs")
    in_memory = [tensor.sizes[d] for d in tensor.dim_order]
    dtype = tensor.dtype
    if dtype.is_floating_point:
        t = torch.randn(in_memory, generator=generator).to(dtype)
    elif dtype == torch.bool:
        t = torch.randint(0, 2, in_memory, generator=generator).bool()
    elif not dtype.is_complex and dtype in (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64):
        low = -100 if dtype.is_signed else 0
        t = torch.randint(low, 100, in_memory, generator=generator, dtype=dtype)
    else:
        raise VerificationError(f"input {spec.index} has dtype {dtype}, which the verifier cannot make values for")
    return t.permute([tensor.dim_order.index(d) for d in range(len(tensor.sizes))])  # logical order, same memory


def saved_runs(pte: str) -> list[tuple] | None:
    """The inputs of each execution that the exporter saved beside a declared example's program, or None."""
    from flow.export import runs_path

    path = runs_path(pte)
    if not os.path.isfile(path):
        return None
    runs = torch.load(path, weights_only=True)
    if not (isinstance(runs, list) and runs and all(isinstance(r, tuple) for r in runs)):
        raise VerificationError(f"{path} does not hold a list of input tuples; re-export the program")
    return runs


def _head(outputs) -> str:
    """The first values of each output (a program with several outputs shows every one)."""
    heads = [o.flatten()[:6].tolist() if isinstance(o, torch.Tensor) else o for o in outputs]
    return str(heads[0]) if len(heads) == 1 else "; ".join(f"output {i}: {h}" for i, h in enumerate(heads))


def _known(name: str) -> bool:
    """An operator of PyTorch's or of ExecuTorch's runtime (its table of kinds: the registries that would teach PyTorch
    ExecuTorch's ops import its whole exporter, see flow/lazy_exir.py)."""
    from flow import argument_kinds

    namespace, op = name.split("::")
    return hasattr(getattr(torch.ops, namespace), op.split(".")[0]) or name in argument_kinds.runtime_arguments()


def program_custom_ops(operators: Sequence[str], declared: dict) -> tuple[list, list[str]]:
    """(the declared ops a program calls, the names of every other operator it calls: ATen's and ExecuTorch's own).
    An operator neither declared nor known is a VerificationError."""
    by_out_name = {op.out_name: op for op in declared.values()}
    undeclared = [n for n in operators if n not in by_out_name and not _known(n)]
    if undeclared:
        raise VerificationError(f"the program calls {', '.join(undeclared)}, which custom_ops.bzl does not declare; "
                                "the verifier registers ops from their declarations")
    return [by_out_name[n] for n in operators if n in by_out_name], [n for n in operators if n not in by_out_name]


def verify(pte: str, *, runner: str | None = None, kernel_library: str | None = None, aot_library: str | None = None,
           seed: int = 0, tolerance: str = "auto", num_executions: int = DEFAULT_EXECUTIONS,
           emulator: Sequence[str] = (), report=print) -> list[str]:
    """Checks `pte` in the runner and/or the Python runtime against its reference; returns the mismatches."""
    from flow import declarations, registration
    from flow.export import pt2_path
    from flow.reference import reference_runs

    if not (runner or kernel_library):
        raise VerificationError("give --runner (the C++ runner) and/or --kernel_library (the Python runtime)")
    if num_executions < 1:
        raise VerificationError(f"--num_executions must be at least 1, got {num_executions}")
    spec = program.read(pte)
    method = spec.method("forward")
    declared = declarations.load()
    custom, others = program_custom_ops(method.operators, declared)
    build_dir = os.path.dirname(os.path.abspath(runner or kernel_library))
    registration.register_with_pytorch(
        custom, aot_library=aot_library or os.path.join(build_dir, "libcustom_ops_aot_lib.so"))
    exact = tolerance == "exact" or (tolerance == "auto" and not others and all(op.bit_exact for op in custom))
    reference = pt2_path(pte)
    if not os.path.isfile(reference):
        raise VerificationError(f"no reference for {pte}: {reference} is missing. Export with "
                                "flow.export.export_to_pte(), which saves the ExportedProgram beside the .pte")
    runs = saved_runs(pte)
    if runs is None:
        generator = torch.Generator().manual_seed(seed)
        runs = [tuple(random_input(value, generator) for value in method.inputs)]
    stateful = len(runs) > 1  # the example's executions in order, each seeing the state the previous left
    expected = reference_runs(reference, runs, custom)
    names = [op.out_name for op in custom] + others
    how = (f"{len(runs)} executions in order (state carried across), in each runtime" if stateful
           else f"{num_executions} execution(s) in each runtime")
    report(f"program {os.path.basename(pte)}: calls {', '.join(names)}; comparing "
           f"{'bit for bit' if exact else 'within dtype tolerance (integers exactly)'} with the declared references, "
           f"{how}")
    problems = []
    if runner:
        # The runner keeps the last execution's outputs: a stateless program at 1 and N executions (N catches an
        # execution that spoils the next one's inputs), a stateful one after its whole sequence.
        for n in [len(runs)] if stateful else sorted({1, num_executions}):
            actual = run_pte(runner, pte, runs[0], expected[-1], num_executions=n, emulator=emulator,
                             later_inputs=runs[1:])
            problems += [f"runner, execution {n}: {p}" for p in compare.mismatches(actual, expected[-1], exact=exact)]
        report(f"  runner          {_head(actual)}")
    if kernel_library:
        from flow.runtime import load_kernel_library, load_method_checked

        load_kernel_library(kernel_library)
        loaded = load_method_checked(pte)
        sequence = list(zip(runs, expected)) if stateful else [(runs[0], expected[0])] * num_executions
        for n, (inputs, wanted) in enumerate(sequence, start=1):
            actual = loaded.execute(inputs)
            problems += [f"Python runtime, execution {n}: {p}" for p in compare.mismatches(actual, wanted, exact=exact)]
        report(f"  Python runtime  {_head(actual)}")
    report(f"  reference       {_head(expected[-1])}")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pte", required=True, action="append",
                        help="the program; its .pt2 must be beside it (repeat it to verify several, in turn)")
    parser.add_argument("--runner", action="append",
                        help="a custom_ops_executor_runner to run it in (repeat it to check each runner in turn)")
    parser.add_argument("--kernel_library", help="a libcustom_ops_lib.so to run it with in the Python runtime")
    parser.add_argument("--aot_library", help="the AOT library of ops registered from C++ (default: beside the runner)")
    parser.add_argument("--emulator", default="", help="a command to run the runner with, for a runner built for "
                        "another architecture, e.g. 'qemu-aarch64 -L /usr/aarch64-linux-gnu'")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num_executions", type=int, default=DEFAULT_EXECUTIONS,
                        help="executions per runtime; every one must match (default: %(default)s)")
    parser.add_argument("--tolerance", choices=("auto", "exact", "dtype"), default="auto")
    args = parser.parse_args()
    failed = []
    for pte in args.pte:
        # With several programs, each verdict names its program (one process: torch imported once).
        named = f"{os.path.basename(pte)}: " if len(args.pte) > 1 else ""
        try:
            problems = []
            runners = args.runner or [None]
            for i, runner in enumerate(runners):  # the Python runtime once, with the first
                found = verify(pte, runner=runner, kernel_library=args.kernel_library if i == 0 else None,
                               aot_library=args.aot_library, seed=args.seed, tolerance=args.tolerance,
                               num_executions=args.num_executions, emulator=shlex.split(args.emulator))
                problems += [f"{os.path.basename(runner)}: {p}" if len(runners) > 1 else p for p in found]
        except (VerificationError, RunnerError, OSError, RuntimeError, ValueError) as err:
            print(f"error: {named}{err}", file=sys.stderr)
            print(f"{named}error: not verified")
            failed.append(pte)
            continue
        for line in problems:
            print(f"MISMATCH {named}{line}", file=sys.stderr)
        print(f"{named}outputs match the reference" if not problems else
              f"{named}error: outputs DIFFER from the reference")
        failed += [pte] if problems else []
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
