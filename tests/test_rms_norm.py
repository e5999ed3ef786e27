"""my_ops::rms_norm, registered from C++: its kernels per dispatch key against the ATen reference (ops/rms_norm/rms_norm.py), its
gradients, its errors in both modes, and its runtime kernel in the Python runtime."""

import pytest
import torch

from flow.export import CallOp, export_to_pte
from ops.rms_norm.rms_norm import rms_norm_reference

pytestmark = pytest.mark.usefixtures("aot_ops")

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# (input shape, weight shape): one row, rows across threads, a row that is not a multiple of any vector or block, a
# weight with leading ones.
SHAPES = [([1, 4096], [4096]), ([3, 5, 64], [64]), ([257, 300], [300]), ([2, 7, 1000], [1, 1, 1000]), ([64, 4096], [4096])]
# Within float32's rounding of a 4096-element sum; half types: one rounding of the float result.
TOLERANCE = {torch.float32: dict(rtol=2e-6, atol=2e-6), torch.float16: dict(rtol=1e-3, atol=1e-3),
             torch.bfloat16: dict(rtol=8e-3, atol=8e-3)}


def make(shape, weight_shape, dtype, seed=0):
    generator = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=generator) * 3).to(dtype)
    w = (1 + 0.1 * torch.randn(weight_shape, generator=generator)).to(dtype)
    return x, w


def test_schema_is_as_documented():
    for overload, expected in [
        ("default", "my_ops::rms_norm(Tensor input, Tensor weight, float eps=1e-06) -> Tensor"),
        ("out", "my_ops::rms_norm.out(Tensor input, Tensor weight, float eps=1e-06, *, Tensor(a!) out) -> Tensor(a!)"),
    ]:
        text = str(getattr(torch.ops.my_ops.rms_norm, overload)._schema)
        eps = text.split("eps=")[1].split(",")[0].split(")")[0]  # PyTorch prints 1e-6 as 9.9999999999999995e-07
        assert float(eps) == 1e-6
        assert text.replace(eps, "1e-06") == expected


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape, weight_shape", SHAPES, ids=str)
def test_eager_cpu_matches_the_decomposed_reference(shape, weight_shape, dtype):
    x, w = make(shape, weight_shape, dtype)
    torch.testing.assert_close(torch.ops.my_ops.rms_norm(x, w, 1e-5), rms_norm_reference(x, w, 1e-5),
                               **TOLERANCE[dtype])
    out = torch.empty(0, dtype=dtype)
    assert torch.ops.my_ops.rms_norm.out(x, w, 1e-5, out=out).data_ptr() == out.data_ptr()
    torch.testing.assert_close(out, rms_norm_reference(x, w, 1e-5), **TOLERANCE[dtype])


def test_eps_is_used_and_defaults_to_1e_6():
    x = torch.full((2, 8), 1e-3)
    w = torch.ones(8)
    torch.testing.assert_close(torch.ops.my_ops.rms_norm(x, w), rms_norm_reference(x, w, 1e-6))
    torch.testing.assert_close(torch.ops.my_ops.rms_norm(x, w, 1e-2), rms_norm_reference(x, w, 1e-2))
    assert not torch.allclose(torch.ops.my_ops.rms_norm(x, w), torch.ops.my_ops.rms_norm(x, w, 1e-2))


def test_a_non_contiguous_input_and_output():
    x, w = make([64, 6], [64], torch.float32)
    out = torch.empty(12, 64)[::2]
    torch.ops.my_ops.rms_norm.out(x.t(), w, 1e-6, out=out)
    torch.testing.assert_close(out, rms_norm_reference(x.t(), w), **TOLERANCE[torch.float32])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_opcheck(dtype):
    x, w = make([3, 5, 64], [64], dtype)
    torch.library.opcheck(torch.ops.my_ops.rms_norm.default, (x, w, 1e-5))
    torch.library.opcheck(torch.ops.my_ops.rms_norm.default, (x.requires_grad_(), w.requires_grad_()))
    torch.library.opcheck(torch.ops.my_ops.rms_norm.out, (x.detach(), w.detach(), 1e-5),
                          {"out": torch.empty(0, dtype=dtype)})


def test_gradients_for_input_and_weight():
    # The op takes no float64 (the kernels' dtypes), so gradcheck runs in float32 with a step and tolerance to match.
    x, w = make([3, 16], [16], torch.float32)
    inputs = (x.requires_grad_(), w.requires_grad_())
    fn = lambda a, b: torch.ops.my_ops.rms_norm(a, b, 1e-5)  # noqa: E731
    assert torch.autograd.gradcheck(fn, inputs, eps=1e-2, atol=2e-2, rtol=2e-2)
    assert torch.autograd.gradgradcheck(fn, inputs, eps=1e-2, atol=5e-2, rtol=5e-2)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gradients_equal_autograd_through_the_reference(dtype):
    x, w = make([4, 3, 64], [64], dtype)
    g = torch.randn(4, 3, 64).to(dtype)
    ours = torch.autograd.grad(torch.ops.my_ops.rms_norm(x.requires_grad_(), w.requires_grad_(), 1e-5), (x, w), g)
    theirs = torch.autograd.grad(rms_norm_reference(x, w, 1e-5), (x, w), g)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, **{k: 10 * v for k, v in TOLERANCE[dtype].items()})


@pytest.mark.parametrize("device", ["cpu", "meta"])
@pytest.mark.parametrize("make_args, message", [
    (lambda d: (torch.ones(2, 4, dtype=torch.float64, device=d), torch.ones(4, dtype=torch.float64, device=d)),
     "input has unsupported dtype float64; supported: float32, float16, bfloat16"),
    (lambda d: (torch.ones(2, 4, device=d), torch.ones(4, dtype=torch.float16, device=d)),
     "weight has dtype float16 but input has float32"),
    (lambda d: (torch.ones(2, 4, device=d), torch.ones(5, device=d)), "does not scale the last dimension"),
    (lambda d: (torch.ones(2, 4, device=d), torch.ones(2, 4, device=d)), "does not scale the last dimension"),
    (lambda d: (torch.ones((), device=d), torch.ones(1, device=d)), "at least one dimension"),
])
def test_bad_arguments_are_errors_naming_the_op_in_eager_and_in_export(device, make_args, message):
    with pytest.raises(RuntimeError, match="my_ops::rms_norm") as info:
        torch.ops.my_ops.rms_norm(*make_args(device))
    assert message in str(info.value)


def test_export_fails_early_for_an_unsupported_dtype(tmp_path):
    with pytest.raises(Exception, match="unsupported dtype"):
        export_to_pte(CallOp(torch.ops.my_ops.rms_norm.default), (torch.ones(2, 4, dtype=torch.int32),
                      torch.ones(4, dtype=torch.int32)), tmp_path / "bad.pte")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_runtime_kernel_matches_the_reference(dtype, load_method, tmp_path):
    class Model(torch.nn.Module):
        def forward(self, x, w):
            return torch.ops.my_ops.rms_norm(x, w, 1e-5)

    x, w = make([257, 300], [300], dtype, seed=1)
    pte = export_to_pte(Model(), (x, w), tmp_path / f"rms_norm_{dtype}.pte")
    method = load_method(pte)
    for execution in range(2):
        (actual,) = method.execute([x, w])
        torch.testing.assert_close(actual, rms_norm_reference(x, w, 1e-5), **TOLERANCE[dtype])


ISA_PROBE = """
import hashlib
import torch
from helpers import path_counts
torch.ops.load_library({aot_lib!r})
generator = torch.Generator().manual_seed(3)
outputs = {{}}
for dtype in ("float32", "float16", "bfloat16"):
    # 15: the longest tail past the 16-lane vectors. 1024 rows: enough that a sum taken in another order changes
    # some 16-bit outputs (64 rows did not show a tail added to the wrong lane).
    x = (torch.randn(1024, 4096 + 15, generator=generator) * 3).to(getattr(torch, dtype))
    x[0, 5], x[1, 7], x[2] = float("nan"), float("inf"), 0  # a NaN row, an infinite row, a row of zeros
    w = (1 + 0.1 * torch.randn(4096 + 15, generator=generator)).to(x.dtype)
    y = torch.ops.my_ops.rms_norm(x, w, 1e-5)
    outputs[dtype] = hashlib.sha256(y.view(torch.int16 if y.itemsize == 2 else torch.int32).numpy().tobytes()).hexdigest()
result = {{"outputs": outputs, "stats": path_counts({aot_lib!r})}}
"""


def test_every_isa_gives_the_same_bits_and_the_rows_run_on_the_best(combined_build):
    # The AVX2 and AVX-512 variants convert 16-bit rows in order with their own code; a reduction must not depend on
    # the CPU. Nor on the stores: with the streaming threshold at 0, AVX-512's bfloat16 rows leave by non-temporal
    # stores. Each ISA this CPU has runs capped in its own process, the best also uncapped.
    from helpers import COUNT_PATHS, run_in_fresh_python
    from test_kernel_paths import expected_isa, isas_here

    runs = {**{isa: {"CUSTOM_OPS_ISA": isa} for isa in isas_here()}, "best": {},
            "streamed": {"CUSTOM_OPS_STREAMING_MIN_BYTES": "0"}}
    results = {}
    for run, env in runs.items():
        results[run] = run_in_fresh_python(ISA_PROBE.format(aot_lib=combined_build.aot_lib),
                                           env=dict(COUNT_PATHS, **env))
        isa = expected_isa(env.get("CUSTOM_OPS_ISA"))
        elements = 3 * 1024 * (4096 + 15)
        assert results[run]["stats"][isa] == elements, (run, results[run]["stats"])
    assert all(result["outputs"] == results["baseline"]["outputs"] for result in results.values()), results
    streamed_bytes = results["streamed"]["stats"]["streamed_blocks"] * 4096
    bfloat16_bytes = 1024 * (4096 + 15) * 2
    if expected_isa(None) == "avx512":
        assert 0.9 * bfloat16_bytes <= streamed_bytes <= bfloat16_bytes, results["streamed"]["stats"]
    assert results["best"]["stats"]["streamed_blocks"] == 0, results["best"]["stats"]
