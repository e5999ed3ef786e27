"""The kernel library linked as apps and firmware link it (CMakeLists.txt 4b, docs/adding-an-op.md): a static archive
linked whole, and an archive generated with --manual_registration whose registration the runner calls, each checked on
one example of each kind of op against its reference; and the runner's message when a link step is missing: the
archive linked without whole-archive, the manual registration never called, and an op registering itself from its
source, which a manual-registration archive leaves out."""

from __future__ import annotations

import os
import subprocess

import pytest

from helpers import run_flow


@pytest.fixture(scope="module")
def examples(representatives, combined_build, tmp_path_factory) -> dict:
    """The representatives' examples, exported here (their ops registered in this process by the fixtures)."""
    from flow.export import export_example

    directory = tmp_path_factory.mktemp("linking")
    return {op.name: export_example(op, directory) for op in representatives}


def runner(build, variant: str) -> str:
    return os.path.join(build.build_dir, f"custom_ops_executor_runner_{variant}")


def verified(build, programs, runners) -> str:
    args = [arg for pte in programs for arg in ("--pte", pte)] + [arg for r in runners for arg in ("--runner", r)]
    proc = run_flow("verify", *args, "--aot_library", build.aot_lib)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def test_the_whole_archive_and_the_manual_registration_run_the_examples_as_their_references(
        representatives, examples, combined_build):
    codegen = [examples[op.name] for op in representatives if op.by_codegen]
    itself = [examples[op.name] for op in representatives if not op.by_codegen]
    assert codegen and itself, "the representatives have an op of each way of registering"
    out = verified(combined_build, codegen, [runner(combined_build, "whole_archive"), runner(combined_build, "manual")])
    out += verified(combined_build, itself, [runner(combined_build, "whole_archive")])
    # A verdict per program, and a runner line per program and runner.
    assert out.count("outputs match the reference") == len(codegen) + len(itself), out[-3000:]
    assert out.count("\n  runner ") == 2 * len(codegen) + len(itself), out[-3000:]


def refusal(build, variant: str, pte: str) -> str:
    proc = subprocess.run([runner(build, variant), f"--model_path={pte}"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, (variant, proc.returncode, proc.stderr[-2000:])
    (line,) = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    return line


def test_an_archive_not_linked_whole_names_the_ops_and_the_missing_whole_archive(representatives, examples,
                                                                                  combined_build):
    op = next(op for op in representatives if op.by_codegen)
    line = refusal(combined_build, "archive_not_whole", examples[op.name])
    assert op.out_name in line and "Link the archive whole" in line and "WHOLE_ARCHIVE" in line, line


def test_a_manual_registration_never_called_names_the_ops_and_the_call(representatives, examples, combined_build):
    op = next(op for op in representatives if op.by_codegen)
    line = refusal(combined_build, "manual_not_called", examples[op.name])
    assert op.out_name in line and "call torch::executor::register_all_kernels()" in line, line
    assert "Link the archive whole" not in line, line


def test_the_manual_registration_names_an_op_registering_itself_from_its_source(representatives, examples,
                                                                                 combined_build):
    op = next(op for op in representatives if not op.by_codegen)
    line = refusal(combined_build, "manual", examples[op.name])
    assert op.out_name in line and "EXECUTORCH_LIBRARY" in line and "link the archive whole" in line, line

