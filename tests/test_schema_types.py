"""flow/schema_types.py's table is what executorch's codegen writes: an op using every listed argument type is
generated in both modes and each argument's C++ type compared; an unlisted type is refused when the declarations are
checked; docs/adding-an-op.md shows the same table."""

import os
import re
import subprocess
import sys

import pytest

from flow import schema_types
from helpers import REPO_ROOT

NATIVE = os.path.join(os.path.dirname(__import__("torchgen").__file__), "packaged", "ATen", "native")


def normalized(cpp_type: str) -> str:
    text = cpp_type.replace("TORCH_API ", "").replace("torch::executor::", "").replace("executorch::aten::", "").replace("::std::", "std::")
    return re.sub(r"\s+", "", text)


@pytest.mark.parametrize("aten", [False, True], ids=["ExecuTorch mode", "ATen mode"])
def test_the_table_is_what_codegen_writes(aten, tmp_path):
    types = list(schema_types.ARGUMENT_TYPES)
    arguments = ", ".join(f"{t.replace('(a!)', '(x!)')} a{i}" for i, t in enumerate(types))
    (tmp_path / "ops.yaml").write_text(
        f"- func: probe::every.out({arguments}, *, Tensor(z!) out) -> Tensor(z!)\n"
        "  kernels:\n    - arg_meta: null\n      kernel_name: probe::every_out\n"
        "- func: probe::two.out(Tensor a, *, Tensor(a!) x, Tensor(b!) y) -> (Tensor(a!), Tensor(b!))\n"
        "  kernels:\n    - arg_meta: null\n      kernel_name: probe::two_out\n")
    sys.path.insert(0, os.path.join(REPO_ROOT, "codegen"))
    import run_codegen

    run_codegen.write_selection(str(tmp_path / "selected.yaml"), ["probe::every.out", "probe::two.out"])
    cmd = [sys.executable, "-m", "executorch.codegen.gen", "--source-path", os.path.join(REPO_ROOT, "codegen"),
           "--op-selection-yaml-path", str(tmp_path / "selected.yaml"),
           "--install-dir", str(tmp_path / "out"), "--custom-ops-yaml-path", str(tmp_path / "ops.yaml"),
           "--tags-path", os.path.join(NATIVE, "tags.yaml"), "--aten-yaml-path", os.path.join(NATIVE, "native_functions.yaml")]
    subprocess.run(cmd + (["--use-aten-lib"] if aten else []), check=True, capture_output=True)
    header = (tmp_path / "out" / "NativeFunctions.h").read_text()
    declaration = re.search(r"every_out\((?:torch::executor::KernelRuntimeContext & context, )?(.*?)\);", header).group(1)
    generated = {int(name[1:]): normalized(text) for text, name in re.findall(r"(.*?) (a\d+)(?:, |$)", declaration)}
    expected = {i: normalized(schema_types.ARGUMENT_TYPES[t][1 if aten else 0]) for i, t in enumerate(types)}
    assert generated == expected
    two = re.search(r"(\S.*?) two_out\(", header).group(1)
    assert normalized(two) == normalized(schema_types.RETURN_TYPES["(Tensor(a!), Tensor(b!))"][1 if aten else 0])


def test_an_unlisted_argument_type_is_refused_naming_the_op_and_argument():
    assert schema_types.unsupported_arguments("my_ops::x.out(Tensor input, Layout layout, Dimname d, *, "
                                              "Tensor(a!) out) -> Tensor(a!)") == ["layout: Layout", "d: Dimname"]
    for schema in ("my_ops::rms_norm.out(Tensor input, Tensor weight, float eps=1e-06, *, Tensor(a!) out) -> "
                   "Tensor(a!)", "my_ops::q.out(Tensor input, SymInt bits=8, *, Tensor(a!) v, Tensor(b!) s) -> "
                   "(Tensor(a!), Tensor(b!))"):
        assert schema_types.unsupported_arguments(schema) == []


def test_the_recipe_page_shows_the_table():
    with open(os.path.join(REPO_ROOT, "docs", "adding-an-op.md")) as f:
        assert schema_types.markdown_table() in f.read()
