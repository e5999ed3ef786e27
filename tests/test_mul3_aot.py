"""mul3's PyTorch side (custom_ops_1.py): the registered schemas, eager results, and what export produces."""

import os

import pytest
import torch

import custom_ops_1  # noqa: F401  (registers my_ops::mul3)
from flow.compare import assert_bit_exact
from flow.program import operators_in_program
from helpers import run_in_fresh_python


def test_schemas_are_exactly_as_documented():
    assert str(torch.ops.my_ops.mul3.default._schema) == "my_ops::mul3(Tensor input) -> Tensor"
    assert str(torch.ops.my_ops.mul3.out._schema) == (
        "my_ops::mul3.out(Tensor input, *, Tensor(a!) output) -> Tensor(a!)"
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32])
def test_eager_functional_and_out_variant(dtype):
    x = torch.arange(-6, 6, dtype=dtype).reshape(3, 4)
    assert_bit_exact(torch.ops.my_ops.mul3(x), x * 3)
    out = torch.empty(0, dtype=dtype)
    result = torch.ops.my_ops.mul3.out(x, output=out)
    assert result.data_ptr() == out.data_ptr(), "the out variant must return its output argument"
    assert_bit_exact(out, x * 3)


def test_out_variant_rejects_an_output_of_another_dtype():
    with pytest.raises(RuntimeError, match="output has dtype float64 but input has float32; they must match"):
        torch.ops.my_ops.mul3.out(torch.ones(3), output=torch.empty(3, dtype=torch.float64))


def test_unsupported_dtype_is_rejected_with_the_supported_list():
    with pytest.raises(RuntimeError, match="input has unsupported dtype bool; supported: float32"):
        torch.ops.my_ops.mul3(torch.ones(3, dtype=torch.bool))


def test_export_lowers_mul3_to_its_out_variant_and_nothing_else(mul3_pte):
    assert operators_in_program(mul3_pte) == ["my_ops::mul3.out"]


def test_importing_registers_the_ops_and_does_nothing_else(tmp_path):
    result = run_in_fresh_python(f"""
        import os, sys
        os.chdir({str(tmp_path)!r})
        import torch
        rng = torch.random.get_rng_state()
        before = set(sys.modules)
        import custom_ops_1
        result = {{
            "project_modules": sorted(m for m in set(sys.modules) - before if not m.startswith("torch")),
            "files": os.listdir("."),
            "rng_untouched": torch.equal(rng, torch.random.get_rng_state()),
            "inductor_imported": "torch._inductor" in sys.modules,
            "y": torch.ops.my_ops.mul3(torch.ones(2)).tolist(),
        }}
    """, fresh_imports=True)
    assert result == {"project_modules": ["custom_ops_1"], "files": [], "rng_untouched": True,
                      "inductor_imported": False, "y": [3.0, 3.0]}


def test_an_export_that_fails_midway_leaves_the_previous_program_whole(tmp_path):
    # Flows running in parallel (the tests) export the same programs into one tree: a file is replaced only whole.
    from flow.export import written_whole

    path = str(tmp_path / "program.pte")
    written_whole(path, lambda f: f.write(b"the previous program"))

    def fails_midway(f):
        f.write(b"half of a new")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        written_whole(path, fails_midway)
    assert open(path, "rb").read() == b"the previous program"
    assert os.listdir(tmp_path) == ["program.pte"]
