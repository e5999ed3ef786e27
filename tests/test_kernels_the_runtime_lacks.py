"""Kernels for ATen ops that ExecuTorch's kernel libraries lack (custom_ops.bzl's registered_from "aten"): each runs in
ExecuTorch's runtime bit for bit like ATen's own kernel, over every dtype it declares and the cases the op defines
(ties, NaN and the infinities, both sides, both index dtypes; scans along every dimension, empty and 0-d tensors,
integer products that wrap, the dtype argument), each program executed twice. Export and selective build check a
program's operators against the kernels its runtime will have, naming each one that none has, and refuse a declared
kernel that ExecuTorch's kernels register too unless it says it replaces theirs (test_replacing_executorch_kernels.py)."""

import os
import subprocess
import sys

import pytest
import torch

from flow.compare import assert_bit_exact
from helpers import REPO_ROOT, copy_repository, full_range

REAL_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.uint8, torch.int8, torch.int16,
               torch.int32, torch.int64]


def run_twice(load_method, pte, inputs):
    method = load_method(pte)
    first = [t.clone() for t in method.execute(list(inputs))]
    second = method.execute(list(inputs))
    for a, b in zip(first, second):
        assert_bit_exact(b, a, "second execution")
    return first


class EveryBucketize(torch.nn.Module):
    def forward(self, x, boundaries):
        return tuple(torch.bucketize(x, boundaries, out_int32=out_int32, right=right)
                     for out_int32 in (False, True) for right in (False, True))


def sorted_boundaries(dtype):
    values = full_range((40,), dtype, seed=3)
    if dtype.is_floating_point:
        values = values[~values.isnan()]
        values = torch.cat([values, values[:5]])  # repeated boundaries: ties on both sides
    return values.sort().values


@pytest.mark.parametrize("dtype", REAL_DTYPES, ids=str)
def test_bucketize_gives_atens_indices_in_every_dtype(dtype, load_method, tmp_path):
    from flow.export import export_to_pte

    boundaries = sorted_boundaries(dtype)
    x = torch.cat([full_range((3, 70), dtype, seed=4).flatten(), boundaries]).reshape(1, -1)  # every boundary hit
    pte = export_to_pte(EveryBucketize(), (x, boundaries), tmp_path / "bucketize.pte")
    actual = run_twice(load_method, pte, (x, boundaries))
    expected = EveryBucketize()(x, boundaries)
    for a, e in zip(actual, expected):
        assert a.dtype == e.dtype
        assert_bit_exact(a, e, f"bucketize {dtype}")


class Scans(torch.nn.Module):
    def forward(self, x):
        return torch.cumprod(x, 0), torch.cumprod(x, 1), torch.cumprod(x, -1)


@pytest.mark.parametrize("dtype", REAL_DTYPES, ids=str)
def test_cumprod_gives_atens_products_along_every_dimension(dtype, load_method, tmp_path):
    from flow.export import export_to_pte

    # Near one for floats, so products neither vanish nor overflow over a row; integers wrap around as ATen's do.
    x = (1 + full_range((5, 7, 130), torch.float64, seed=5).clamp(-1e3, 1e3) / 1e3).to(dtype)
    if not dtype.is_floating_point:
        x = full_range((5, 7, 130), dtype, seed=5)
    pte = export_to_pte(Scans(), (x,), tmp_path / "cumprod.pte")
    actual = run_twice(load_method, pte, (x,))
    for a, e in zip(actual, Scans()(x)):
        assert a.dtype == e.dtype  # int64 for every integer input
        assert_bit_exact(a, e, f"cumprod {dtype}")


class ScanInto(torch.nn.Module):
    def __init__(self, dtype):
        super().__init__()
        self.dtype = dtype

    def forward(self, x):
        return torch.cumprod(x, -1, dtype=self.dtype)


@pytest.mark.parametrize("shape", [(), (0, 4), (3, 1), (1,)], ids=str)
@pytest.mark.parametrize("from_dtype, to_dtype", [(torch.int32, torch.float16), (torch.float32, torch.float64),
                                                  (torch.float64, torch.bfloat16), (torch.int64, torch.int8)], ids=str)
def test_cumprod_converts_to_the_dtype_asked_for_then_scans(shape, from_dtype, to_dtype, load_method, tmp_path):
    from flow.export import export_to_pte

    x = full_range(shape, from_dtype, seed=6) if shape else torch.tensor(-3, dtype=from_dtype)
    pte = export_to_pte(ScanInto(to_dtype), (x,), tmp_path / "cumprod_into.pte")
    (actual,) = run_twice(load_method, pte, (x,))
    assert_bit_exact(actual, ScanInto(to_dtype)(x), f"cumprod {from_dtype} -> {to_dtype} {shape}")


class Searchsorted(torch.nn.Module):
    def forward(self, boundaries, x):
        return torch.searchsorted(boundaries, x)


def test_export_names_a_non_core_op_no_kernel_serves_and_the_two_ways_out(tmp_path):
    from flow.export import MissingKernelError, export_to_pte

    with pytest.raises(MissingKernelError) as err:
        export_to_pte(Searchsorted(), (torch.arange(5.0), torch.randn(7)), tmp_path / "searchsorted.pte")
    message = str(err.value)
    assert "aten::searchsorted.Tensor" in message and "no kernel the runtime links has" in message
    assert "A kernel for an ATen op ExecuTorch lacks" in message and "decomposition" in message
    assert not (tmp_path / "searchsorted.pte").exists()


def test_export_refuses_a_program_whose_operator_the_runtime_lacks(monkeypatch, tmp_path):
    # A core ATen op ExecuTorch's registry did not have would be caught the same way: here the registry read is made
    # to miss aten::add.out, and the program calling it is refused by name before it is written.
    from flow import runtime_kernels
    from flow.export import CallOp, MissingKernelError, export_to_pte

    without_add = runtime_kernels.executorch_kernels() - {"aten::add.out"}
    monkeypatch.setattr(runtime_kernels, "executorch_kernels", lambda: without_add)
    with pytest.raises(MissingKernelError, match=r"calls aten::add\.out, which no kernel the runtime links has"):
        export_to_pte(CallOp(torch.add), (torch.randn(3), torch.randn(3)), tmp_path / "add.pte")
    assert not (tmp_path / "add.pte").exists()


def test_executorch_kernels_are_read_from_its_registry():
    from flow import runtime_kernels

    kernels = runtime_kernels.executorch_kernels()
    assert {"aten::add.out", "aten::cumsum.out", "quantized_decomposed::dequantize_per_tensor.out",
            "executorch_prim::et_view.default"} <= kernels
    assert not {"aten::bucketize.Tensor_out", "aten::cumprod.out", "my_ops::mul3.out"} & kernels


def test_a_model_file_selects_its_aten_kernels_beside_executorchs_and_the_runner_runs_it(model_file_build):
    # The model's own op list picks the project's kernels for mul3 and bucketize; ExecuTorch's serve add and amax.
    build, pte = model_file_build
    with open(os.path.join(build.build_dir, "custom_ops_plan.cmake")) as f:
        assert sorted(f.read().split('set(CUSTOM_OPS_SELECTED "')[1].split('"')[0].split(";")) == [
            "aten::bucketize", "my_ops::mul3"]
    proc = subprocess.run([sys.executable, "-m", "flow.verify", "--pte", pte, "--runner", build.runner],
                          capture_output=True, text=True, timeout=600, cwd=REPO_ROOT)
    assert proc.returncode == 0 and "outputs match the reference" in proc.stdout, proc.stdout + proc.stderr


def plan(repo, *args):
    return subprocess.run([sys.executable, os.path.join(repo, "codegen", "run_codegen.py"), "plan", *args],
                          capture_output=True, text=True, timeout=300)


def dead_on_arrival_program(directory):
    """A program calling searchsorted, written past the exporter's own check as another tool would: let through
    to_edge as if it had a kernel."""
    from executorch.exir import EdgeCompileConfig, to_edge

    exported = torch.export.export(Searchsorted(), (torch.arange(5.0), torch.randn(7)))
    config = EdgeCompileConfig(_core_aten_ops_exception_list=[torch.ops.aten.searchsorted.Tensor])
    pte = directory / "dead_on_arrival.pte"
    pte.write_bytes(to_edge(exported, compile_config=config).to_executorch().buffer)
    return pte


def test_a_program_calling_an_op_no_kernel_has_is_refused_at_configure_time_by_name(tmp_path):
    pte = dead_on_arrival_program(tmp_path)
    proc = plan(REPO_ROOT, "--build_dir", str(tmp_path / "build"), "--model_file", str(pte))
    assert proc.returncode == 1
    assert proc.stderr.startswith(f"error: {pte} calls aten::searchsorted.Tensor_out, which no kernel the runtime "
                                  "links has"), proc.stderr


def test_a_declared_kernel_executorch_registers_too_is_refused_by_name_unless_it_says_it_replaces_theirs(tmp_path):
    # ExecuTorch stops the process when a second library registers a name it has: refused when the build is planned,
    # naming both ways out.
    repo = copy_repository(tmp_path / "repo")
    bzl = os.path.join(repo, "custom_ops.bzl")
    text = open(bzl).read()
    assert text.count('"replaces_executorch": True,') == 1
    open(bzl, "w").write(text.replace('"replaces_executorch": True,', ""))
    proc = plan(repo, "--build_dir", str(tmp_path / "build"), "--root_ops", "aten::cumsum.out")
    assert proc.returncode == 1, proc.stdout
    assert proc.stderr.startswith("error: aten::cumsum.out: ExecuTorch's kernels"), proc.stderr
    assert "register it already" in proc.stderr and '"replaces_executorch": True' in proc.stderr, proc.stderr
    assert "remove the declaration" in proc.stderr, proc.stderr


@pytest.mark.parametrize("root_op, expected", [
    ("aten::bucketize.out", "error: root op 'aten::bucketize.out' is not the out variant custom_ops.yaml binds; did "
                            "you mean aten::bucketize.Tensor_out?"),
])
def test_a_root_op_naming_the_wrong_overload_names_the_right_one(root_op, expected, tmp_path):
    proc = plan(REPO_ROOT, "--build_dir", str(tmp_path), "--root_ops", root_op)
    assert proc.returncode == 1 and proc.stderr.strip() == expected, proc.stderr


def test_an_op_entry_naming_an_op_pytorch_lacks_is_refused_by_name(tmp_path):
    repo = copy_repository(tmp_path / "repo")
    path = os.path.join(repo, "custom_ops.yaml")
    with open(path) as f:
        text = f.read().replace("- op: aten::cumprod.out", "- op: aten::cumprod.Out")
    with open(path, "w") as f:
        f.write(text)
    proc = plan(repo, "--build_dir", str(tmp_path / "build"))
    assert proc.returncode == 1
    assert "custom_ops.yaml binds aten::cumprod.Out, which PyTorch does not have" in proc.stderr, proc.stderr


class BoolProducts(torch.nn.Module):
    def forward(self, flags):
        return torch.cumprod(flags, 0)


def test_export_refuses_a_declared_aten_op_in_a_dtype_its_kernel_does_not_take(tmp_path):
    # ATen's cumprod takes bool (its result int64); the declared kernel does not, and would refuse it on the device.
    from flow.export import MissingKernelError, export_to_pte

    with pytest.raises(MissingKernelError, match=r"^aten::cumprod\.out: the model calls it with flags in bool, which "
                                                 r"its kernel \(custom_ops.bzl\) does not take; it takes float32"):
        export_to_pte(BoolProducts(), (torch.ones(4, dtype=torch.bool),), tmp_path / "bool.pte")


def test_the_runtime_kernel_refuses_an_undeclared_dtype_a_rewritten_program_passes(combined_build, tmp_path):
    # Past the exporter (tests/pte_surgery.py): bucketize's tensors declared bool, fed as raw bytes.
    from executorch.exir.schema import ScalarType, Tensor

    from flow.export import export_to_pte
    from helpers import run_runner
    from pte_surgery import edit_plan

    x, boundaries = torch.randn(2, 8), torch.tensor([-1.0, 0.0, 1.0, 2.0])
    pte = export_to_pte(EveryBucketize(), (x, boundaries), tmp_path / "good.pte")

    def to_bool(plan):
        for value in plan.values:
            if isinstance(value.val, Tensor):
                value.val.scalar_type = ScalarType.BOOL

    bad = edit_plan(pte, str(tmp_path / "bad.pte"), to_bool)
    files = [tmp_path / "x.bin", tmp_path / "b.bin"]
    files[0].write_bytes(bytes(16))
    files[1].write_bytes(bytes(4))
    proc = run_runner(combined_build.runner, f"--model_path={bad}", f"--inputs={','.join(map(str, files))}")
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert proc.returncode == 1 and len(errors) == 1, proc.stderr[-2000:]
    assert "aten::bucketize.Tensor_out: self has unsupported dtype bool" in proc.stderr, proc.stderr[-2000:]


def documented_decomposition() -> dict:
    """The decomposition docs/adding-an-op.md shows (its `python decomposition` block), run as the page has it."""
    import re

    with open(os.path.join(REPO_ROOT, "docs", "adding-an-op.md")) as f:
        (block,) = re.findall(r"^```python decomposition\n(.*?)^```", f.read(), re.M | re.S)
    scope = {"torch": torch}
    exec(block, scope)
    return scope["decompositions"]


@pytest.mark.parametrize("right", [False, True])
def test_the_documented_decomposition_keeps_searchsorted_out_and_gives_atens_indices(right, combined_build, tmp_path):
    from flow.export import export_to_pte
    from flow.program import read
    from flow.runner import run_pte

    class Search(torch.nn.Module):
        def forward(self, boundaries, x):
            return torch.searchsorted(boundaries, x, right=right), torch.searchsorted(boundaries, x, out_int32=True)

    boundaries = torch.tensor([-2.0, -1.0, 0.0, 0.0, 0.5, 3.0])
    x = torch.cat([torch.randn(40) * 2, boundaries, torch.tensor([float("nan"), float("inf"), -float("inf")])])
    pte = export_to_pte(Search(), (boundaries, x), tmp_path / "search.pte", decompositions=documented_decomposition())
    assert not any("searchsorted" in name for name in read(pte).operators)
    expected = list(Search()(boundaries, x))
    for n in (1, 3):
        actual = run_pte(combined_build.runner, pte, [boundaries, x], expected, num_executions=n)
        for a, e in zip(actual, expected):
            assert_bit_exact(a, e, f"searchsorted right={right}")


def test_the_runner_says_what_to_do_about_a_missing_op_by_its_kind(mul3_build, declared, tmp_path):
    # The mul3 flow's runner lacks aten::bucketize.Tensor_out (an ATen op ExecuTorch does not ship) and cumprod.
    from flow.export import export_example
    from helpers import run_runner

    pte = export_example(declared["aten::bucketize"], str(tmp_path))
    proc = run_runner(mul3_build.runner, f"--model_path={pte}")
    assert proc.returncode == 1
    assert ("registers: aten::bucketize.Tensor_out. aten::bucketize.Tensor_out: no kernel library ExecuTorch ships has "
            "it: write one (docs/adding-an-op.md, \"A kernel for an ATen op ExecuTorch lacks\"") in proc.stderr, \
        proc.stderr[-2000:]
    assert "decomposition at export" in proc.stderr and "custom_ops.yaml" not in proc.stderr


class QuantizeThenBins(torch.nn.Module):
    def forward(self, x, boundaries):
        q = torch.ops.quantized_decomposed.quantize_per_tensor(x, 0.1, 0, -128, 127, torch.int8)
        return q, torch.bucketize(x, boundaries), torch.ops.my_ops.mul3(x)


def test_the_python_loader_says_what_to_do_about_a_missing_op_by_its_kind(python_ops, tmp_path):
    # In a process that loaded no kernel library: quantized_decomposed's kernel is ExecuTorch's (not loaded), bucketize's
    # and mul3's are the project's.
    import executorch.kernels.quantized  # noqa: F401  (their out variants)
    import torch.ao.quantization.fx._decomposed  # noqa: F401  (quantized_decomposed's ops)

    from flow.export import export_to_pte
    from helpers import run_in_fresh_python

    pte = export_to_pte(QuantizeThenBins(), (torch.randn(4), torch.tensor([0.0])), tmp_path / "mixed.pte")
    dead = dead_on_arrival_program(tmp_path)  # searchsorted: nobody's
    message, dead_message = run_in_fresh_python(f"""
        from flow.runtime import MissingOperatorError, load_method_checked
        result = []
        for pte in ({str(pte)!r}, {str(dead)!r}):
            try:
                load_method_checked(pte)
                result.append("loaded")
            except MissingOperatorError as err:
                result.append(str(err))
    """)
    assert message.startswith("mixed.pte: the program calls operator(s) that no kernel library loaded into this "
                              "process registers: "), message
    assert "quantized_decomposed::quantize_per_tensor.out: ExecuTorch's kernels have it: load the library" in message
    assert "aten::bucketize.Tensor_out, my_ops::mul3.out: an op custom_ops.bzl declares: load a kernel library" in message
    assert ("registers: aten::searchsorted.Tensor_out. aten::searchsorted.Tensor_out: no kernel library ExecuTorch "
            "ships has it: write one") in dead_message, dead_message


def test_export_names_each_op_without_an_out_variant_and_the_recipe_section(tmp_path):
    # A functional op another library defines with no out form (torch.library.custom_op, as a model's own code does).
    from flow.export import MissingKernelError, export_to_pte

    @torch.library.custom_op("functional_only::halve", mutates_args=())
    def halve(x: torch.Tensor) -> torch.Tensor:
        return x / 2

    halve.register_fake(lambda x: torch.empty_like(x))

    class Halves(torch.nn.Module):
        def forward(self, x):
            return torch.ops.functional_only.halve(x) + 1

    with pytest.raises(MissingKernelError) as err:
        export_to_pte(Halves(), (torch.randn(3),), tmp_path / "halves.pte")
    message = str(err.value)
    assert message.startswith("functional_only::halve: no out variant, which ExecuTorch's exporter needs"), message
    assert "An out variant for an op you cannot edit" in message and "FRAGMENT" in message
    assert not (tmp_path / "halves.pte").exists()


class LargeWork(torch.nn.Module):
    def forward(self, x, boundaries):
        return torch.bucketize(x, boundaries, right=True), torch.cumprod(x, 0), torch.cumprod(x, -1)


LARGE_WORK_PROBE = """
import torch
from executorch.extension.pybindings import portable_lib
from flow.compare import bit_difference
from flow.runtime import load_kernel_library, load_method_checked, path_counts
load_kernel_library({kernel_lib!r})
x, boundaries = torch.load({inputs!r})
expected = torch.load({expected!r})
method = load_method_checked({pte!r})
result = {{}}
for threads in (2, 1):
    portable_lib._unsafe_reset_threadpool(threads)
    before = path_counts({kernel_lib!r})["pool_handoffs"]
    differences = [bit_difference(a, e) for _ in range(2) for a, e in zip(method.execute([x, boundaries]), expected)]
    result[threads] = [path_counts({kernel_lib!r})["pool_handoffs"] - before, [d for d in differences if d]]
"""


def test_work_split_over_the_pool_gives_the_same_bits(combined_build, tmp_path):
    # Large enough that each of the three calls hands ranges to the pool on 2 threads (bucketize: 2^15 elements a
    # task; cumprod: blocks of columns, or whole rows), counted where the pool is reached; the same bits on 1 thread.
    from flow.export import export_to_pte
    from helpers import run_in_fresh_python

    generator = torch.Generator().manual_seed(7)
    x = 1 + torch.randn(96, 1500, generator=generator) / 300
    boundaries = torch.randn(2000, generator=generator).sort().values  # a deep search
    pte = export_to_pte(LargeWork(), (x, boundaries), tmp_path / "large.pte")
    torch.save((x, boundaries), tmp_path / "inputs.pt")
    torch.save(list(LargeWork()(x, boundaries)), tmp_path / "expected.pt")
    counts = run_in_fresh_python(LARGE_WORK_PROBE.format(kernel_lib=combined_build.kernel_lib, pte=str(pte),
                                                         inputs=str(tmp_path / "inputs.pt"),
                                                         expected=str(tmp_path / "expected.pt")),
                                 env={"CUSTOM_OPS_COUNT_PATHS": "1"})
    assert counts == {"2": [6, []], "1": [0, []]}, counts
