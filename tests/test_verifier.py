"""The op-agnostic verifier (flow/verify.py): every declared op's example passes it through the C++ runner and the
Python runtime, several executions each; it fails, with a message, when the reference differs (even by one ulp where
the ops promise exact results), when the .pt2 is missing, or when the program calls an op nobody declared."""

import os
import shutil

import pytest
import torch

from flow.export import CallOp, export_to_pte, pt2_path
from helpers import run_flow
from tests.conftest import op_build


def run_verifier(pte, build, *extra):
    return run_flow("verify", "--pte", str(pte), "--runner", build.runner, "--kernel_library", build.kernel_lib,
                    *extra)


def verified_programs(programs, build) -> dict[str, str]:
    """Each program's report from one verifier run (one process) in `build`'s runner and kernel library."""
    proc = run_verifier(programs[0], build, *(arg for pte in programs[1:] for arg in ("--pte", str(pte))))
    assert proc.returncode == 0, proc.stderr[-3000:]
    reports = {}
    for line in proc.stdout.splitlines():
        if line.startswith("program "):
            name = line.split()[1].rstrip(":")
            reports[name] = line
        elif line.endswith("outputs match the reference"):
            reports[line.split(":")[0] if len(programs) > 1 else name] += "\n" + line
    return reports


@pytest.fixture(scope="module")
def examples(declared, combined_build, tmp_path_factory):
    # One export process for every example (importing torch and executorch is most of an export's 6 s).
    directory = tmp_path_factory.mktemp("examples")
    names = [arg for op in declared.values() for arg in ("--op", op.name)]
    proc = run_flow("export", *names, "--output_dir", str(directory), "--aot_library", combined_build.aot_lib)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {op.name: directory / f"{op.example_program}.pte" for op in declared.values()}


def check_report(op, report):
    assert "outputs match the reference" in report, report
    # bit for bit exactly when every op the program calls is a custom op declared bit_exact (update_cache's example
    # also sums the cache with ATen)
    calls = report.split(" calls ")[1].split(";")[0].split(", ")
    assert ("comparing bit for bit" in report) == (op.bit_exact and calls == [op.out_name]), report
    # a stateful example runs its sequence of executions in order
    assert ("3 execution(s) in each runtime" in report) != ("executions in order" in report), report


def test_every_declared_op_passes_in_the_runner_and_the_python_runtime(declared, examples, combined_build):
    # Every example in one verifier run, in the build with every op (its runner and kernel library).
    reports = verified_programs([examples[name] for name in declared], combined_build)
    for name, op in declared.items():
        check_report(op, reports[f"{op.example_program}.pte"])


def test_one_op_of_each_kind_passes_in_its_own_flows_build(representatives, examples):
    # The flow's own build of an op selects it alone (codegen, selective build, the AOT library): one op of each kind
    # (flow/op_kinds.py) through it.
    for op in representatives:
        (report,) = verified_programs([examples[op.name]], op_build(op)).values()
        check_report(op, report)


@pytest.fixture
def mul3_copy(mul3_pte, tmp_path):
    """A copy of the mul3 program and its .pt2, to tamper with."""
    pte = tmp_path / "program.pte"
    shutil.copy(mul3_pte, pte)
    shutil.copy(pt2_path(mul3_pte), pt2_path(pte))
    return pte


class AFewUlpsAbove(torch.nn.Module):
    def forward(self, x):
        return torch.ops.my_ops.mul3(x) * (1 + 2**-22)  # ~2 ulps: inside float32's default tolerance, not exact


def test_several_programs_get_one_verdict_each_and_one_failing_fails_the_run(mul3_pte, mul3_copy, mul3_build):
    os.remove(pt2_path(mul3_copy))  # this one cannot be verified; the others still are, each named in its verdict
    proc = run_flow("verify", "--pte", mul3_pte, "--pte", str(mul3_copy), "--pte", mul3_pte,
                    "--runner", mul3_build.runner)
    assert proc.returncode == 1
    name = os.path.basename(mul3_pte)
    verdicts = [line for line in proc.stdout.splitlines()
                if line.endswith(("outputs match the reference", "not verified", "DIFFER from the reference"))]
    assert verdicts == [f"{name}: outputs match the reference", "program.pte: error: not verified",
                        f"{name}: outputs match the reference"], proc.stdout
    assert "error: program.pte: no reference for" in proc.stderr


def test_a_reference_a_few_ulps_away_fails_the_exact_comparison(mul3_copy, mul3_build, tmp_path):
    export_to_pte(AFewUlpsAbove(), (torch.randn(2, 3),), tmp_path / "ulp.pte")
    shutil.copy(pt2_path(tmp_path / "ulp.pte"), pt2_path(mul3_copy))
    proc = run_verifier(mul3_copy, mul3_build)
    assert proc.returncode == 1
    assert "comparing bit for bit" in proc.stdout
    assert "error: outputs DIFFER from the reference" in proc.stdout
    for where in ("runner, execution 1", "runner, execution 3", "Python runtime, execution 1",
                  "Python runtime, execution 3"):
        assert f"MISMATCH {where}: output 0: 6 of 6 elements differ bit for bit" in proc.stderr, where


def test_a_reference_of_another_model_fails(mul3_copy, mul3_build, tmp_path):
    export_to_pte(CallOp(torch.neg), (torch.randn(2, 3),), tmp_path / "neg.pte")
    shutil.copy(pt2_path(tmp_path / "neg.pte"), pt2_path(mul3_copy))
    proc = run_verifier(mul3_copy, mul3_build)
    assert proc.returncode == 1 and "outputs DIFFER" in proc.stdout


def test_a_missing_pt2_is_an_error(mul3_copy, mul3_build):
    pt2 = pt2_path(mul3_copy)
    os.remove(pt2)
    proc = run_verifier(mul3_copy, mul3_build)
    assert proc.returncode == 1
    assert f"error: no reference for {mul3_copy}: {pt2} is missing" in proc.stderr


class ThreeXPlusOne(torch.nn.Module):
    def forward(self, x):
        return torch.ops.my_ops.mul3(x) + 1


def test_programs_with_other_ops_compare_within_dtype_tolerance(combined_build, tmp_path):
    import custom_ops_1  # noqa: F401

    pte = export_to_pte(ThreeXPlusOne(), (torch.randn(4, 5),), tmp_path / "mixed.pte")
    proc = run_verifier(pte, combined_build)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "aten::add.out" in proc.stdout
    assert "within dtype tolerance" in proc.stdout


def test_channels_last_and_dynamic_programs_verify(combined_build, mul4_aot, tmp_path):
    x = torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)
    pte = export_to_pte(CallOp(torch.ops.my_ops.mul4.default), (x,), tmp_path / "cl.pte")
    assert run_verifier(pte, combined_build).returncode == 0
    dims = ({0: torch.export.Dim("rows", min=1, max=32)},)
    pte = export_to_pte(CallOp(torch.ops.my_ops.mul4.default), (torch.randn(8, 3),), tmp_path / "dyn.pte",
                        dynamic_shapes=dims)
    proc = run_verifier(pte, combined_build)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_a_program_calling_an_undeclared_op_is_refused(mul3_build, tmp_path):
    lib = torch.library.Library("undeclared_ns", "DEF")
    lib.define("twice(Tensor x) -> Tensor")
    lib.define("twice.out(Tensor x, *, Tensor(a!) output) -> Tensor(a!)", tags=(torch.Tag.out,))
    torch.library.impl(lib, "twice", "CompositeExplicitAutograd")(lambda x: x * 2)
    torch.library.impl(lib, "twice.out", "CompositeExplicitAutograd")(lambda x, *, output: torch.mul(x, 2, out=output))
    # Exported past the exporter's own check (which refuses an op no kernel has), as another tool would write it.
    pte = export_to_pte(CallOp(torch.ops.undeclared_ns.twice.default), (torch.randn(3),), tmp_path / "undeclared.pte",
                        check_kernels=False)
    proc = run_verifier(pte, mul3_build)
    assert proc.returncode == 1
    assert "calls undeclared_ns::twice.out, which custom_ops.bzl does not declare" in proc.stderr
