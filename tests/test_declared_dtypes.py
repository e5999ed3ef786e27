"""An op's dtypes are stated once, in custom_ops.bzl: its kernels take their set from the header the build writes from
it (declared_dtypes/<namespace>/<name>.h, one per op, so that adding or changing an op recompiles its kernels alone),
and a Python-registered op's module, which must refuse the same dtypes before export, is checked against it when the
build is configured (tests/test_configure_errors.py). What each kernel then accepts is held by
tests/test_references.py."""

import glob
import os
import re

import pytest


def _header_sets(directory):
    """{"namespace::name": [ScalarType enumerator, ...]} from each header under directory (<namespace>/<name>.h) and its
    `using <name> = ...DtypeSet<...>;` line, which must name the op of its path."""
    sets = {}
    for path in sorted(glob.glob(os.path.join(directory, "*", "*.h"))):
        namespace, name = os.path.relpath(path, directory)[:-len(".h")].split(os.sep)
        with open(path) as f:
            text = f.read()
        assert f"namespace custom::native::declared_dtypes::{namespace} {{" in text, path
        (member, values), = re.findall(r"^using (\w+) = contract::DtypeSet<(.*)>;$", text, re.M)
        assert member == name, path
        sets[f"{namespace}::{name}"] = re.findall(r"ScalarType::(\w+)", values)
    return sets


def test_the_kernels_dtype_sets_are_the_declared_dtypes_in_order(declared, combined_build):
    # Each torch name's scalar type as ExecuTorch's own serializer names it (its enumerators, upper-cased), a table
    # of this test's: the generator's is not read.
    from executorch.exir.scalar_type import ScalarType

    et_names = {"float32": "FLOAT", "float64": "DOUBLE", "float16": "HALF", "bfloat16": "BFLOAT16", "uint8": "BYTE",
                "int8": "CHAR", "int16": "SHORT", "int32": "INT", "int64": "LONG"}
    assert set(et_names.values()) <= set(ScalarType.__members__)
    sets = _header_sets(os.path.join(combined_build.build_dir, "generated", "declared", "declared_dtypes"))
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
    from codegen.declared_dtypes import DtypeMismatch, headers

    with pytest.raises(DtypeMismatch) as err:
        headers([_python_op(tmp_path, "", dtypes=("float32", "complex64"))])
    assert str(err.value) == ("custom_ops.bzl: my_ops::scaled declares dtypes complex64, which no kernel can be compiled "
                              "for; the dtypes kernels take: float32, float64, float16, bfloat16, uint8, int8, int16, "
                              "int32, int64")



def test_an_op_added_changed_or_removed_touches_its_own_header_alone(declared, tmp_path, monkeypatch):
    # What keeps a new op from recompiling every kernel (and a copy of the repository with one more op from missing
    # the compiler cache for all of them): the other headers keep their bytes and their modification times.
    import dataclasses

    from codegen import run_codegen

    def write(ops):
        monkeypatch.setattr(run_codegen, "checked_declarations", lambda check_sources: {op.name: op for op in ops})
        run_codegen.declared_dtypes(str(tmp_path))
        return {os.path.relpath(p, tmp_path / "declared_dtypes"): (open(p).read(), os.stat(p).st_mtime_ns)
                for p in glob.glob(str(tmp_path / "declared_dtypes" / "*" / "*.h"))}

    *kept, removed = declared.values()
    before = write([*kept, removed])
    assert sorted(before) == sorted(f"{op.name.replace('::', '/')}.h" for op in declared.values())
    os.utime(tmp_path / "declared_dtypes" / "my_ops" / "rms_norm.h", ns=(1, 1))  # rewritten, it would move
    before["my_ops/rms_norm.h"] = (before["my_ops/rms_norm.h"][0], 1)

    added = dataclasses.replace(removed, name="my_ops::new_op", dtypes=("float32",))
    changed = dataclasses.replace(declared["my_ops::mul4"], dtypes=("float32",))
    after = write([added, *(changed if op.name == changed.name else op for op in kept)])
    assert "using new_op = contract::DtypeSet<ScalarType::Float>;" in after.pop("my_ops/new_op.h")[0]
    assert after.pop("my_ops/mul4.h")[0] != before.pop("my_ops/mul4.h")[0]
    assert before.pop(f"{removed.name.replace('::', '/')}.h")
    assert after == before
