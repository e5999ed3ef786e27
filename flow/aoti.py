"""AOTInductor, PyTorch's other way to run an exported model without Python, beside ExecuTorch: packages each declared
op's example program with torch._inductor.aoti_compile_and_package (CPU), runs every package in custom_ops_aoti_runner
(runner/aoti_runner.cpp: C++, no Python) and checks it against the same eager references the ExecuTorch flow uses.
models/example_decoder.py packages the example decoder the same way and checks that a package whose op library is
missing fails with one clear error line (missing_library_error).

    python -m flow.aoti --build_dir cmake-out/all_ops      (a CMake build with -DCUSTOM_OPS_BUILD_AOTI=ON)

How custom ops reach the package: Inductor compiles everything else into the package's shared library and calls each
custom op through AOTInductor's proxy executor, which finds it in PyTorch's dispatcher when the package loads. So the
runner loads the libraries that register them (--op_library), as Python would import them: libcustom_ops_aot_lib.so
for ops registered from C++, libcustom_ops_without_python.so for the C++ kernels of ops registered from Python (each
declared op's without_python_sources). Packaging takes seconds to a minute per program, so packages are cached under
cmake-out/aoti_packages/, named by a hash of every source that can change them: the machinery and the ops the program
calls (flow/artifact_cache.py).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from typing import Sequence

import torch

from flow import artifact_cache

PACKAGE_DIR = "aoti_packages"  # under cmake-out/
RUNNER = "custom_ops_aoti_runner"
OP_LIBRARIES = ("libcustom_ops_aot_lib.so", "libcustom_ops_without_python.so")
STATELESS_EXECUTIONS = 3  # as the ExecuTorch verifier: an execution that spoils the next one's inputs shows
# The runner has packages check their inputs (AOTI_RUNTIME_CHECK_INPUTS). Without this, that check also demands 2 or
# more of each dynamic size (Inductor's 0/1 specialization), which refuses a decode step's single token; export
# declared the prompt length from 1, and the code Inductor generates serves 1 (the decode steps equal eager's).
INDUCTOR_CONFIGS = {"aot_inductor.check_lowerbound": False}


def package(name: str, exported: torch.export.ExportedProgram, metadata: dict[str, str] | None = None) -> str:
    """The AOTInductor package of `exported`, made once per source hash (flow/artifact_cache.py); returns its path.
    `metadata` goes into the package (AOTIModelPackageLoader::get_metadata)."""
    def make(path: str) -> None:
        configs = {**INDUCTOR_CONFIGS, "aot_inductor.metadata": dict(metadata or {})}  # a copy: Inductor adds keys
        made = torch._inductor.aoti_compile_and_package(exported, package_path=path, inductor_configs=configs)
        if made != path:
            os.replace(made, path)

    return artifact_cache.cached(PACKAGE_DIR, f"{name}.pt2", make, str(sorted(INDUCTOR_CONFIGS.items())),
                                 str(sorted((metadata or {}).items())), ops=called_ops(exported))[0]


def called_ops(exported: torch.export.ExportedProgram) -> set[str]:
    """The ops the program calls, by name ("my_ops::rope"): every op its code names, a call's target or an argument
    (a higher-order op's, e.g. auto_functionalized's in-place op). What of the op library a package is made from."""
    code = exported.graph_module.print_readable(print_output=False)
    return {f"{namespace}::{name}" for namespace, name in re.findall(r"\btorch\.ops\.(\w+)\.(\w+)", code)}


def runner_command(build_dir: str, package_file: str, op_libraries: Sequence[str] | None = None) -> list[str]:
    """The runner and the flags naming the package and the op libraries (default: both of the build's)."""
    libraries = [os.path.join(build_dir, lib) for lib in OP_LIBRARIES] if op_libraries is None else op_libraries
    command = [os.path.join(build_dir, RUNNER), f"--package={package_file}"]
    return command + ([f"--op_library={','.join(libraries)}"] if libraries else [])


def input_spec(t: torch.Tensor) -> str:
    return f"{str(t.dtype).removeprefix('torch.')}:{'x'.join(map(str, t.shape))}"


def run_package(command: Sequence[str], runs: Sequence[Sequence[torch.Tensor]], expected_like: Sequence[torch.Tensor],
                num_executions: int) -> list[torch.Tensor]:
    """The outputs of the last of `num_executions` executions; execution N takes runs[N % len(runs)]."""
    from flow.runner import input_flags, run_and_read_outputs

    runs = [[t.contiguous() for t in run] for run in runs]
    with tempfile.TemporaryDirectory() as tmp:
        out_files = [os.path.join(tmp, f"output{i}.bin") for i in range(len(expected_like))]
        return run_and_read_outputs(
            [*command, *input_flags(tmp, runs), f"--input_specs={','.join(map(input_spec, runs[0]))}",
             f"--outputs={','.join(out_files)}", f"--num_executions={num_executions}"], out_files, expected_like)


def example_package(op) -> tuple[str, torch.export.ExportedProgram, list]:
    """(the package of `op`'s example program, its ExportedProgram, the example's runs)."""
    from flow.export import example_of

    model, runs = example_of(op)
    exported = torch.export.export(model, runs[0], strict=True)
    return package(op.example_program, exported), exported, runs


def check_example(op, build_dir: str) -> str:
    """Packages `op`'s example program, runs it in the C++ runner and compares with the op's reference (bit for bit
    where declared bit_exact), executed several times (a stateful example: its executions in order). Returns what to
    print; AssertionError on a difference."""
    from flow import compare
    from flow.reference import program_reference_runs

    path, exported, runs = example_package(op)
    expected = program_reference_runs(exported, runs, [op])
    stateful = len(runs) > 1
    problems = []
    for n in [len(runs)] if stateful else sorted({1, STATELESS_EXECUTIONS}):
        actual = run_package(runner_command(build_dir, path), runs, expected[-1], n)
        problems += [f"execution {n}: {p}" for p in compare.mismatches(actual, expected[-1], exact=op.bit_exact)]
    if problems:
        raise AssertionError(f"{op.example_program} (AOTInductor) differs from {op.name}'s reference: "
                             + "; ".join(problems))
    how = "bit for bit" if op.bit_exact else "within dtype tolerance"
    return f"{op.example_program}: {os.path.relpath(path)} matches {op.short_name}'s reference {how}"


def missing_library_error(build_dir: str, package_file: str, op_libraries: Sequence[str]) -> str:
    """The runner's error line for `package_file` loaded with only `op_libraries`; AssertionError unless it fails
    cleanly (exit code 1, one error line) naming an op and the --op_library fix."""
    command = runner_command(build_dir, package_file, op_libraries)
    proc = subprocess.run([*command, "--prompt=1", "--new_tokens=1"], capture_output=True, text=True, timeout=300)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    if proc.returncode != 1 or len(errors) != 1 or "my_ops::" not in errors[0] or "--op_library" not in errors[0]:
        loaded = ", ".join(map(os.path.basename, op_libraries)) or "no op library"
        raise AssertionError(f"{RUNNER} with {loaded} should fail with one error line naming the op and --op_library; "
                             f"it exited {proc.returncode}:\n{proc.stderr}")
    return errors[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build_dir", required=True,
                        help=f"a CMake build with every op and -DCUSTOM_OPS_BUILD_AOTI=ON: {RUNNER} and the op libraries")
    args = parser.parse_args()
    from flow import declarations, registration

    registration.register_build(args.build_dir)
    try:
        for op in declarations.load().values():
            print(check_example(op, args.build_dir))
    except (AssertionError, RuntimeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
