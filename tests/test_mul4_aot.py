"""mul4's PyTorch side: the C++ AOT library (custom_ops_2.cpp + codegen's mul4.out registration), its kernels per
dispatch key, the CMake and JIT builds of it, and the namespace rule it shares with custom_ops_1.py."""

import textwrap

import pytest
import torch

import custom_ops_1  # noqa: F401  (mul3, registered from Python, lives in the same namespace)
import custom_ops_2
from helpers import run_in_fresh_python
from pte_export import CallOp, export_to_pte, operators_in_program

pytestmark = pytest.mark.usefixtures("mul4_aot")


def test_schemas_are_exactly_as_documented():
    assert str(torch.ops.my_ops.mul4.default._schema) == "my_ops::mul4(Tensor input) -> Tensor"
    assert str(torch.ops.my_ops.mul4.out._schema) == (
        "my_ops::mul4.out(Tensor input, *, Tensor(a!) output) -> Tensor(a!)"
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_eager_cpu_results(dtype):
    x = torch.randn(4, 5, dtype=dtype)
    torch.testing.assert_close(torch.ops.my_ops.mul4(x), x * 4, rtol=0, atol=0)
    out = torch.empty(0, dtype=dtype)
    assert torch.ops.my_ops.mul4.out(x, output=out).data_ptr() == out.data_ptr()
    torch.testing.assert_close(out, x * 4, rtol=0, atol=0)


def test_eager_on_a_non_contiguous_input_and_output():
    x = torch.randn(6, 4).t()
    out = torch.empty(8, 6)[::2]
    torch.ops.my_ops.mul4.out(x, output=out)
    torch.testing.assert_close(out, x * 4, rtol=0, atol=0)
    torch.testing.assert_close(torch.ops.my_ops.mul4(x), x * 4, rtol=0, atol=0)


def test_errors_name_the_op_and_the_fix():
    with pytest.raises(RuntimeError, match="my_ops::mul4.out: output dtype Double does not match input dtype Float"):
        torch.ops.my_ops.mul4.out(torch.ones(2), output=torch.empty(2, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="unsupported dtype Bool; supported: float32"):
        torch.ops.my_ops.mul4(torch.ones(2, dtype=torch.bool))
    with pytest.raises(RuntimeError, match="my_ops::mul4: unsupported dtype ComplexFloat"):
        torch.ops.my_ops.mul4(torch.ones(2, dtype=torch.complex64, device="meta"))


def test_autograd_kernel_gradcheck_float64():
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(torch.ops.my_ops.mul4, (x,))
    assert torch.autograd.gradgradcheck(torch.ops.my_ops.mul4, (x,))
    (grad,) = torch.autograd.grad(torch.ops.my_ops.mul4(x).sum(), x)
    torch.testing.assert_close(grad, torch.full_like(x, 4.0))


def test_meta_kernel_gives_shape_and_dtype_only():
    y = torch.ops.my_ops.mul4(torch.empty(7, 3, dtype=torch.bfloat16, device="meta"))
    assert (y.device.type, y.shape, y.dtype) == ("meta", (7, 3), torch.bfloat16)


def test_export_with_a_dynamic_dimension(tmp_path):
    batch = torch.export.Dim("batch", min=1, max=64)
    exported = torch.export.export(CallOp(torch.ops.my_ops.mul4.default), (torch.randn(4, 3),), dynamic_shapes=({0: batch},))
    (out_node,) = [n for n in exported.graph.nodes if n.op == "call_function"]
    assert isinstance(out_node.meta["val"].shape[0], torch.SymInt)
    pte = export_to_pte(CallOp(torch.ops.my_ops.mul4.default), (torch.randn(4, 3),), tmp_path / "dyn.pte",
                        dynamic_shapes=({0: batch},))
    assert operators_in_program(pte) == ["my_ops::mul4.out"]


def test_autocast_cpu_computes_floats_in_the_autocast_dtype():
    x = torch.randn(8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = torch.ops.my_ops.mul4(x)
        ints = torch.ops.my_ops.mul4(torch.arange(5))
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y, x.bfloat16() * 4, rtol=0, atol=0)
    assert ints.dtype == torch.int64  # autocast casts floating-point inputs only
    assert torch.ops.my_ops.mul4(x).dtype == torch.float32  # and only inside the autocast region


def test_python_and_cpp_registrations_share_one_process():
    x = torch.arange(6.0)
    torch.testing.assert_close(torch.ops.my_ops.mul3(x), x * 3)
    torch.testing.assert_close(torch.ops.my_ops.mul4(x), x * 4)


@pytest.mark.parametrize("first", ["python", "cpp"])
def test_fragments_and_the_definition_load_in_either_order(mul4_build, first):
    load_python, load_cpp = "import custom_ops_1", f"torch.ops.load_library({mul4_build.aot_lib!r})"
    result = run_in_fresh_python(f"""
        import torch
        {load_python if first == "python" else load_cpp}
        {load_cpp if first == "python" else load_python}
        x = torch.arange(3.0)
        result = [torch.ops.my_ops.mul3(x).tolist(), torch.ops.my_ops.mul4(x).tolist()]
    """)
    assert result == [[0.0, 3.0, 6.0], [0.0, 4.0, 8.0]]


def test_a_second_defining_library_for_my_ops_is_rejected(mul4_build):
    result = run_in_fresh_python(f"""
        import torch
        torch.ops.load_library({mul4_build.aot_lib!r})
        try:
            torch.library.Library("my_ops", "DEF")
            result = "no error"
        except RuntimeError as err:
            result = str(err)
    """)
    assert "Only a single TORCH_LIBRARY can be used to register the namespace my_ops" in result
    assert "RegisterSchema.cpp" in result  # the generated schema file is the definition


def test_importing_custom_ops_2_registers_nothing():
    result = run_in_fresh_python("""
        import torch, custom_ops_2
        result = hasattr(torch.ops.my_ops, "mul4")
    """)
    assert result is False


def test_a_missing_or_wrong_library_path_explains_how_to_build_it(mul4_build, tmp_path):
    with pytest.raises(FileNotFoundError, match="AOT library not found: .*test_custom_ops.sh cmake.*--jit"):
        custom_ops_2.load_aot_library(str(tmp_path / "nope.so"))
    not_a_library = tmp_path / "libfake.so"
    not_a_library.write_text("not ELF")
    result = run_in_fresh_python(f"""
        import custom_ops_2
        try:
            custom_ops_2.load_aot_library({str(not_a_library)!r})
            result = "loaded"
        except OSError as err:
            result = str(err)
    """)
    assert "cannot load" in result and "test_custom_ops.sh cmake" in result


def test_jit_and_cmake_builds_give_identical_schemas_and_results():
    probe = textwrap.dedent("""
        x = torch.linspace(-3, 3, 12, dtype=torch.float64).reshape(3, 4)
        result = {
            "schemas": [str(torch.ops.my_ops.mul4.default._schema), str(torch.ops.my_ops.mul4.out._schema)],
            "values": torch.ops.my_ops.mul4(x).tolist(),
            "out_values": torch.ops.my_ops.mul4.out(x.float(), output=torch.empty(0)).tolist(),
        }
    """)
    jit = run_in_fresh_python("import torch, custom_ops_2\ncustom_ops_2.build_jit_library()\n" + probe, timeout=900)
    cmake = {}
    exec(compile("import torch\n" + probe, "probe", "exec"), cmake)
    assert jit == cmake["result"]
