"""The declared references (custom_ops.bzl `reference`): each computes its op with ATen ops, and they are what the
verifier and the profiler compare with. mul4's PyTorch kernel calls the same functor and loop as its runtime kernel,
so comparing the two cannot see a bug they share: a functor one ulp off must fail the flow's verifier and the profile
mode, through the reference, while the two kernels still agree with each other."""

import os
import re
import subprocess

import pytest
import torch

from flow import declarations
from flow.compare import bit_difference, mismatches
from helpers import ALL_DTYPES, copy_repository, full_range, run_in_fresh_python

DECLARED = declarations.load()
# Ops declared by one call on tensors: their inputs can be made in any dtype.
CALLED_ON_TENSORS = [op for op in DECLARED.values() if op.example_inputs and not op.from_aten]
# Ops declared with an example model: swept through their dtypes from the first call the model makes. ATen's ops
# (registered_from "aten") are left out: in PyTorch they are ATen's own kernel, their reference; their runtime kernels
# are checked against it in every declared dtype, and refusing the others, in test_kernels_the_runtime_lacks.py.
IN_A_MODEL = [op for op in DECLARED.values() if op.example_model and not op.from_aten]
REFUSED = ("bool", "complex64")  # dtypes no op takes, only ever refused


def inputs_in(op, dtype_name: str) -> list[torch.Tensor]:
    """The example's inputs with every tensor of the first input's dtype made in `dtype_name`."""
    first = op.example_inputs[0][0]
    names = [dtype_name if declared_dtype == first else declared_dtype for declared_dtype, _ in op.example_inputs]
    return [full_range(shape, getattr(torch, name), seed=3 + i) if name in ALL_DTYPES
            else torch.zeros(shape, dtype=getattr(torch, name))  # bool, complex: only ever refused
            for i, (name, (_, shape)) in enumerate(zip(names, op.example_inputs))]


@pytest.mark.parametrize("name, dtype_name", [(op.name, d) for op in CALLED_ON_TENSORS for d in op.dtypes])
def test_each_op_computes_its_reference_in_every_declared_dtype(name, dtype_name, declared, aot_ops, python_ops):
    op = declared[name]
    inputs = inputs_in(op, dtype_name)
    expected = op.reference_function()(*inputs)
    expected = list(expected) if isinstance(expected, (tuple, list)) else [expected]
    actual = op.packet()(*inputs)
    actual = list(actual) if isinstance(actual, (tuple, list)) else [actual]
    assert mismatches(actual, expected, exact=op.bit_exact) == []


@pytest.mark.parametrize("name, dtype_name", [(op.name, d) for op in CALLED_ON_TENSORS
                                              for d in sorted({*ALL_DTYPES, *REFUSED} - set(op.dtypes))])
def test_each_op_refuses_every_dtype_it_does_not_declare(name, dtype_name, declared, aot_ops, python_ops):
    # Named the way torch names it (float32, not Float or torch.float32), and with the name of the op called (the
    # functional one, not the out variant whose kernel fills its result).
    op = declared[name]
    with pytest.raises(RuntimeError, match=rf"^{op.name}: .*\b{dtype_name}\b"):
        op.packet()(*inputs_in(op, dtype_name))


def recorded_call(op) -> tuple:
    """The arguments of the first call of `op` its example model makes, in eager (cloned when called)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from flow.export import example_of

    model, runs = example_of(op)
    calls = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if not calls and func.overloadpacket is op.packet():
                calls.append(tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args))
            return func(*args, **(kwargs or {}))

    with torch.no_grad(), Record():
        model(*runs[0])
    assert calls, f"{op.example_model}() never calls {op.name}"
    return calls[0]


def recorded_call_in(op, dtype_name: str) -> list:
    """That call with every tensor of its first tensor's dtype in `dtype_name` (the values converted; zeros for a
    dtype no op takes), the other arguments as they were."""
    args = recorded_call(op)
    first = next(a.dtype for a in args if isinstance(a, torch.Tensor))
    dtype = getattr(torch, dtype_name)
    return [a if not (isinstance(a, torch.Tensor) and a.dtype == first) else
            torch.zeros(a.shape, dtype=dtype) if dtype_name in REFUSED else a.to(dtype) for a in args]


@pytest.mark.parametrize("name, dtype_name", [(op.name, d) for op in IN_A_MODEL for d in op.dtypes])
def test_each_op_in_a_model_computes_its_reference_in_every_declared_dtype(name, dtype_name, declared, aot_ops,
                                                                           python_ops):
    op = declared[name]
    expected_args, actual_args = recorded_call_in(op, dtype_name), recorded_call_in(op, dtype_name)
    expected = op.reference_function()(*expected_args)
    actual = op.packet()(*actual_args)
    expected = list(expected) if isinstance(expected, (tuple, list)) else [expected]
    actual = list(actual) if isinstance(actual, (tuple, list)) else [actual]
    assert mismatches(actual, expected, exact=op.bit_exact) == []
    # An op that writes an argument in place (a cache) writes the reference's bytes too.
    assert mismatches([a for a in actual_args if isinstance(a, torch.Tensor)],
                      [a for a in expected_args if isinstance(a, torch.Tensor)], exact=op.bit_exact) == []


@pytest.mark.parametrize("name, dtype_name", [(op.name, d) for op in IN_A_MODEL
                                              for d in sorted({*ALL_DTYPES, *REFUSED} - set(op.dtypes))])
def test_each_op_in_a_model_refuses_every_dtype_it_does_not_declare(name, dtype_name, declared, aot_ops, python_ops):
    op = declared[name]
    with pytest.raises(RuntimeError, match=rf"^{op.name}: .*\b{dtype_name}\b"):
        op.packet()(*recorded_call_in(op, dtype_name))


def test_references_are_ours_not_the_kernels():
    # Each reference is plain Python over ATen ops: no call into my_ops, so it cannot share a kernel's code.
    import inspect

    import custom_ops_1
    import custom_ops_2

    for function in (custom_ops_1.mul3_reference, custom_ops_2.mul4_reference):
        assert "my_ops" not in inspect.getsource(function), function.__name__


def test_the_reference_interpreter_calls_the_reference_not_the_op(mul4_aot, tmp_path):
    # A stand-in reference that differs from the op shows up in the result, in the exported graph and the edge graph.
    from executorch.exir import to_edge

    from flow.export import CallOp, export_to_pte, pt2_path
    from flow.reference import ReferenceInterpreter, reference_outputs

    stand_in = type("StandIn", (), {"name": "my_ops::mul4", "functional_overload": "default",
                                    "reference_function": lambda self: lambda x: x * 5})()
    x = torch.randn(3, 4)
    pte = export_to_pte(CallOp(torch.ops.my_ops.mul4.default), (x,), tmp_path / "mul4.pte")
    (exported,) = reference_outputs(pt2_path(pte), [x], [stand_in])
    edge = to_edge(torch.export.export(CallOp(torch.ops.my_ops.mul4.default), (x,))).exported_program().module()
    from_edge = ReferenceInterpreter(edge, {"my_ops::mul4": ("default", lambda x: x * 5)}).run(x)
    assert torch.equal(exported, x * 5) and torch.equal(from_edge, x * 5)


# mul4's functor, mutated: float32 results one ulp up. Both of mul4's kernels (runtime and PyTorch) use it.
ONE_ULP_UP = """
    if constexpr (std::is_same_v<T, float>) {
      if (kFactor == 4) {
        return std::nextafter(x * 4.0f, 1e30f);
      }
    }
"""


@pytest.fixture(scope="module")
def repo_with_a_wrong_functor(tmp_path_factory):
    repo = copy_repository(tmp_path_factory.mktemp("wrong_functor") / "repo")
    path = os.path.join(repo, "kernel_helpers", "multiply_by_constant.h")
    source = open(path).read()
    anchor = "    if constexpr (std::is_integral_v<T>) {\n"
    assert anchor in source
    with open(path, "w") as f:
        f.write(source.replace("#include <cstdint>\n", "#include <cmath>\n#include <cstdint>\n")
                .replace(anchor, ONE_ULP_UP + anchor, 1))
    return repo


def run_script(repo, *args):
    return subprocess.run(["bash", os.path.join(repo, "test_custom_ops.sh"), *args], capture_output=True, text=True,
                          timeout=1800, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})


def test_a_wrong_functor_fails_the_flows_verifier(repo_with_a_wrong_functor):
    proc = run_script(repo_with_a_wrong_functor, "cmake", "mul4")
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert "error: outputs DIFFER from the reference" in proc.stdout
    for where in ("runner, execution 1", "Python runtime, execution 1"):
        assert f"MISMATCH {where}: output 0: 6 of 6 elements differ bit for bit" in proc.stderr, proc.stderr[-3000:]
    # The comparison the verifier used to make: mul4's PyTorch kernel agrees with the wrong runtime kernel.
    build = os.path.join(repo_with_a_wrong_functor, "cmake-out", "custom_ops_2")
    agree = run_in_fresh_python(f"""
        import torch
        from flow.runtime import load_kernel_library, load_method_checked
        torch.ops.load_library({build + '/libcustom_ops_aot_lib.so'!r})
        load_kernel_library({build + '/libcustom_ops_lib.so'!r})
        x = torch.randn(2, 3)
        (runtime,) = load_method_checked({repo_with_a_wrong_functor + '/custom_ops_2.pte'!r}).execute([x])
        result = [torch.equal(runtime, torch.ops.my_ops.mul4(x)), torch.equal(runtime, x * 4)]
    """)
    assert agree == [True, False]


def test_a_wrong_functor_is_named_by_the_profile_mode(repo_with_a_wrong_functor):
    # mul4's example, in the build the test above made (cmake-out/custom_ops_2): nothing to rebuild.
    proc = run_script(repo_with_a_wrong_functor, "profile", "mul4")
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert "mul4.out                 DIFFERS" in proc.stdout
    assert "error: first op whose output differs from its reference: mul4.out in execution 1" in proc.stderr


@pytest.fixture(scope="module")
def float32_examples(declared, python_ops, aot_ops, tmp_path_factory) -> dict[str, str]:
    from flow.export import export_example

    directory = tmp_path_factory.mktemp("examples")
    return {op.name: export_example(op, directory) for op in CALLED_ON_TENSORS}


@pytest.mark.parametrize("name, dtype_name", [(op.name, d) for op in CALLED_ON_TENSORS
                                              for d in sorted({*ALL_DTYPES, "bool", "complex64"} - set(op.dtypes))])
def test_each_runtime_kernel_refuses_every_dtype_it_does_not_declare(name, dtype_name, float32_examples,
                                                                      combined_build, tmp_path):
    # PyTorch refuses these before export, so the program is rewritten (tests/pte_surgery.py): every tensor of the
    # op's call, its inputs and its output, declared in the other dtype, and the inputs fed as raw bytes.
    from executorch.exir.schema import ScalarType, Tensor

    from flow.dtypes import SCALAR_TYPES
    from helpers import run_runner
    from pte_surgery import edit_plan

    op = DECLARED[name]
    scalar_type = next(k for k, v in SCALAR_TYPES.items() if v == getattr(torch, dtype_name))

    size = torch.empty((), dtype=getattr(torch, dtype_name)).element_size()
    grow = -(-size // getattr(torch, op.example_inputs[0][0]).itemsize)  # wider elements: a plan as many times larger

    def change(plan):
        for value in plan.values:
            if isinstance(value.val, Tensor):
                value.val.scalar_type = ScalarType[scalar_type]
                if value.val.allocation_info is not None:
                    value.val.allocation_info.memory_offset_low *= grow
        plan.non_const_buffer_sizes = [s * grow for s in plan.non_const_buffer_sizes]

    bad = edit_plan(float32_examples[op.name], str(tmp_path / "bad.pte"), change)
    files = []
    for i, (_, shape) in enumerate(op.example_inputs):
        files.append(tmp_path / f"input{i}.bin")
        files[-1].write_bytes(bytes(size * torch.Size(shape).numel()))
    proc = run_runner(combined_build.runner, f"--model_path={bad}", f"--inputs={','.join(map(str, files))}")
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert proc.returncode == 1 and len(errors) == 1, proc.stderr[-2000:]
    assert re.search(rf"{op.name}(\.out)?: [^\n]*\b{dtype_name}\b", proc.stderr), proc.stderr[-2000:]
