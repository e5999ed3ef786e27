"""The verifier, the flow's last step, for any program: runs a .pte in the C++ runner and/or the ExecuTorch Python
runtime on random inputs that match the program's declared inputs, runs the exported program saved beside it (.pt2,
written by pte_export.export_to_pte) in eager PyTorch on the same inputs, and compares the outputs.

    python runner_check.py --pte x.pte --runner cmake-out/x/custom_ops_executor_runner
    python runner_check.py --pte x.pte --kernel_library cmake-out/x/libcustom_ops_lib.so     (the Python runtime)

It needs no op-specific flags: the custom ops the program calls are registered with PyTorch from their declarations
(custom_ops.bzl); an op registered from C++ comes from libcustom_ops_aot_lib.so beside the runner or kernel library
(or --aot_library). Outputs must be equal bit for bit when every op the program calls is a custom op declared
bit_exact; otherwise integers exactly and floats within torch.testing's per-dtype tolerance (--tolerance overrides).
A mismatch, or a missing .pt2, is exit 1 with a message. Tensors cross to the runner as raw little-endian files
(--inputs/--outputs) in each tensor's memory order.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Sequence

import torch

REPO_ROOT = os.path.dirname(os.path.abspath(__file__))


class RunnerError(RuntimeError):
    """The runner exited non-zero; the message holds its error line and log."""


class VerificationError(RuntimeError):
    """The program cannot be verified as asked (no .pt2, an undeclared op, ...)."""


# ---- Raw tensor I/O with the runner --------------------------------------------------------------------------------
def dim_order(t: torch.Tensor) -> list[int]:
    """The order of t's dimensions in memory, outermost first (ExecuTorch's dim order): [0, 2, 3, 1] for
    channels-last. Ties (size-1 dimensions) keep their logical order, as ExecuTorch does."""
    return sorted(range(t.dim()), key=lambda d: (-t.stride(d), d))


def tensor_to_file(t: torch.Tensor, path: str) -> None:
    """Writes t's elements in its own memory order (the runner reads raw bytes in the program's dim order)."""
    with open(path, "wb") as f:
        f.write(t.permute(dim_order(t)).contiguous().view(torch.uint8).numpy().tobytes())


def _printed_outputs(stdout: str) -> list[tuple[list[int], list[int] | None]]:
    # The runner prints "Output 0: Float[2, 3], values: [...]", with " dim_order=[0, 2, 3, 1]" when not row-major.
    parse = lambda text: [int(d) for d in text.split(",") if d.strip()]  # noqa: E731
    return [(parse(m.group(1)), parse(m.group(2)) if m.group(2) is not None else None)
            for m in re.finditer(r"^Output \d+: \w+\[([^\]]*)\](?: dim_order=\[([^\]]*)\])?", stdout, re.M)]


def run_pte(
    runner: str,
    pte_path: str,
    inputs: Sequence[torch.Tensor],
    expected_like: Sequence[torch.Tensor],
    *,
    pass_shapes: bool = False,
    extra_args: Sequence[str] = (),
    emulator: Sequence[str] = (),
) -> list[torch.Tensor]:
    """Runs the program's forward on `inputs`; returns its outputs read back with the dtypes of `expected_like`.

    pass_shapes=True sends each input's shape (--input_shapes), which programs with dynamic dimensions need.
    emulator: a command that runs the runner, for one built for another architecture (e.g. qemu-aarch64 -L ...).
    """
    with tempfile.TemporaryDirectory() as tmp:
        in_files = []
        for i, t in enumerate(inputs):
            in_files.append(os.path.join(tmp, f"input{i}.bin"))
            tensor_to_file(t, in_files[-1])
        out_files = [os.path.join(tmp, f"output{i}.bin") for i in range(len(expected_like))]
        cmd = [*emulator, runner, f"--model_path={pte_path}", f"--inputs={','.join(in_files)}",
               f"--outputs={','.join(out_files)}"]
        if pass_shapes:
            cmd.append("--input_shapes=" + ",".join("x".join(map(str, t.shape)) for t in inputs))
        proc = subprocess.run([*cmd, *extra_args], capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            raise RunnerError(f"runner exited {proc.returncode}:\n{proc.stderr}{proc.stdout}")
        outputs = []
        for path, like, (shape, order) in zip(out_files, expected_like, _printed_outputs(proc.stdout)):
            with open(path, "rb") as f:
                data = bytearray(f.read())
            flat = torch.frombuffer(data, dtype=like.dtype) if data else torch.empty(0, dtype=like.dtype)
            order = order or list(range(len(shape)))
            # The bytes are in memory order: view them with that order's shape, then put the dimensions back.
            in_memory = flat.reshape([shape[d] for d in order])
            outputs.append(in_memory.permute([order.index(d) for d in range(len(shape))]))
        return outputs


def compare_outputs(actual: Sequence[torch.Tensor], expected: Sequence[torch.Tensor], *, exact: bool) -> list[str]:
    """Returns one line per mismatch (empty when all match). exact=True: the same values bit for bit (NaN equals NaN),
    what ops with one rounding per element promise. exact=False: integers exact, floats within torch.testing's
    per-dtype tolerance (float32: rtol 1.3e-6, atol 1e-5; float16: 1e-3, 1e-5; bfloat16: 1.6e-2, 1e-5)."""
    problems = []
    if len(actual) != len(expected):
        return [f"got {len(actual)} outputs, expected {len(expected)}"]
    tolerance = dict(rtol=0, atol=0) if exact else dict(rtol=None, atol=None)
    for i, (a, e) in enumerate(zip(actual, expected)):
        try:
            torch.testing.assert_close(a, e, **tolerance, equal_nan=True)
        except AssertionError as err:
            problems.append(f"output {i}: {err}")
    return problems


# ---- The program: its inputs, its ops, its eager reference ---------------------------------------------------------
_DTYPES = {"FLOAT": torch.float32, "DOUBLE": torch.float64, "HALF": torch.float16, "BFLOAT16": torch.bfloat16,
           "BYTE": torch.uint8, "CHAR": torch.int8, "SHORT": torch.int16, "INT": torch.int32, "LONG": torch.int64,
           "BOOL": torch.bool}


@dataclass(frozen=True)
class InputSpec:
    dtype: torch.dtype
    sizes: tuple[int, ...]
    dim_order: tuple[int, ...]

    def random(self, generator: torch.Generator) -> torch.Tensor:
        in_memory = [self.sizes[d] for d in self.dim_order]
        if self.dtype.is_floating_point:
            t = torch.randn(in_memory, generator=generator).to(self.dtype)
        elif self.dtype == torch.bool:
            t = torch.randint(0, 2, in_memory, generator=generator).bool()
        else:
            low = -100 if self.dtype.is_signed else 0
            t = torch.randint(low, 100, in_memory, generator=generator, dtype=self.dtype)
        return t.permute([self.dim_order.index(d) for d in range(len(self.sizes))])  # logical order, same memory


def program_inputs(pte_path: str, method: str = "forward") -> list[InputSpec]:
    """The tensor inputs `method` declares: dtype, sizes (the upper bound for dynamic ones) and dim order."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    with open(pte_path, "rb") as f:
        program = deserialize_pte_binary(f.read())
    program = getattr(program, "program", program)
    plans = {plan.name: plan for plan in program.execution_plan}
    if method not in plans:
        raise VerificationError(f"{pte_path} has no method {method!r}; it has {', '.join(plans)}")
    plan = plans[method]
    specs = []
    for index in plan.inputs:
        value = plan.values[index].val
        if type(value).__name__ != "Tensor":
            raise VerificationError(f"{pte_path}: input {len(specs)} is a {type(value).__name__}, not a tensor; the "
                                    "verifier feeds tensor inputs only")
        specs.append(InputSpec(_DTYPES[value.scalar_type.name], tuple(value.sizes), tuple(value.dim_order)))
    return specs


def _known_to_pytorch(name: str) -> bool:
    namespace, op = name.split("::")
    return hasattr(getattr(torch.ops, namespace), op.split(".")[0])


def program_custom_ops(pte_path: str, declared: dict) -> tuple[list, list[str]]:
    """(the declared ops the program calls, the names of every other operator it calls: ATen's and ExecuTorch's own,
    which PyTorch knows once executorch.exir is imported). An operator neither declared nor known is a
    VerificationError."""
    from pte_export import operators_in_program

    by_out_name = {op.out_name: op for op in declared.values()}
    names = operators_in_program(pte_path)
    undeclared = [n for n in names if n not in by_out_name and not _known_to_pytorch(n)]
    if undeclared:
        raise VerificationError(f"{pte_path} calls {', '.join(undeclared)}, which custom_ops.bzl does not declare; the "
                                "verifier registers ops from their declarations")
    return [by_out_name[n] for n in names if n in by_out_name], [n for n in names if n not in by_out_name]


def eager_reference(pte_path: str):
    """The exported program saved beside the .pte, as a callable module (its custom ops must be registered)."""
    from pte_export import pt2_path

    path = pt2_path(pte_path)
    if not os.path.isfile(path):
        raise VerificationError(f"no eager reference for {pte_path}: {path} is missing. Export with "
                                "pte_export.export_to_pte(), which saves the ExportedProgram beside the .pte")
    return torch.export.load(path).module()


def verify(pte: str, *, runner: str | None = None, kernel_library: str | None = None, aot_library: str | None = None,
           seed: int = 0, tolerance: str = "auto", emulator: Sequence[str] = (), report=print) -> list[str]:
    """Checks `pte` in the runner and/or the Python runtime against its .pt2 in eager; returns the mismatches."""
    import declared_ops

    if not (runner or kernel_library):
        raise VerificationError("give --runner (the C++ runner) and/or --kernel_library (the Python runtime)")
    declared = declared_ops.load()
    custom, others = program_custom_ops(pte, declared)
    build_dir = os.path.dirname(os.path.abspath(runner or kernel_library))
    declared_ops.register_with_pytorch(
        custom, aot_library=aot_library or os.path.join(build_dir, "libcustom_ops_aot_lib.so"))
    exact = tolerance == "exact" or (tolerance == "auto" and not others and all(op.bit_exact for op in custom))
    reference = eager_reference(pte)
    generator = torch.Generator().manual_seed(seed)
    inputs = [spec.random(generator) for spec in program_inputs(pte)]
    expected = list(torch.utils._pytree.tree_leaves(reference(*inputs)))
    report(f"program {os.path.basename(pte)}: calls {', '.join(op.out_name for op in custom) + (', ' if others else '') + ', '.join(others)}; "
           f"comparing {'bit for bit' if exact else 'within dtype tolerance (integers exactly)'}")
    problems = []
    if runner:
        actual = run_pte(runner, pte, inputs, expected, emulator=emulator)
        problems += [f"runner: {p}" for p in compare_outputs(actual, expected, exact=exact)]
        report(f"  runner          {actual[0].flatten()[:6].tolist()}")
    if kernel_library:
        from python_runtime import load_kernel_library, load_method_checked

        load_kernel_library(kernel_library)
        actual = list(load_method_checked(pte).execute(inputs))
        problems += [f"Python runtime: {p}" for p in compare_outputs(actual, expected, exact=exact)]
        report(f"  Python runtime  {actual[0].flatten()[:6].tolist()}")
    report(f"  eager (.pt2)    {expected[0].flatten()[:6].tolist()}")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pte", required=True, help="the program; its .pt2 must be beside it")
    parser.add_argument("--runner", help="a custom_ops_executor_runner to run it in")
    parser.add_argument("--kernel_library", help="a libcustom_ops_lib.so to run it with in the Python runtime")
    parser.add_argument("--aot_library", help="the AOT library of ops registered from C++ (default: beside the runner)")
    parser.add_argument("--emulator", default="", help="a command to run the runner with, for a runner built for "
                        "another architecture, e.g. 'qemu-aarch64 -L /usr/aarch64-linux-gnu'")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tolerance", choices=("auto", "exact", "dtype"), default="auto")
    args = parser.parse_args()
    try:
        problems = verify(args.pte, runner=args.runner, kernel_library=args.kernel_library,
                          aot_library=args.aot_library, seed=args.seed, tolerance=args.tolerance,
                          emulator=shlex.split(args.emulator))
    except (VerificationError, RunnerError, OSError, RuntimeError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    for line in problems:
        print(f"MISMATCH {line}", file=sys.stderr)
    print("outputs match PyTorch eager" if not problems else "error: outputs DIFFER from PyTorch eager")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
