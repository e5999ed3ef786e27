"""mul4's PyTorch side: the C++ AOT library (custom_ops_2.cpp + codegen's mul4.out registration), its kernels per
dispatch key, the CMake and JIT builds of it, and the namespace rule it shares with custom_ops_1.py."""

import textwrap

import pytest
import torch

import custom_ops_1  # noqa: F401  (mul3, registered from Python, lives in the same namespace)
import helpers
from flow import registration
from flow.compare import assert_bit_exact
from flow.export import CallOp, export_to_pte
from flow.program import operators_in_program
from helpers import run_in_fresh_python

pytestmark = pytest.mark.usefixtures("mul4_aot")


def test_schemas_are_exactly_as_documented():
    assert str(torch.ops.my_ops.mul4.default._schema) == "my_ops::mul4(Tensor input) -> Tensor"
    assert str(torch.ops.my_ops.mul4.out._schema) == (
        "my_ops::mul4.out(Tensor input, *, Tensor(a!) output) -> Tensor(a!)"
    )


ALL_DTYPES = [getattr(torch, name) for name in helpers.ALL_DTYPES]


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_eager_cpu_results_equal_aten_bit_for_bit(dtype):
    # The reference is ATen's `x * 4`, not anything of ours: this checks the ATen-mode kernel itself.
    x = helpers.full_range((1000,), dtype)
    expected = x * 4
    assert_bit_exact(torch.ops.my_ops.mul4(x), expected)
    out = torch.empty(0, dtype=dtype)
    assert torch.ops.my_ops.mul4.out(x, output=out).data_ptr() == out.data_ptr()
    assert_bit_exact(out, expected)


def test_eager_on_a_non_contiguous_input_and_output():
    x = torch.randn(6, 4).t()
    out = torch.empty(8, 6)[::2]
    torch.ops.my_ops.mul4.out(x, output=out)
    assert_bit_exact(out, x * 4)
    assert_bit_exact(torch.ops.my_ops.mul4(x), x * 4)


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_results_are_laid_out_like_the_input(device):
    x = torch.randn(2, 3, 4, 5, device=device).to(memory_format=torch.channels_last)
    expected = torch.empty_like(x)  # what x * 4 gives: the input's strides
    assert torch.ops.my_ops.mul4(x).stride() == expected.stride()
    resized = torch.ops.my_ops.mul4.out(x, output=torch.empty(0, device=device))
    assert resized.stride() == expected.stride()
    if device == "cpu":
        assert_bit_exact(torch.ops.my_ops.mul4(x), x * 4)
        assert_bit_exact(resized, x * 4)


def test_an_output_of_the_right_shape_keeps_its_own_layout():
    x = torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)
    out = torch.empty(2, 3, 4, 5)  # contiguous: not resized, so not restrided (like ATen's out= ops)
    torch.ops.my_ops.mul4.out(x, output=out)
    assert out.is_contiguous()
    assert_bit_exact(out, x * 4)


def test_partial_overlap_of_input_and_output_is_rejected_in_the_runtime_kernels_words():
    # The same words as the ExecuTorch kernel gives a program whose memory plan overlaps them (kernel_contract.h).
    x = torch.arange(1.0, 9.0)
    with pytest.raises(RuntimeError, match="my_ops::mul4.out: output overlaps input without being it; pass separate "
                                           "tensors"):
        torch.ops.my_ops.mul4.out(x[:-1], output=x[1:])
    assert x.tolist() == list(range(1, 9)), "the rejected call wrote to its output"


def test_an_output_whose_elements_alias_is_rejected_like_aten():
    with pytest.raises(RuntimeError, match="unsupported operation: more than one element of the written-to tensor"):
        torch.ops.my_ops.mul4.out(torch.randn(4), output=torch.zeros(1).expand(4))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int16], ids=str)
def test_in_place_is_allowed(dtype):
    x = torch.arange(-4, 4, dtype=dtype)
    expected = x * 4
    assert torch.ops.my_ops.mul4.out(x, output=x).data_ptr() == x.data_ptr()
    assert_bit_exact(x, expected)


def test_resizing_a_non_empty_output_warns_like_aten(capfd):
    # Called through torch.ops, ATen's own out= ops warn on stderr too (torch.ops.aten.mul.out does the same).
    warning = "An output with one or more elements was resized since it had shape [5]"
    torch.ops.my_ops.mul4.out(torch.ones(3), output=torch.empty(0))  # empty: resized silently
    assert "was resized" not in capfd.readouterr().err
    torch.ops.my_ops.mul4.out(torch.ones(3), output=torch.empty(5))
    assert warning in capfd.readouterr().err


class CallOutVariant(torch.nn.Module):
    """Calls an out variant directly, into a fresh output, as a model may."""

    def __init__(self, op):
        super().__init__()
        self.out_op = getattr(torch.ops.my_ops, op).out

    def forward(self, x):
        return self.out_op(x, output=torch.empty_like(x))


@pytest.mark.parametrize("op", ["mul3", "mul4"])
def test_the_out_variant_exports_with_a_dynamic_dimension(op):
    # The out variant's Meta kernel keeps sizes symbolic: export and to_edge do not specialize the dimension.
    # (to_executorch of such a model then fails inside torch's decompose_auto_functionalized, which re-traces with
    # real tensors; calling the functional op, as the examples do, avoids that; see README.)
    from executorch.exir import to_edge

    batch = torch.export.Dim("batch", min=1, max=64)
    exported = torch.export.export(CallOutVariant(op), (torch.randn(4, 3),), dynamic_shapes=({0: batch},))
    out_op = getattr(torch.ops.my_ops, op).out
    (node,) = [n for n in exported.graph.nodes if n.target == out_op]
    assert isinstance(node.meta["val"].shape[0], torch.SymInt)
    edge = to_edge(exported).exported_program()
    (edge_output,) = [n for n in edge.graph.nodes if n.op == "output"][0].meta["val"]
    assert isinstance(edge_output.shape[0], torch.SymInt)


def test_errors_name_the_op_and_the_fix():
    with pytest.raises(RuntimeError, match="my_ops::mul4.out: output has dtype float64 but input has float32; they must match"):
        torch.ops.my_ops.mul4.out(torch.ones(2), output=torch.empty(2, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="input has unsupported dtype bool; supported: float32"):
        torch.ops.my_ops.mul4(torch.ones(2, dtype=torch.bool))
    with pytest.raises(RuntimeError, match="my_ops::mul4: input has unsupported dtype complex64"):
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


@pytest.mark.parametrize("autocast_dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64], ids=str)
def test_autocast_keeps_the_dtype_of_x_times_4(dtype, autocast_dtype):
    # Through autocast's fallthrough: a one-input op needs no autocast kernel of its own (custom_ops_2.cpp says why).
    assert not torch._C._dispatch_has_kernel_for_dispatch_key("my_ops::mul4", "AutocastCPU")
    x = helpers.full_range((16,), dtype)
    with torch.autocast("cpu", dtype=autocast_dtype):
        expected = x * 4
        actual = torch.ops.my_ops.mul4(x)
    assert actual.dtype == expected.dtype == dtype
    assert_bit_exact(actual, expected)


def test_export_under_autocast_adds_no_casts():
    with torch.autocast("cpu", dtype=torch.bfloat16):
        exported = torch.export.export(CallOp(torch.ops.my_ops.mul4.default), (torch.randn(4, 3),))
    targets = [n.target for n in exported.graph.nodes if n.op == "call_function"]
    assert targets == [torch.ops.my_ops.mul4.default], targets


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


def test_importing_custom_ops_2_registers_nothing_and_loading_imports_no_inductor(mul4_build):
    result = run_in_fresh_python(f"""
        import sys, torch
        rng = torch.random.get_rng_state()
        import custom_ops_2
        registered_on_import = hasattr(torch.ops.my_ops, "mul4")
        from flow import registration
        registration.load_aot_library({mul4_build.aot_lib!r})
        result = [registered_on_import, "torch._inductor" in sys.modules, torch.equal(rng, torch.random.get_rng_state())]
    """, fresh_imports=True)
    assert result == [False, False, True]


def test_a_missing_or_wrong_library_path_explains_how_to_build_it(mul4_build, tmp_path):
    with pytest.raises(FileNotFoundError, match="AOT library not found: .*test_custom_ops.sh cmake.*--jit"):
        registration.load_aot_library(str(tmp_path / "nope.so"))
    not_a_library = tmp_path / "libfake.so"
    not_a_library.write_text("not ELF")
    result = run_in_fresh_python(f"""
        from flow import registration
        try:
            registration.load_aot_library({str(not_a_library)!r})
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
    # mul4's sources alone, as its CMake build (custom_ops_2/) compiles them: the other C++ ops would triple the compile.
    jit = run_in_fresh_python("import torch\nfrom flow import declarations, registration\n"
                              "registration.build_jit_library([declarations.find('my_ops::mul4')])\n" + probe,
                              timeout=900)
    cmake = {}
    exec(compile("import torch\n" + probe, "probe", "exec"), cmake)
    assert jit == cmake["result"]


def test_the_loader_expects_the_ops_the_library_was_built_with(mul4_build, declared):
    assert registration.expected_ops(mul4_build.aot_lib) == [declared["my_ops::mul4"]]


def test_a_library_without_an_expected_op_is_an_error_naming_it_and_the_build(mul4_build):
    result = run_in_fresh_python(f"""
        import dataclasses
        from flow import declarations, registration
        relu6 = dataclasses.replace(declarations.load()["my_ops::mul4"], name="my_ops::relu6")
        try:
            registration.load_aot_library({mul4_build.aot_lib!r}, expect=[relu6])
            result = "loaded"
        except RuntimeError as err:
            result = str(err)
    """)
    assert "does not register my_ops::relu6: it was built without it" in result
    assert "bash test_custom_ops.sh cmake relu6" in result and "-DCUSTOM_OPS_ROOT_OPS=my_ops::relu6.out" in result
