"""libFuzzer over the runner's path for untrusted programs (runner/fuzz_program.cpp, built with clang and
-fsanitize=fuzzer,address,undefined), seeded with the project's valid programs (the XNNPACK-delegated decoders
included) and the inputs of past findings (tests/fuzz_regressions/*.hex, decoded by tests/regression_inputs.py). A
bounded run (CUSTOM_OPS_FUZZ_SECONDS, default 60) must end with no finding: no crash, no ExecuTorch abort, no sanitizer
report, no leak. The fuzzer starts through tools/own_peak_rss.py, so its memory limit counts its own pages. Installs
clang when run as root (CI); elsewhere, without clang, it is skipped saying which packages to install."""

import os
import resource
import shutil
import subprocess
import sys

import pytest

import regression_inputs
from helpers import REPO_ROOT, fuzzing_toolchain_problem

# libFuzzer's RSS limit reads the process's peak resident memory, which Linux carries across exec: started straight
# from a pytest worker that has held a real model (3 GiB), the fuzzer would start over its 2 GiB limit.
OWN_PEAK_RSS = [sys.executable, os.path.join(REPO_ROOT, "tools", "own_peak_rss.py")]


@pytest.fixture(scope="module")
def fuzz_program(request):
    if problem := fuzzing_toolchain_problem():
        if os.environ.get("CI"):
            pytest.fail(f"CI could not install the fuzzing toolchain: {problem}")
        pytest.skip(problem)
    return os.path.join(request.getfixturevalue("sanitized_build").build_dir, "fuzz_program")  # clang's tree


def run_fuzzer(fuzz_program, *args, cwd):
    return subprocess.run([*OWN_PEAK_RSS, "-", fuzz_program, *args], capture_output=True, text=True, errors="replace",
                          cwd=cwd, timeout=1800)


def peak_rss_kib_reported_by_a_child(launcher):
    report = "import resource; print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
    return int(subprocess.run([*launcher, sys.executable, "-c", report], capture_output=True, text=True,
                              check=True).stdout)


def test_the_fuzzer_starts_with_its_own_peak_memory_not_the_test_process(tmp_path):
    held = bytearray(512 << 20)  # this process's peak grows by 512 MiB (the pages are written: zeroed)
    peak_here = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert peak_here > 512 << 10
    # Started directly, a child reports this process's peak as its own: what the launcher is for.
    assert peak_rss_kib_reported_by_a_child([]) >= peak_here
    launched = peak_rss_kib_reported_by_a_child([*OWN_PEAK_RSS, str(tmp_path / "peak")])
    assert launched < 256 << 10, f"a child started through tools/own_peak_rss.py reports {launched} KiB"
    assert launched <= int((tmp_path / "peak").read_text()) < 256 << 10  # the launcher's figure: the child's own
    del held


def test_the_regression_inputs_of_past_findings_run_clean(fuzz_program, tmp_path):
    inputs = regression_inputs.decode(tmp_path / "regressions")
    assert len(inputs) == len(regression_inputs.names()) > 0, "no regression inputs"
    proc = run_fuzzer(fuzz_program, *inputs, cwd=tmp_path)  # file arguments: each runs once
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert f"Executed {inputs[-1]}" in proc.stderr


def test_a_bounded_fuzzing_run_finds_nothing(fuzz_program, mul3_pte, mul4_pte, decoder_programs, tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    # The decoders bring XNNPACK payloads (float32 and 8-bit) for the mutations to reach the delegate checks through.
    for seed in (mul3_pte, mul4_pte, *decoder_programs.values(), *regression_inputs.decode(tmp_path / "regressions")):
        shutil.copy(seed, corpus)
    # Reproducible by default (a seed and a number of runs, about 40 s here), so a finding in CI is the code's, not the
    # dice's; CUSTOM_OPS_FUZZ_SECONDS=N runs a random, time-bounded search instead (how the open findings in
    # docs/untrusted-programs.md were found).
    seconds = os.environ.get("CUSTOM_OPS_FUZZ_SECONDS")
    budget = [f"-max_total_time={seconds}"] if seconds else ["-seed=1", "-runs=60000"]
    # A program runs within a 64 MiB budget, so no single allocation nears 128 MiB: one that does is caught as it is
    # made, with its input and stack (the RSS limit only notices a second later, on whatever unit runs then).
    proc = run_fuzzer(fuzz_program, *budget, "-malloc_limit_mb=128", "-print_final_stats=1",
                      f"-artifact_prefix={tmp_path}/", str(corpus), cwd=tmp_path)
    findings = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(("crash-", "leak-", "timeout-", "oom-")))
    assert proc.returncode == 0 and not findings, (
        f"libFuzzer found {findings}; once fixed, add each with tests/regression_inputs.py add:\n{proc.stderr[-4000:]}")
    executed = int(next(line.split()[-1] for line in proc.stderr.splitlines()
                        if line.startswith("stat::number_of_executed_units")))
    assert executed > 1000, proc.stderr[-2000:]
