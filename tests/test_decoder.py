"""The example ops in a real model (examples/decoder.py, models/example_decoder.py): linear layers lowered to XNNPACK,
rms_norm and update_cache on this project's kernels, greedy decoding token by token in the runner and the Python runtime
against eager PyTorch with ATen ops in place of the custom ops; a runner without a backend or operator the program needs
refuses it with one line naming what is missing, and so does the exporter's check; mutants of the delegated program (its
XNNPACK payload included) end in one error line, never a crash."""

import os
import subprocess

import pytest
import torch

from models import decoding, example_decoder
from flow.program import missing_from, read, registered_in
from helpers import outcome, run_in_fresh_python, run_runner
from pte_mutations import delegate_payloads, mutations

PROMPT = example_decoder.model_module().PROMPT
NEW_TOKENS = 12
MAX_SEQ = example_decoder.config().max_seq


@pytest.fixture(scope="module")
def programs(decoder_programs) -> dict[str, str]:
    return decoder_programs


@pytest.fixture(scope="module")
def expected() -> dict[str, decoding.Decoded]:
    """Eager PyTorch with ATen ops in place of the custom ops (quantized the same way for decoder_q8)."""
    return {name: decoding.decode_eager(example_decoder.build(example_decoder.VARIANTS[name], reference=True), PROMPT,
                                        NEW_TOKENS)
            for name in example_decoder.TESTED}


@pytest.mark.parametrize("where", ["runner", "Python runtime"])
@pytest.mark.parametrize("name", example_decoder.TESTED)
def test_greedy_decoding_matches_eager(name, where, programs, expected, combined_build, load_method):
    # Twice: the second generation starts over at position 0 on the caches the first filled.
    if where == "runner":
        decoded = decoding.decode_runner(combined_build.runner, programs[name], PROMPT, NEW_TOKENS, generations=2)
    else:  # (load_method: the combined kernel library is loaded in this process)
        decoded = decoding.decode_runtime(programs[name], PROMPT, NEW_TOKENS, generations=2)
    assert decoding.difference(decoded, expected[name], example_decoder.tolerance_of(name)) is None
    assert len(set(decoded.tokens)) > 3  # the sequence carries information: a stuck model would not pass for right


def test_the_comparison_sees_a_wrong_cache_position(programs, expected, load_method):
    """A decode loop one position off (the cache written one row late, attention reading a stale row) is caught."""
    method = load_method(programs["decoder"])
    off = decoding.greedy_decode(lambda t, p: method.execute([t, p + 1])[0], PROMPT, NEW_TOKENS)
    assert decoding.difference(off, expected["decoder"], example_decoder.FLOAT32_TOLERANCE) is not None


def test_the_cached_programs_call_the_ops_their_key_names(programs, declared):
    # models.example_decoder.export_cached keys its programs by CALLED_OPS' files: an op the model calls and the list
    # lacks would leave a stale program after that op's edit.
    called = {op for path in programs.values() for op in read(path).operators}
    assert {f"{op}.out" for op in example_decoder.CALLED_OPS} == called & {op.out_name for op in declared.values()}


def test_a_program_calling_an_op_its_key_does_not_name_is_not_cached(monkeypatch, tmp_path, aot_ops, python_ops):
    from flow import artifact_cache

    monkeypatch.setattr(artifact_cache, "CACHE_ROOT", str(tmp_path / "cache"))
    monkeypatch.setattr(example_decoder, "CALLED_OPS", ("my_ops::rms_norm", "my_ops::sdpa_with_cache"))
    with pytest.raises(RuntimeError, match=r"decoder calls my_ops::update_cache.out, which "
                                           r"models/example_decoder.py's CALLED_OPS"):
        example_decoder.export_cached("decoder", str(tmp_path))
    assert not os.listdir(tmp_path / "cache" / "decoder_programs")


@pytest.mark.parametrize("name", example_decoder.TESTED)
def test_the_custom_ops_stay_on_their_kernels_and_the_linears_go_to_xnnpack(name, programs):
    program = read(programs[name])
    assert {"my_ops::rms_norm.out", "my_ops::update_cache.out", "my_ops::sdpa_with_cache.out"} <= set(program.operators)
    assert program.backends == ["XnnpackBackend"]
    matmuls = [op for op in program.operators if op.split("::")[1].split(".")[0] in ("mm", "addmm", "linear", "bmm")]
    assert matmuls == []  # every linear layer went to XNNPACK, and attention is the fused op


def test_the_exporters_check_names_what_a_runner_lacks(programs, combined_build, mul3_build):
    assert missing_from(programs["decoder"], registered_in(combined_build.runner)) == []
    missing = missing_from(programs["decoder"], registered_in(mul3_build.runner))
    assert missing == ["operator my_ops::rms_norm.out", "operator my_ops::sdpa_with_cache.out",
                       "operator my_ops::update_cache.out"]
    proc = run_runner(mul3_build.runner, f"--model_path={programs['decoder']}", f"--prompt={PROMPT[0]}",
                      "--new_tokens=1")
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert proc.returncode == 1 and len(errors) == 1
    assert all(op in errors[0] for op in ("my_ops::rms_norm.out", "my_ops::sdpa_with_cache.out",
                                          "my_ops::update_cache.out"))


def test_a_runner_without_xnnpack_refuses_the_delegated_program_naming_the_backend(programs):
    from conftest import cmake_build

    build = cmake_build("no_xnnpack", "CUSTOM_OPS_RUNNER_XNNPACK=OFF", "CUSTOM_OPS_BUILD_AOT_LIBRARY=OFF")
    assert missing_from(programs["decoder"], registered_in(build.runner)) == ["backend XnnpackBackend"]
    proc = run_runner(build.runner, f"--model_path={programs['decoder']}", f"--prompt={PROMPT[0]}", "--new_tokens=1")
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert proc.returncode == 1 and len(errors) == 1, proc.stderr
    assert "delegated to backend(s) this runner does not link: XnnpackBackend" in errors[0]
    assert "CUSTOM_OPS_RUNNER_XNNPACK=ON" in errors[0]


@pytest.mark.parametrize("args, message", [
    (("--prompt=1,2", f"--new_tokens={MAX_SEQ}"), f"need {MAX_SEQ + 1} positions; the program holds {MAX_SEQ}"),
    (("--prompt=1,256", "--new_tokens=2"), "prompt token 256 is outside the vocabulary [0, 256)"),
    (("--prompt=1,-2", "--new_tokens=2"), "--prompt must be token ids"),
    (("--prompt=1,2",), "--prompt and --new_tokens go together"),
])
def test_bad_decoding_arguments_are_one_error_line(args, message, programs, combined_build):
    proc = run_runner(combined_build.runner, f"--model_path={programs['decoder']}", *args)
    assert proc.returncode in (1, 2) and message in proc.stderr, proc.stderr[-1500:]
    assert len([line for line in proc.stderr.splitlines() if line.startswith("error: ")]) == 1


def test_decoding_a_program_that_is_no_decoder_is_one_error_line(mul3_pte, combined_build):
    proc = run_runner(combined_build.runner, f"--model_path={mul3_pte}", "--prompt=1", "--new_tokens=1")
    assert proc.returncode == 1 and "decoding needs a method taking (tokens int64 [1, T], input_pos" in proc.stderr


def enlarge_a_constant_dim(data: bytes) -> bytes:
    """`data` with the first constant tensor of its first XNNPACK payload (a weight) made 8193 times wider than the
    bytes stored for it: what a flipped byte did to decoder.pte, which XNNPACK then read past."""
    import struct

    from executorch.exir._serialize._program import deserialize_pte_binary

    from flow import xnnpack_layout as L
    from flow.xnnpack_payload import FlatReader, read_header

    start, end = delegate_payloads(data, deserialize_pte_binary(data))[0]
    header = read_header(data[start:end])
    graph_start = header["flatbuffer_offset"] if header else 0
    r = FlatReader(data[start + graph_start:end])
    T, V = L.SLOTS["XNNTensorValue"], L.SLOTS["XValue"]
    for value in r.tables(r.target(0), L.SLOTS["XNNGraph"]["xvalues"]):
        tensor = r.child(value, V["xvalue_union"])
        if r.scalar(value, V["xvalue_union_type"], "B") == L.XVALUE_QUANTIZED:
            tensor = r.child(tensor, L.SLOTS["XNNQuantizedTensorValue"]["tensor_value"])
        if r.scalar(tensor, T["constant_buffer_idx"], "I"):  # a constant
            dims, _ = r.vector(tensor, T["dims"], 4)
            at = start + graph_start + dims + 8  # its second dim
            wider = struct.unpack_from("<I", data, at)[0] * 8193
            return data[:at] + struct.pack("<I", wider) + data[at + 4:]
    raise AssertionError("no constant tensor in the first XNNPACK payload")


@pytest.mark.parametrize("name", example_decoder.TESTED)
def test_a_weight_dim_past_its_stored_bytes_is_refused_before_xnnpack_reads_it(name, programs, combined_build,
                                                                              tmp_path):
    from flow.program import ProgramError, check

    with open(programs[name], "rb") as f:
        bad = tmp_path / "wide_weight.pte"
        bad.write_bytes(enlarge_a_constant_dim(f.read()))
    proc = run_runner(combined_build.runner, f"--model_path={bad}", "--prompt=1,2", "--new_tokens=2")
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert proc.returncode == 1 and len(errors) == 1, proc.stderr[-2000:]
    assert "has a delegate the runtime cannot read safely" in errors[0] and "but its constant data holds" in errors[0]
    with pytest.raises(ProgramError, match="but its constant data holds"):
        check(str(bad))


MUTANTS = 200


@pytest.fixture(scope="module")
def decoder_mutants(programs, tmp_path_factory) -> list[tuple[str, str]]:
    directory = tmp_path_factory.mktemp("decoder_mutants")
    with open(programs["decoder"], "rb") as f:
        data = f.read()
    files = []
    for i, (kind, what, mutant) in enumerate(mutations(data, seed=7, count=MUTANTS)):
        path = directory / f"{i:04d}_{kind}.pte"
        path.write_bytes(mutant)
        files.append((str(path), what))
    return files


def test_mutants_of_the_delegated_program_through_the_runner(decoder_mutants, combined_build):
    assert any("_payload" in path for path, _ in decoder_mutants)
    problems, counts = [], {}
    for path, what in decoder_mutants:
        try:
            result = outcome(run_runner(combined_build.runner, f"--model_path={path}", "--prompt=1,2,3",
                                        "--new_tokens=2", timeout=30), values_known=False)
        except subprocess.TimeoutExpired:
            result = "hang (30 s)"
        counts[result] = counts.get(result, 0) + 1
        # Refused or run, never stopped by ExecuTorch's own ET_CHECK (which the abort hook would turn into an error
        # line): the pre-flight checks every kernel call's values against the schemas' kinds first.
        if result not in ("ok", "clean"):
            problems.append(f"{os.path.basename(path)} ({what}): {result}")
    assert problems == [], f"{counts}\n" + "\n".join(problems[:20])
    assert counts.get("clean", 0) > MUTANTS // 4


PYTHON_RUNTIME = """
import torch
import ops.update_cache.update_cache  # the kernel-call check needs the schemas of the ops the program calls
from flow.runtime import load_kernel_library, load_method_checked
load_kernel_library({kernel_lib!r})
result = []
for path in {paths!r}:
    with open({progress!r}, "w") as f:
        f.write(path)
    try:
        method = load_method_checked(path)
        method.execute([torch.tensor([[1, 2, 3]]), torch.tensor([0])])
        result.append("ok")
    except Exception:
        result.append("error")
"""


def test_mutants_of_the_delegated_program_through_the_python_runtime(decoder_mutants, combined_build, tmp_path):
    progress = tmp_path / "progress"
    code = PYTHON_RUNTIME.format(kernel_lib=combined_build.kernel_lib, paths=[p for p, _ in decoder_mutants],
                                 progress=str(progress))
    try:
        results = run_in_fresh_python(code, timeout=600)
    except AssertionError as err:
        pytest.fail(f"the Python runtime died on {progress.read_text()}: {str(err)[-1500:]}")
    assert results.count("error") > MUTANTS // 4
