"""Untrusted programs never crash the runtime: hundreds of seeded mutations of a valid program (tests/pte_mutations.py:
byte flips, truncations, inserted/deleted runs, structured edits through executorch's serializer), each class of
failure the issue measured, and the fuzzer's regression inputs, through the runner (also its ASan+UBSan build) and
the ExecuTorch Python runtime with the kernel library.

For every mutant: no signal, no hang, no sanitizer report; a failure is exactly one `error:` line and exit 1; and
exit 0 only with a correct answer. A mutant is a different program, so "correct" is judged on an all-ones input:
every output element is 3 (computed by mul3), 1 (the mutant returns its input) or 0 (it returns a planned tensor
nothing wrote, which the runtimes zero), never anything else, such as the 3.00002 a misaligned, overlapping output
gave. None of them may reach ExecuTorch's own abort (ET_CHECK), which the runner would turn into an error line: each
class is stopped before that, by verification, the pre-flight or the kernels' checks."""

import os
import re
import signal
import subprocess

import pytest

from helpers import run_flow, run_in_fresh_python, run_runner
import regression_inputs
from pte_mutations import mutations
from pte_surgery import edit_plan, replace_kernel_argument, rewrite_output_tensor

COUNT = 1000  # 250 of each kind
REGRESSIONS = regression_inputs.names()  # the fuzzer's past findings (tests/fuzz_regressions/*.hex)
ABORT_HOOK = ("ExecuTorch stopped on a failed internal check", "an exception escaped ExecuTorch")


@pytest.fixture(scope="module")
def regression_files(tmp_path_factory) -> dict[str, str]:
    assert REGRESSIONS, "no regression inputs in tests/fuzz_regressions/"
    return dict(zip(REGRESSIONS, regression_inputs.decode(tmp_path_factory.mktemp("regressions"))))


@pytest.fixture(scope="module")
def mutant_files(mul3_pte, tmp_path_factory):
    directory = tmp_path_factory.mktemp("mutants")
    with open(mul3_pte, "rb") as f:
        data = f.read()
    files = []
    for i, (kind, what, mutant) in enumerate(mutations(data, seed=0, count=COUNT)):
        path = directory / f"{i:04d}_{kind}.pte"
        path.write_bytes(mutant)
        files.append((str(path), what))
    return files


def outcome(proc) -> str:
    """'ok', 'clean' (one error line, exit 1), or what went wrong."""
    if proc.returncode < 0:
        return f"signal {signal.Signals(-proc.returncode).name}"
    if "Sanitizer" in proc.stderr or proc.returncode == 86:
        return "sanitizer report: " + next(l for l in proc.stderr.splitlines() if "Sanitizer" in l)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    if proc.returncode == 1:
        if len(errors) != 1:
            return f"exit 1 with {len(errors)} error lines"
        return "abort hook" if any(h in errors[0] for h in ABORT_HOOK) else "clean"
    if proc.returncode != 0:
        return f"exit {proc.returncode}"
    values = [float(v) for printed in re.findall(r"values: \[([^\]]*)\]", proc.stdout)
              for v in printed.replace("...", "").split(",") if v.strip()]
    wrong = [v for v in values if not (v in (0.0, 1.0, 3.0))]
    return "ok" if not wrong else f"exit 0 with wrong values {wrong[:4]}"


def test_a_mutant_of_every_kind_exists(mutant_files):
    kinds = {os.path.basename(path).split("_", 1)[1][:-4] for path, _ in mutant_files}
    assert kinds == {"flip", "truncate", "splice", "structured"} and len(mutant_files) >= 500


def test_mutated_programs_through_the_runner(any_runner, mutant_files):
    problems, counts = [], {}
    for path, what in mutant_files:
        try:
            result = outcome(run_runner(any_runner, f"--model_path={path}", timeout=20))
        except subprocess.TimeoutExpired:
            result = "hang (20 s)"
        counts[result] = counts.get(result, 0) + 1
        if result not in ("ok", "clean"):
            problems.append(f"{os.path.basename(path)} ({what}): {result}")
    assert problems == [], f"{counts}\n" + "\n".join(problems[:20])
    assert counts.get("clean", 0) > COUNT // 2  # most mutants are invalid, and said so


PYTHON_RUNTIME = """
import json, torch
from flow.runtime import load_kernel_library, load_method_checked
load_kernel_library({kernel_lib!r})
results = []
for path in {paths!r}:
    with open({progress!r}, "w") as f:
        f.write(path)
    try:
        outputs = load_method_checked(path).execute([torch.ones(2, 3)])
        values = [v for o in outputs if isinstance(o, torch.Tensor) for v in o.double().flatten().tolist()]
        wrong = [v for v in values if v not in (0.0, 1.0, 3.0)]
        results.append("ok" if not wrong else "wrong values " + str(wrong[:4]))
    except Exception as err:
        results.append("error")
result = results
"""


def test_mutated_programs_through_the_python_runtime(combined_build, mutant_files, regression_files, tmp_path):
    # Through flow.runtime.load_method_checked(): ExecuTorch's own load_program() + execute() ends the interpreter
    # (ET_CHECK in Method::get_outputs) on a program whose output refers past its values.
    progress = tmp_path / "progress"
    code = PYTHON_RUNTIME.format(kernel_lib=combined_build.kernel_lib, paths=[p for p, _ in mutant_files] + list(regression_files.values()),
                                 progress=str(progress))
    try:
        results = run_in_fresh_python(code, timeout=600)
    except AssertionError as err:  # a signal ends the interpreter: name the mutant it was on
        pytest.fail(f"the Python runtime died on {progress.read_text()}: {str(err)[-1500:]}")
    bad = [(path, r) for (path, _), r in zip(mutant_files, results) if r not in ("ok", "error")]
    assert bad == []
    assert results.count("error") > COUNT // 2


def assert_one_error_line(proc, *fragments):
    assert outcome(proc) == "clean", (proc.returncode, proc.stderr[-2000:])
    (line,) = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    for fragment in fragments:
        assert fragment in proc.stderr, (fragment, proc.stderr[-2000:])
    return line


# Each class the issue measured as a crash, an abort or a wrong answer, rebuilt on purpose.
CLASSES = {
    "output misaligned and overlapping the input (was: wrong answer)": (
        lambda src, dst: rewrite_output_tensor(src, dst, memory_offset=33),
        "my_ops::mul3.out: input or output data is not aligned to its 4-byte elements"),
    "output aligned but partially over the input": (
        lambda src, dst: rewrite_output_tensor(src, dst, memory_offset=36),  # the input sits at bytes 32..56
        "my_ops::mul3.out: the output overlaps the input without being it (in place)"),
    "a 1 TiB planned buffer (was: bad_alloc abort)": (
        lambda src, dst: _planned_buffer(src, dst, 2**40),
        "memory-planned buffers need at least 1099511627776 bytes, more than --max_memory=1073741824"),
    "an output index past the values (was: ET_CHECK abort in get_outputs)": (
        lambda src, dst: _output_index(src, dst, 1000),
        "output 0 refers to no valid value"),
    "a kernel argument that is not a tensor (was: ET_CHECK abort in the generated unboxing)": (
        lambda src, dst: replace_kernel_argument(src, dst, 0, _int(7)),
        "my_ops::mul3.out: argument 0 (input) is Int, but the schema declares Tensor"),
}


def _int(value):
    from executorch.exir.schema import Int

    return Int(value)


def _planned_buffer(src, dst, size):
    return edit_plan(src, dst, lambda plan: plan.non_const_buffer_sizes.__setitem__(-1, size))


def _output_index(src, dst, index):
    return edit_plan(src, dst, lambda plan: plan.outputs.__setitem__(0, index))


@pytest.mark.parametrize("case", CLASSES)
def test_each_measured_failure_class_is_one_error_line(case, any_runner, mul3_pte, tmp_path, load_method):
    make, message = CLASSES[case]
    bad = make(mul3_pte, str(tmp_path / "bad.pte"))
    assert_one_error_line(run_runner(any_runner, f"--model_path={bad}"), message)
    import torch

    from flow.runtime import load_method_checked

    with pytest.raises((RuntimeError, ValueError)):  # the Python runtime refuses it too, and the process lives on
        load_method_checked(bad).execute([torch.ones(2, 3)])


@pytest.mark.parametrize("name", REGRESSIONS)
def test_the_fuzzers_findings_stay_fixed(name, regression_files, any_runner):
    assert_one_error_line(run_runner(any_runner, f"--model_path={regression_files[name]}"))


def test_the_memory_budget_is_a_flag(mul3_pte, any_runner):
    line = assert_one_error_line(run_runner(any_runner, f"--model_path={mul3_pte}", "--max_memory=16"))
    assert "more than --max_memory=16; raise --max_memory if you trust this program" in line
    assert run_runner(any_runner, f"--model_path={mul3_pte}", "--max_memory=1M").returncode == 0


@pytest.mark.parametrize("level", ["internal_consistency", "minimal"])
def test_the_verification_level_is_a_flag(level, mul3_pte, any_runner):
    proc = run_runner(any_runner, f"--model_path={mul3_pte}", f"--verification={level}")
    assert proc.returncode == 0 and "values: [3, 3, 3, 3, 3, 3]" in proc.stdout


def test_both_flows_verify_in_the_sanitized_runner(sanitized_build, mul3_pte, mul4_pte, mul4_build):
    for pte, aot in ((mul3_pte, None), (mul4_pte, mul4_build.aot_lib)):
        proc = run_flow("verify", "--pte", pte, "--runner", sanitized_build.runner,
                        *(["--aot_library", aot] if aot else []), env={"ASAN_OPTIONS": "exitcode=86"})
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "outputs match the reference" in proc.stdout and "Sanitizer" not in proc.stderr
