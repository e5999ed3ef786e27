"""An op's dtypes are stated once, in custom_ops.bzl: its kernels take their set from the header the build writes from
it (declared_dtypes.h), and a Python-registered op's module, which must refuse the same dtypes before export, is
checked against it when the build is configured (tests/test_configure_errors.py). What each kernel then accepts is
held by tests/test_references.py."""

import os
import re

import pytest


def _header_sets(path):
    """{"namespace::name": [ScalarType enumerator, ...]} from the header's `using <name> = ...DtypeSet<...>;` lines."""
    sets, namespace = {}, None
    with open(path) as f:
        for line in f:
            if m := re.match(r"namespace (\w+) \{$", line.strip()):
                namespace = m.group(1)
            elif m := re.match(r"using (\w+) = contract::DtypeSet<(.*)>;$", line.strip()):
                sets[f"{namespace}::{m.group(1)}"] = re.findall(r"ScalarType::(\w+)", m.group(2))
    return sets


def test_the_kernels_dtype_sets_are_the_declared_dtypes_in_order(declared, combined_build):
    # Each torch name's scalar type as ExecuTorch's own serializer names it (its enumerators, upper-cased), a table
    # of this test's: the generator's is not read.
    from executorch.exir.scalar_type import ScalarType

    et_names = {"float32": "FLOAT", "float64": "DOUBLE", "float16": "HALF", "bfloat16": "BFLOAT16", "uint8": "BYTE",
                "int8": "CHAR", "int16": "SHORT", "int32": "INT", "int64": "LONG"}
    assert set(et_names.values()) <= set(ScalarType.__members__)
    sets = _header_sets(os.path.join(combined_build.build_dir, "generated", "declared", "declared_dtypes.h"))
    assert sets.keys() == declared.keys()
    for name, op in declared.items():
        assert [s.upper() for s in sets[name]] == [et_names[d] for d in op.dtypes], name


def _module_with_dtypes(tmp_path, name, text):
    path = tmp_path / f"{name}.py"
    path.write_text(f"import torch\n\n{text}\n")
    return path


def _python_op(tmp_path, module_text, dtypes=("float32", "bfloat16"), defined_by=None):
    from flow.declarations import DeclaredOp

    _module_with_dtypes(tmp_path, "scaled", module_text)
    return DeclaredOp(name="my_ops::scaled", registered_from="python", kernel_sources=("scaled_out.cpp",),
                      example_program="scaled", reference="scaled.reference", dtypes=tuple(dtypes),
                      python_module="scaled", defined_by=defined_by)


@pytest.mark.parametrize("module_text, defined_by, problem", [
    ("DTYPES = (torch.float32, torch.bfloat16)", None, None),
    ("DTYPES = (torch.float32,)", None,
     "scaled.py: DTYPES is (float32) but custom_ops.bzl declares my_ops::scaled's dtypes as (float32, bfloat16); make "
     "the two agree, in that order"),
    ("DTYPES = (torch.bfloat16, torch.float32)", None,
     "scaled.py: DTYPES is (bfloat16, float32) but custom_ops.bzl declares my_ops::scaled's dtypes as (float32, "
     "bfloat16); make the two agree, in that order"),
    ("FLOATS = (torch.float32, torch.bfloat16)", None,
     "scaled.py: no DTYPES; my_ops::scaled's module must state the dtypes its kernels accept, as custom_ops.bzl "
     "declares them: DTYPES = (torch.float32, torch.bfloat16)"),
    ("FLOATS = (torch.float32, torch.bfloat16)", "other.library", None),  # the defining library refuses
    ("DTYPES = tuple(getattr(torch, n) for n in ('float32', 'bfloat16'))", None,
     "scaled.py:3: DTYPES must be a literal tuple of torch dtypes, e.g. (torch.float32, torch.bfloat16), so the build "
     "can read it"),
], ids=["agrees", "fewer", "another order", "none", "none, defined elsewhere", "not a literal"])
def test_a_python_modules_dtypes_are_checked_against_the_declaration(tmp_path, module_text, defined_by, problem):
    from codegen.declared_dtypes import DtypeMismatch, check_python_modules

    op = _python_op(tmp_path, module_text, defined_by=defined_by)
    if problem is None:
        assert check_python_modules([op], str(tmp_path)) == [str(tmp_path / "scaled.py")]
        return
    with pytest.raises(DtypeMismatch) as err:
        check_python_modules([op], str(tmp_path))
    assert str(err.value) == problem


def test_a_declared_dtype_no_kernel_can_be_compiled_for_is_refused_by_name(tmp_path):
    from codegen.declared_dtypes import DtypeMismatch, header

    with pytest.raises(DtypeMismatch) as err:
        header([_python_op(tmp_path, "", dtypes=("float32", "complex64"))])
    assert str(err.value) == ("custom_ops.bzl: my_ops::scaled declares dtypes complex64, which no kernel can be compiled "
                              "for; the dtypes kernels take: float32, float64, float16, bfloat16, uint8, int8, int16, "
                              "int32, int64")

