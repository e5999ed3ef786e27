"""A kernel in place of ExecuTorch's own (custom_ops.bzl's replaces_executorch): aten::cumsum, whose ExecuTorch kernel
keeps a float32 running sum where ATen's keeps a double one, so a long float32 scan tells the two kernels apart by
their bits. The project's kernel gives ATen's bits in every dtype; the runner runs it (a method-scoped kernel handed
to load_method), and so does the Python runtime (registered under the kernel key of each call the program makes;
my_ops.hf's loader goes through it), while ExecuTorch's own kernel, alone in a process, does not. A runner or a
loaded library without the kernel says ExecuTorch's runs; the declaration and the selection refuse a replacement of
nothing and one never asked for."""

import os
import subprocess
import sys

import pytest
import torch

from flow.compare import assert_bit_exact
from helpers import REPO_ROOT, copy_repository, full_range, run_in_fresh_python

REAL_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.uint8, torch.int8, torch.int16,
               torch.int32, torch.int64]


class Sums(torch.nn.Module):
    def forward(self, x):
        return torch.cumsum(x, 0), torch.cumsum(x, 1), torch.cumsum(x, -1)


class SumsInto(torch.nn.Module):
    def __init__(self, dtype):
        super().__init__()
        self.dtype = dtype

    def forward(self, x):
        return torch.cumsum(x, -1, dtype=self.dtype)


def long_scan():
    """Float32 rows long enough that a float32 running sum and a double one round apart."""
    return torch.randn(6, 4000, generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def long_scan_program(tmp_path_factory):
    from flow.export import export_to_pte

    x = long_scan()
    pte = export_to_pte(Sums(), (x,), tmp_path_factory.mktemp("replacing") / "long_scan.pte")
    return pte, x, Sums()(x)


def executorchs_own(pte, x, tmp_path):
    """The program's outputs in a process where only ExecuTorch's kernels are registered."""
    inputs, outputs = tmp_path / "inputs.pt", tmp_path / "executorchs.pt"
    torch.save([x], inputs)
    run_in_fresh_python(f"""
        import torch
        from flow.lazy_exir import defer_exir_package
        defer_exir_package()
        from executorch.runtime import Runtime
        method = Runtime.get().load_program({str(pte)!r}).load_method("forward")
        torch.save([t.clone() for t in method.execute(torch.load({str(inputs)!r}))], {str(outputs)!r})
        result = None
    """)
    return torch.load(outputs)


def differs(actual, expected) -> bool:
    return any(not torch.equal(a.view(torch.uint8), e.view(torch.uint8)) for a, e in zip(actual, expected))


@pytest.mark.parametrize("dtype", REAL_DTYPES, ids=str)
def test_cumsum_gives_atens_sums_along_every_dimension(dtype, load_method, tmp_path):
    from flow.export import export_to_pte

    for shape in [(7, 130, 3), (1, 1, 1), (3, 0, 2)]:
        x = full_range(shape, dtype, seed=sum(shape)) if 0 not in shape else torch.zeros(shape, dtype=dtype)
        pte = export_to_pte(Sums(), (x,), tmp_path / f"sums_{'x'.join(map(str, shape))}.pte")
        method = load_method(pte)
        for execution in range(2):
            for a, e in zip(method.execute([x]), Sums()(x)):
                assert_bit_exact(a, e, f"cumsum {dtype} {shape} execution {execution + 1}")


@pytest.mark.parametrize("from_dtype, to_dtype", [(torch.int32, torch.float64), (torch.float16, torch.float32),
                                                  (torch.float32, torch.bfloat16), (torch.uint8, torch.int16)],
                         ids=str)
def test_cumsum_converts_to_the_dtype_asked_for_then_sums(from_dtype, to_dtype, load_method, tmp_path):
    from flow.export import export_to_pte

    x = full_range((5, 300), from_dtype, seed=5)
    pte = export_to_pte(SumsInto(to_dtype), (x,), tmp_path / "sums_into.pte")
    (actual,) = load_method(pte).execute([x])
    assert_bit_exact(actual, SumsInto(to_dtype)(x), f"cumsum {from_dtype} -> {to_dtype}")


def test_executorchs_kernel_differs_and_the_runner_and_the_python_runtime_run_the_projects(
        long_scan_program, combined_build, load_method, tmp_path):
    from flow.runner import run_pte

    pte, x, expected = long_scan_program
    # What tells the kernels apart: ExecuTorch's own, alone in a process, rounds a float32 running sum.
    assert differs(executorchs_own(pte, x, tmp_path), expected), "ExecuTorch's cumsum now gives ATen's bits"
    for actual in (run_pte(combined_build.runner, pte, [x], expected, num_executions=2),
                   load_method(pte).execute([x])):
        for a, e in zip(actual, expected):
            assert_bit_exact(a, e, "cumsum over 4000 float32 values")


def test_my_ops_hf_loads_through_the_checked_loader_and_runs_the_projects_kernel(long_scan_program, combined_build,
                                                                                 load_method, tmp_path):
    # my_ops.hf's session (what `python -m my_ops.hf generate` decodes with) in a checkout: the same checked loader, so
    # the project's cumsum runs there too, and a damaged program is refused by name before the runtime reads it.
    from my_ops.hf import session

    pte, x, expected = long_scan_program
    assert session.checked_loader() is not None
    threads = torch.get_num_threads()  # session.load_method keeps PyTorch's own threads at one
    try:
        session.load_kernels(combined_build.kernel_lib)
        program, method = session.load_method(pte)
        for a, e in zip(method.execute([x]), expected):
            assert_bit_exact(a, e, "cumsum over 4000 float32 values, loaded by my_ops.hf.session")
        with open(pte, "rb") as f:
            (tmp_path / "cut.pte").write_bytes(f.read()[:600])
        with pytest.raises(ValueError, match="not a readable ExecuTorch program"):
            session.load_method(str(tmp_path / "cut.pte"))
    finally:
        torch.set_num_threads(threads)


def test_the_runner_lists_the_kernel_it_runs_in_place_of_executorchs(combined_build):
    proc = subprocess.run([combined_build.runner, "--list_registered"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "replacing aten::cumsum.out" in lines
    assert "operator aten::cumsum.out" in lines  # ExecuTorch's, registered globally


def test_the_python_runtime_registers_each_calls_kernel_key_once_and_keeps_running_it(
        long_scan_program, combined_build, tmp_path):
    # A program loaded twice, and a second one calling cumsum with other tensors: each key registered once (a
    # second registration of a name and key stops ExecuTorch), and each program's calls run the project's kernel.
    from flow.export import export_to_pte

    pte, x, expected = long_scan_program
    y = long_scan().to(torch.float64)[:, :1000].reshape(3, 2, 1000).contiguous()
    other = export_to_pte(Sums(), (y,), tmp_path / "other.pte")
    torch.save({"x": x, "y": y, "expected": expected, "other": Sums()(y)}, tmp_path / "cases.pt")
    result = run_in_fresh_python(f"""
        import torch
        from flow.runtime import load_kernel_library, load_method_checked
        load_kernel_library({combined_build.kernel_lib!r})
        cases = torch.load({str(tmp_path / "cases.pt")!r})
        result = []
        for pte, x, expected in [({str(pte)!r}, cases["x"], cases["expected"]), ({str(other)!r}, cases["y"],
                                 cases["other"]), ({str(pte)!r}, cases["x"], cases["expected"])]:
            outputs = load_method_checked(pte).execute([x])
            result.append(all(torch.equal(a, e) for a, e in zip(outputs, expected)))
    """)
    assert result == [True, True, True]


def test_a_kernel_library_without_the_kernel_says_executorchs_runs(long_scan_program, mul3_build, tmp_path):
    pte, x, expected = long_scan_program
    torch.save([x], tmp_path / "inputs.pt")
    result = run_in_fresh_python(f"""
        import warnings
        import torch
        from flow.runtime import ReplacedKernelWarning, load_kernel_library, load_method_checked
        load_kernel_library({mul3_build.kernel_lib!r})
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            method = load_method_checked({str(pte)!r})
        outputs = method.execute(torch.load({str(tmp_path / "inputs.pt")!r}))
        torch.save([t.clone() for t in outputs], {str(tmp_path / "outputs.pt")!r})
        result = [str(w.message) for w in caught if issubclass(w.category, ReplacedKernelWarning)]
    """)
    assert len(result) == 1 and "ExecuTorch's own kernel runs for aten::cumsum.out" in result[0], result
    assert "select the op and rebuild the library" in result[0], result
    assert differs(torch.load(tmp_path / "outputs.pt"), expected)


def test_a_runner_without_the_kernel_says_executorchs_runs(long_scan_program, mul3_build, tmp_path):
    from flow.runner import run_pte

    pte, x, expected = long_scan_program
    proc = subprocess.run([mul3_build.runner, f"--model_path={pte}"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("warning: ")]
    assert warnings == ["warning: ExecuTorch's own kernel runs for aten::cumsum.out: custom_ops.bzl declares a kernel "
                        "in its place (replaces_executorch), but this runner's kernel library was built without it; "
                        "select it (-DCUSTOM_OPS_ROOT_OPS, -DCUSTOM_OPS_MODEL_FILE) and rebuild"], proc.stderr[-2000:]
    assert differs(run_pte(mul3_build.runner, pte, [x], expected), expected)


def plan(repo, *args):
    return subprocess.run([sys.executable, os.path.join(repo, "codegen", "run_codegen.py"), "plan", *args],
                          capture_output=True, text=True, timeout=300)


def test_a_replacement_of_a_kernel_executorch_lacks_is_refused_by_name(tmp_path):
    repo = copy_repository(tmp_path / "repo")
    bzl = os.path.join(repo, "custom_ops.bzl")
    text = open(bzl).read()
    declaration = '"aten::cumprod": {\n        "registered_from": "aten",\n'
    assert declaration in text
    open(bzl, "w").write(text.replace(declaration, declaration + '        "replaces_executorch": True,\n'))
    proc = plan(repo, "--build_dir", str(tmp_path / "build"), "--root_ops", "aten::cumprod.out")
    assert proc.returncode == 1, proc.stdout
    assert proc.stderr.startswith("error: aten::cumprod.out: declared replaces_executorch, but ExecuTorch's kernels "
                                  "have no kernel of that name to replace; remove the field"), proc.stderr


@pytest.mark.parametrize("op, value", [("my_ops::mul3", "True"), ("aten::cumprod", "False")])
def test_replaces_executorch_is_true_and_for_aten_ops_only(op, value, tmp_path):
    from flow import declarations

    text = open(os.path.join(REPO_ROOT, "custom_ops.bzl")).read()
    opening = f'"{op}": {{\n'
    assert opening in text
    path = tmp_path / "custom_ops.bzl"
    path.write_text(text.replace(opening, opening + f'        "replaces_executorch": {value},\n'))
    with pytest.raises(declarations.DeclarationError, match=rf"{op}: replaces_executorch is True or absent, for an "
                                                            r"ATen op \(registered_from 'aten'\)"):
        declarations.load(str(path))
