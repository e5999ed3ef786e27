"""Untrusted programs never crash the runtime: hundreds of seeded mutations of a valid program (tests/pte_mutations.py:
byte flips, truncations, inserted/deleted runs, structured edits through executorch's serializer), each class of
failure the issue measured, and the fuzzer's regression inputs, through the runner (also its ASan+UBSan build) and
the ExecuTorch Python runtime with the kernel library.

For every mutant: no signal, no hang, no sanitizer report; a failure is exactly one `error:` line and exit 1; and
exit 0 only with a correct answer. A mutant is a different program, so "correct" is judged on an all-ones input:
every output element is 3 (computed by mul3), 1 (the mutant returns its input) or 0 (it returns a planned tensor
nothing wrote, which the runtimes zero), never anything else, such as the 3.00002 a misaligned, overlapping output
gave. None of them may reach ExecuTorch's own abort (ET_CHECK), which the runner would turn into an error line: each
class is stopped before that, by verification, the pre-flight or the kernels' checks."""

import os
import re
import subprocess

import pytest

from helpers import outcome, run_flow, run_in_fresh_python, run_runner
import regression_inputs
from pte_mutations import mutations
from pte_surgery import edit_plan, replace_kernel_argument, rewrite_output_tensor

COUNT = 1000  # 250 of each kind
REGRESSIONS = regression_inputs.names()  # the fuzzer's past findings (tests/fuzz_regressions/*.hex)


@pytest.fixture(scope="module")
def regression_files(tmp_path_factory) -> dict[str, str]:
    assert REGRESSIONS, "no regression inputs in tests/fuzz_regressions/"
    return dict(zip(REGRESSIONS, regression_inputs.decode(tmp_path_factory.mktemp("regressions"))))


@pytest.fixture(scope="module")
def mutant_files(mul3_pte, declared, aot_ops, python_ops, tmp_path_factory):
    """COUNT mutants: half of mul3's program, the rest shared by the examples with scalars, several inputs and
    outputs, and a mutable buffer (rms_norm, update_cache, quantize_rows)."""
    from flow.export import export_example

    directory = tmp_path_factory.mktemp("mutants")
    others = [export_example(op, directory) for op in declared.values() if op.example_model is not None]
    shares = [(mul3_pte, COUNT // 2)] + [(pte, COUNT // 2 // len(others)) for pte in others]
    files = []
    for seed, (pte, count) in enumerate(shares):
        with open(pte, "rb") as f:
            data = f.read()
        for kind, what, mutant in mutations(data, seed=seed, count=count):
            path = directory / f"{len(files):04d}_{os.path.basename(pte)[:-4]}_{kind}.pte"
            path.write_bytes(mutant)
            files.append((str(path), what))
    return files


def test_a_mutant_of_every_kind_exists(mutant_files):
    kinds = {os.path.basename(path).rsplit("_", 1)[1][:-4] for path, _ in mutant_files}
    assert kinds == {"flip", "truncate", "splice", "structured"} and len(mutant_files) >= 500


def test_mutated_programs_through_the_runner(any_runner, mutant_files):
    problems, counts = [], {}
    for path, what in mutant_files:
        try:
            result = outcome(run_runner(any_runner, f"--model_path={path}", timeout=20),
                             values_known="_custom_ops_1_" in os.path.basename(path))
        except subprocess.TimeoutExpired:
            result = "hang (20 s)"
        counts[result] = counts.get(result, 0) + 1
        if result not in ("ok", "clean"):
            problems.append(f"{os.path.basename(path)} ({what}): {result}")
    assert problems == [], f"{counts}\n" + "\n".join(problems[:20])
    assert counts.get("clean", 0) > COUNT // 2  # most mutants are invalid, and said so


PYTHON_RUNTIME = """
import json, torch
# The kernel-call check needs the schemas of the ops the programs call.
import ops.quantize_rows.quantize_rows, ops.update_cache.update_cache
from flow.runtime import load_kernel_library, load_method_checked
load_kernel_library({kernel_lib!r})
results = []
for path in {paths!r}:
    with open({progress!r}, "w") as f:
        f.write(path)
    try:
        method = load_method_checked(path)
        inputs = [torch.ones(v.tensor.sizes, dtype=v.tensor.dtype) for v in method.spec.inputs]
        outputs = method.execute(inputs)
        values = [v for o in outputs if isinstance(o, torch.Tensor) for v in o.double().flatten().tolist()]
        wrong = [v for v in values if v not in (0.0, 1.0, 3.0)] if "_custom_ops_1_" in path else []
        results.append("ok" if not wrong else "wrong values " + str(wrong[:4]))
    except Exception as err:
        results.append("error")
result = results
"""


def test_mutated_programs_through_the_python_runtime(combined_build, mutant_files, regression_files, tmp_path):
    # Through flow.runtime.load_method_checked(): ExecuTorch's own load_program() + execute() ends the interpreter
    # (ET_CHECK in Method::get_outputs) on a program whose output refers past its values.
    progress = tmp_path / "progress"
    code = PYTHON_RUNTIME.format(kernel_lib=combined_build.kernel_lib, paths=[p for p, _ in mutant_files] + list(regression_files.values()),
                                 progress=str(progress))
    try:
        results = run_in_fresh_python(code, timeout=600)
    except AssertionError as err:  # a signal ends the interpreter: name the mutant it was on
        pytest.fail(f"the Python runtime died on {progress.read_text()}: {str(err)[-1500:]}")
    bad = [(path, r) for (path, _), r in zip(mutant_files, results) if r not in ("ok", "error")]
    assert bad == []
    assert results.count("error") > COUNT // 2


def assert_one_error_line(proc, *fragments):
    assert outcome(proc) == "clean", (proc.returncode, proc.stderr[-2000:])
    (line,) = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    for fragment in fragments:
        assert fragment in proc.stderr, (fragment, proc.stderr[-2000:])
    return line


# Each class the issue measured as a crash, an abort or a wrong answer, rebuilt on purpose.
CLASSES = {
    "output misaligned and overlapping the input (was: wrong answer)": (
        lambda src, dst: rewrite_output_tensor(src, dst, memory_offset=33),
        "my_ops::mul3.out: output has no memory or memory not aligned to its 4-byte elements"),
    "output aligned but partially over the input": (
        lambda src, dst: rewrite_output_tensor(src, dst, memory_offset=36),  # the input sits at bytes 32..56
        "my_ops::mul3.out: output overlaps input without being it"),
    "a 1 TiB planned buffer (was: bad_alloc abort)": (
        lambda src, dst: _planned_buffer(src, dst, 2**40),
        "memory-planned buffers need at least 1099511627776 bytes, more than --max_memory=1073741824"),
    "an output index past the values (was: ET_CHECK abort in get_outputs)": (
        lambda src, dst: _output_index(src, dst, 1000),
        "output 0 refers to no valid value"),
    "a kernel argument that is not a tensor (was: ET_CHECK abort in the generated unboxing)": (
        lambda src, dst: replace_kernel_argument(src, dst, 0, _int(7)),
        "my_ops::mul3.out: argument 0 (input) is Int where the kernel takes Tensor"),
}


def _int(value):
    from executorch.exir.schema import Int

    return Int(value)


def _planned_buffer(src, dst, size):
    return edit_plan(src, dst, lambda plan: plan.non_const_buffer_sizes.__setitem__(-1, size))


def _output_index(src, dst, index):
    return edit_plan(src, dst, lambda plan: plan.outputs.__setitem__(0, index))


@pytest.mark.parametrize("case", CLASSES)
def test_each_measured_failure_class_is_one_error_line(case, any_runner, mul3_pte, tmp_path, load_method):
    make, message = CLASSES[case]
    bad = make(mul3_pte, str(tmp_path / "bad.pte"))
    assert_one_error_line(run_runner(any_runner, f"--model_path={bad}"), message)
    import torch

    from flow.runtime import load_method_checked

    with pytest.raises((RuntimeError, ValueError)):  # the Python runtime refuses it too, and the process lives on
        load_method_checked(bad).execute([torch.ones(2, 3)])


@pytest.mark.parametrize("name", REGRESSIONS)
def test_the_fuzzers_findings_stay_fixed(name, regression_files, any_runner):
    assert_one_error_line(run_runner(any_runner, f"--model_path={regression_files[name]}"))


def test_the_memory_budget_is_a_flag(mul3_pte, any_runner):
    line = assert_one_error_line(run_runner(any_runner, f"--model_path={mul3_pte}", "--max_memory=16"))
    assert "more than --max_memory=16; raise --max_memory if you trust this program" in line
    assert run_runner(any_runner, f"--model_path={mul3_pte}", "--max_memory=1M").returncode == 0


@pytest.mark.parametrize("level", ["internal_consistency", "minimal"])
def test_the_verification_level_is_a_flag(level, mul3_pte, any_runner):
    proc = run_runner(any_runner, f"--model_path={mul3_pte}", f"--verification={level}")
    assert proc.returncode == 0 and "values: [3, 3, 3, 3, 3, 3]" in proc.stdout


def test_every_example_verifies_in_the_sanitized_runner(sanitized_build, combined_build, declared, aot_ops,
                                                       python_ops, tmp_path):
    from flow.export import export_example

    # One verifier process for every example (torch imported once); each program gets its own verdict line.
    programs = [export_example(op, tmp_path) for op in declared.values()]
    proc = run_flow("verify", *(arg for pte in programs for arg in ("--pte", pte)), "--runner", sanitized_build.runner,
                    "--aot_library", combined_build.aot_lib, env={"ASAN_OPTIONS": "exitcode=86"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "Sanitizer" not in proc.stderr
    for pte in programs:
        assert f"{os.path.basename(pte)}: outputs match the reference" in proc.stdout, pte


@pytest.mark.parametrize("where", ["a tensor", "past the values"])
def test_a_list_item_of_another_kind_is_one_error_line(where, decoder_programs, combined_build, tmp_path):
    # Found by libFuzzer on the decoder: an IntList item naming a Tensor aborted in ExecuTorch's et_view (EValue::toInt's
    # ET_CHECK, reached through BoxedEvalueList). Both runtimes now refuse the program before loading it.
    from executorch.exir.schema import IntList, Tensor

    from flow import program

    def change(plan):
        index = next(i for i, v in enumerate(plan.values) if isinstance(v.val, IntList) and len(v.val.items) > 1)
        tensor = next(i for i, v in enumerate(plan.values) if isinstance(v.val, Tensor))
        plan.values[index].val.items[1] = tensor if where == "a tensor" else len(plan.values) + 7

    bad = edit_plan(decoder_programs["decoder"], str(tmp_path / "bad.pte"), change)
    proc = run_runner(combined_build.runner, f"--model_path={bad}", "--prompt=1", "--new_tokens=1")
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    words = "whose kind is Tensor, not Int" if where == "a tensor" else "outside the method's"
    assert proc.returncode == 1 and len(errors) == 1 and words in errors[0], proc.stderr[-2000:]
    with pytest.raises(program.ProgramError, match=words):
        program.check(bad)


def input_on_a_constant(plan):
    constant = next(v.val.data_buffer_idx for v in plan.values
                    if type(v.val).__name__ == "Tensor" and v.val.data_buffer_idx > 0)
    tokens = plan.values[plan.inputs[0]].val
    tokens.data_buffer_idx, tokens.allocation_info = constant, None


def input_on_external_data(plan):
    from executorch.exir.schema import ExtraTensorInfo, TensorDataLocation

    tokens = plan.values[plan.inputs[0]].val
    tokens.allocation_info = None
    tokens.extra_tensor_info = ExtraTensorInfo(fully_qualified_name="tokens", location=TensorDataLocation.EXTERNAL)


@pytest.mark.parametrize("edit, where", [(input_on_a_constant, r"constant buffer \d+"),
                                         (input_on_external_data, "external data")],
                         ids=["a constant buffer", "external named data"])
def test_an_input_that_is_the_programs_own_data_is_one_error_line(edit, where, decoder_programs, combined_build,
                                                                     load_method, tmp_path):
    # Found by the structured mutants of my_ops::decoder_layer's example: an input's tensor pointing at a constant
    # buffer. set_input copied the caller's values over the constant: in the runner (its own copy of the file) a wrong
    # answer, in the Python runtime (the program mapped from a sealed, read-only memfd) a SIGSEGV. Each field the check
    # reads (Tensor.data_buffer_idx, ExtraTensorInfo.location) is set here through the serializer.
    from flow import program

    bad = edit_plan(decoder_programs["decoder"], str(tmp_path / "bad.pte"), edit)
    words = rf"input 0 is data the program holds \({where}\), not planned memory or the caller's"
    proc = run_runner(combined_build.runner, f"--model_path={bad}", "--prompt=1", "--new_tokens=1")
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert proc.returncode == 1 and len(errors) == 1, proc.stderr[-2000:]
    assert re.search(words, errors[0]), errors[0]
    with pytest.raises(program.ProgramError, match=words):
        load_method(bad)


def test_a_tensor_of_a_dtype_executorch_does_not_define_is_one_error_line(decoder_programs, combined_build, tmp_path):
    # Found by libFuzzer on the decoder (seed 1, in a clean clone): the tokens input's dtype byte set to -1 aborted in
    # MethodMeta::input_tensor_meta (elementSize's ET_CHECK); ExecuTorch's own validation logs it and lets it pass for
    # a dynamic input. The serializer cannot write an undefined dtype, so the byte is found by writing two defined ones.
    from executorch.exir.schema import ScalarType

    from flow import program

    def with_dtype(dtype):
        path = edit_plan(decoder_programs["decoder"], str(tmp_path / f"{dtype.name}.pte"),
                         lambda plan: setattr(plan.values[plan.inputs[0]].val, "scalar_type", dtype))
        with open(path, "rb") as f:
            return bytearray(f.read())

    as_float, as_double = with_dtype(ScalarType.FLOAT), with_dtype(ScalarType.DOUBLE)
    differ = [i for i, (a, b) in enumerate(zip(as_float, as_double)) if a != b]
    assert len(as_float) == len(as_double) and len(differ) == 1, differ[:8]
    as_float[differ[0]] = 0xFF
    bad = tmp_path / "bad.pte"
    bad.write_bytes(as_float)
    proc = run_runner(combined_build.runner, f"--model_path={bad}", "--prompt=1", "--new_tokens=1")
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert proc.returncode == 1 and len(errors) == 1, proc.stderr[-2000:]
    assert "is a tensor of dtype -1, which this ExecuTorch does not define" in errors[0]
    with pytest.raises(program.ProgramError, match="-1 is not a valid ScalarType"):
        program.check(str(bad))


# ExecuTorch's own kernels unbox their arguments unchecked. Each case is a call both runtimes now refuse from the
# schemas' kinds (flow/argument_kinds.py; the runner compiles in the table generated from it) before any kernel runs,
# in the same words. The first is libFuzzer's finding: an Int for unsqueeze_copy's self aborted in EValue::toTensor().
def _first_aten_out(name):
    """An ATen out variant whose first argument is a Tensor."""
    import torch

    if not (name.startswith("aten::") and name.endswith("out")):
        return False
    op, overload = name[len("aten::"):].split(".")
    return str(getattr(getattr(torch.ops.aten, op), overload)._schema.arguments[0].type) == "Tensor"


KERNEL_CALLS = {  # case: (which call, the change, what the error says given the call's operator and its schema)
    "an Int for a Tensor": (_first_aten_out, lambda call, new: call.args.__setitem__(0, new("int")),
                            lambda op, schema: f"{op}: argument {schema.arguments[0].name} is Int, but the schema "
                                               "declares Tensor"),
    "a Tensor for an int": ("aten::sym_size.int".__eq__, lambda call, new: call.args.__setitem__(1, new("tensor")),
                            lambda op, schema: f"{op}: argument dim is Tensor, but the schema declares int"),
    "a Double for an int list": ("executorch_prim::et_view.default".__eq__,
                                 lambda call, new: call.args.__setitem__(1, new("double")),
                                 lambda op, schema: f"{op}: argument size is Double, but the schema declares int[]"),
    "an Int for the view et_view writes": (
        "executorch_prim::et_view.default".__eq__, lambda call, new: call.args.__setitem__(2, new("int")),
        lambda op, schema: f"{op}: argument result is Int, but the schema declares Tensor"),
    "one value too few": (_first_aten_out, lambda call, new: call.args.pop(0),
                          lambda op, schema: f"{op} is called with {len(schema.arguments)} values, its schema has "
                                             f"{len(schema.arguments)} arguments plus the result"),
    "an operator past the method's": (_first_aten_out, lambda call, new: setattr(call, "op_index", 1000),
                                      lambda op, schema: "a kernel call names operator 1000, but the method has"),
}


@pytest.mark.parametrize("case", KERNEL_CALLS)
def test_a_kernel_call_its_schema_does_not_take_is_one_error_line(case, decoder_programs, combined_build,
                                                                    sanitized_build, tmp_path):
    import torch
    from executorch.exir.schema import Double, EValue, Int

    from flow import program

    which, change, words = KERNEL_CALLS[case]
    called = []

    def edit(plan):
        names = [f"{op.name}.{op.overload}" if op.overload else op.name for op in plan.operators]
        call = next(i.instr_args for chain in plan.chains for i in chain.instructions
                    if type(i.instr_args).__name__ == "KernelCall" and which(names[i.instr_args.op_index]))
        called.append(names[call.op_index])

        def new(kind):
            if kind == "tensor":
                return next(j for j, v in enumerate(plan.values) if type(v.val).__name__ == "Tensor")
            plan.values.append(EValue(Int(7) if kind == "int" else Double(0.5)))
            return len(plan.values) - 1

        change(call, new)

    bad = edit_plan(decoder_programs["decoder"], str(tmp_path / "bad.pte"), edit)
    (op,) = called
    namespace, name = op.split("::")
    schema = None if namespace != "aten" else getattr(getattr(torch.ops.aten, name.split(".")[0]),
                                                      name.split(".")[1])._schema
    expected = words(op, schema)
    for runner in (combined_build.runner, sanitized_build.runner):
        proc = run_runner(runner, f"--model_path={bad}", "--prompt=1", "--new_tokens=1")
        line = assert_one_error_line(proc, expected)  # "clean": refused before any kernel ran, not by the abort hook
        assert "has a kernel call the runtime cannot unbox safely" in line
    with pytest.raises(program.ProgramError, match="^" + re.escape(expected)):
        program.check(bad)


def test_every_kernel_of_executorchs_that_the_runner_registers_has_its_kinds_checked(combined_build):
    # An operator missing from the table would be left to its kernel's unchecked unboxing (this project's own kernels
    # check their calls themselves: kernel_helpers/checked_unboxing.h).
    from flow import argument_kinds, program

    table = argument_kinds.runtime_table()
    registered = {line.split(" ", 1)[1] for line in program.registered_in(combined_build.runner)
                  if line.startswith("operator ")}
    theirs = {name for name in registered if not name.startswith("my_ops::")}
    assert len(theirs) > 100 and sorted(theirs - set(table)) == []
