"""A program whose weights are in a named data file (.ptd) beside it, as ExecuTorch ships large models: `python -m
my_ops.hf export --ptd` writes both, and the runner (--data_path) and ExecuTorch's Python runtime decode them to the
bits of the one-file program. A .ptd is untrusted input like a .pte: each damage the runner's check
(runner/data_file.cpp) guards is made with ExecuTorch's own .ptd writer where that writer can make it, and by bytes
where it cannot, and ends in one error line."""

import os
import random

import pytest
import torch

from helpers import run_flow, run_runner

PROMPT = "1,2,3,4"
NEW_TOKENS = "6"


@pytest.fixture(scope="module")
def programs(combined_build, aot_ops, python_ops, tmp_path_factory):
    """{"single": [model.pte], "ptd": [model.pte, model.ptd]} of one tiny Llama checkpoint at 8da8w, the second written
    by the command a user runs."""
    from examples import hf_models
    from my_ops.hf import checkpoint, to_program

    root = tmp_path_factory.mktemp("data_files")
    model = hf_models.make_checkpoint("llama", str(root / "llama"))
    (root / "single").mkdir()
    program = to_program.export_checkpoint(checkpoint.load(model), max_seq_len=32, quantize="8da8w")
    single = to_program.write_program(program, str(root / "single" / "model.pte"))
    proc = run_flow("my_ops.hf", "export", "--model", model, "--quantize", "8da8w", "--max_seq_len", "32", "--output",
                    str(root / "ptd"), "--ptd", "--build_dir", combined_build.build_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ptd = [str(root / "ptd" / "model.pte"), str(root / "ptd" / "model.ptd")]
    assert all(path in proc.stdout for path in ptd), proc.stdout
    return {"single": single, "ptd": ptd}


def decode(runner: str, pte: str, *extra: str, tmp_path, name: str = "logits") -> bytes:
    logits = tmp_path / f"{name}.bin"
    proc = run_runner(runner, f"--model_path={pte}", *extra, f"--prompt={PROMPT}", f"--new_tokens={NEW_TOKENS}",
                      "--num_executions=2", f"--logits_path={logits}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return logits.read_bytes()


def _external_names(pte: str) -> list[str]:
    """The names of the tensors the program keeps outside it, read by ExecuTorch's own deserializer."""
    from executorch.exir._serialize._program import deserialize_pte_binary
    from executorch.exir.schema import Tensor, TensorDataLocation

    with open(pte, "rb") as f:
        program = deserialize_pte_binary(f.read()).program
    return [value.val.extra_tensor_info.fully_qualified_name for plan in program.execution_plan
            for value in plan.values if isinstance(value.val, Tensor) and value.val.extra_tensor_info is not None
            and value.val.extra_tensor_info.location == TensorDataLocation.EXTERNAL]


def test_the_weights_leave_the_program_for_the_data_file(programs):
    from executorch.extension.flat_tensor.serialize.serialize import FlatTensorSerializer
    from executorch.exir._serialize._cord import Cord

    single, (pte, ptd) = programs["single"][0], programs["ptd"]
    with open(ptd, "rb") as f:
        payload = FlatTensorSerializer().deserialize(Cord(f.read()))
    # every constant a name in the data file, each once; the program keeps its code and plan (a few KiB)
    assert _external_names(single) == [] and sorted(_external_names(pte)) == sorted(payload.named_data)
    assert os.path.getsize(pte) < 0.05 * os.path.getsize(single)
    assert os.path.getsize(ptd) > 0.95 * os.path.getsize(single)


def test_the_runner_decodes_the_one_file_programs_bits(programs, combined_build, tmp_path):
    single = decode(combined_build.runner, programs["single"][0], tmp_path=tmp_path, name="single")
    pte, ptd = programs["ptd"]
    assert decode(combined_build.runner, pte, f"--data_path={ptd}", tmp_path=tmp_path) == single
    assert len(single) == int(NEW_TOKENS) * 4 * 256  # float32 logits over the tiny vocabulary, one row a step


def test_the_python_runtime_decodes_the_one_file_programs_bits(programs, load_method):
    from executorch.runtime import Runtime

    pte, ptd = programs["ptd"]
    tokens, position = torch.tensor([[1, 2, 3, 4]]), torch.tensor([0])
    one = load_method(programs["single"][0]).execute([tokens, position])[0]
    for load in (lambda: load_method(pte, data_path=ptd),  # checked, as the runner checks
                 lambda: Runtime.get().load_program(pte, data_path=ptd).load_method("forward")):  # ExecuTorch's own
        for _ in range(2):
            two = load().execute([tokens, position])[0]
            assert torch.equal(one.view(torch.int32), two.view(torch.int32))


def test_a_program_without_its_data_file_is_refused_by_name(programs, combined_build, load_method):
    from my_ops.hf import session

    pte, ptd = programs["ptd"]
    with pytest.raises(ValueError, match="in a named data file outside it .* pass that file as data_path"):
        load_method(pte)
    with pytest.raises(ValueError, match="names no data outside itself"):
        load_method(programs["single"][0], data_path=ptd)
    proc = run_runner(combined_build.runner, f"--model_path={pte}", f"--prompt={PROMPT}", "--new_tokens=1")
    assert proc.returncode == 1 and "in a named data file outside it" in proc.stderr and "--data_path" in proc.stderr
    proc = run_runner(combined_build.runner, f"--model_path={programs['single'][0]}", f"--data_path={ptd}",
                      f"--prompt={PROMPT}", "--new_tokens=1")
    assert proc.returncode == 1 and "names no data outside itself" in proc.stderr, proc.stderr[-2000:]
    from my_ops.hf import export_program

    for name in ("out/model", "model.ptd", ""):  # a name, not a path: the file goes beside the program
        with pytest.raises(ValueError, match="without folder or .ptd"):
            export_program(torch.nn.Linear(1, 1), data_file=name)
    threads = torch.get_num_threads()
    try:
        with pytest.raises(ValueError, match="in a named data file outside it .*: pass that file as data_path"):
            session.load_method(pte)  # in a checkout, through the checked loader
    finally:
        torch.set_num_threads(threads)


def _rewritten(ptd: str, out: str, change) -> str:
    """The data file as ExecuTorch's own writer writes it again after `change(payload)`."""
    from executorch.extension.flat_tensor.serialize.serialize import FlatTensorSerializer
    from executorch.exir._serialize._cord import Cord

    serializer = FlatTensorSerializer()
    with open(ptd, "rb") as f:
        payload = serializer.deserialize(Cord(f.read()))
    change(payload)
    with open(out, "wb") as f:
        serializer.serialize(payload).write_to_file(f)
    return out


def _largest(payload):
    return max(payload.named_data.values(), key=lambda entry: len(payload.buffers[entry.buffer_index]))


def _grow_a_layout(payload):
    layout = _largest(payload).tensor_layout
    layout.sizes[0] += 1


def _rename_a_key(payload):
    key = next(iter(payload.named_data))
    payload.named_data[f"{key}.renamed"] = payload.named_data.pop(key)


def _retype_a_layout(payload):
    from executorch.exir.scalar_type import ScalarType

    layout = _largest(payload).tensor_layout
    layout.scalar_type = ScalarType.DOUBLE if layout.scalar_type != ScalarType.DOUBLE else ScalarType.FLOAT
    layout.sizes[0] = max(1, layout.sizes[0] // 8)  # within its bytes: ExecuTorch's own check must say it


WRITTEN = {
    "the layout of a tensor larger than its bytes": (_grow_a_layout, "its segment holds"),
    "a key the program names missing": (_rename_a_key, "must be the one exported with this program"),
    "a tensor of another dtype and shape": (_retype_a_layout, "must be the one exported with this program"),
}


@pytest.mark.parametrize("case", WRITTEN)
def test_a_data_file_that_does_not_fit_its_program_is_one_error_line(case, programs, combined_build, load_method,
                                                                     tmp_path):
    change, words = WRITTEN[case]
    pte, ptd = programs["ptd"]
    bad = _rewritten(ptd, str(tmp_path / "bad.ptd"), change)
    proc = run_runner(combined_build.runner, f"--model_path={pte}", f"--data_path={bad}", f"--prompt={PROMPT}",
                      "--new_tokens=1")
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 1 and len(errors) == 1 and words in errors[0], proc.stderr[-2000:]
    # the checked Python loader: the data file's own check in the runner's words; the rest from ExecuTorch's loader
    with pytest.raises((ValueError, RuntimeError)) as raised:
        load_method(pte, data_path=bad)
    if "is not a usable" in errors[0]:
        assert str(raised.value) in errors[0]


def _tables_end(ptd_bytes: bytes) -> int:
    return int.from_bytes(ptd_bytes[16:24], "little") + int.from_bytes(ptd_bytes[24:32], "little")


def damaged_files(programs) -> dict[str, bytes]:
    """What the writer cannot make: the file cut short, another file, and seeded damage to the tables' bytes (offsets
    out of the file, tables missing, lengths past their vectors)."""
    pte, ptd = programs["ptd"]
    with open(ptd, "rb") as f:
        data = f.read()
    cases = {"cut short": data[:len(data) // 2], "a program, not a data file": open(pte, "rb").read()}
    rng = random.Random(2026)
    tables = _tables_end(data)
    for i in range(24):
        damaged = bytearray(data)
        for _ in range(rng.choice((1, 2, 4))):
            damaged[rng.randrange(tables)] = rng.randrange(256)
        cases[f"damage {i}"] = bytes(damaged)
    return cases


def test_damaged_bytes_in_a_data_file_are_one_error_line_in_the_sanitized_runner(programs, sanitized_build,
                                                                                 tmp_path):
    """Through AddressSanitizer, so a read past the data is a failure even where it would not crash."""
    pte = programs["ptd"][0]
    cases = damaged_files(programs)
    refused = 0
    for name, content in cases.items():
        path = tmp_path / "damaged.ptd"
        path.write_bytes(content)
        proc = run_runner(sanitized_build.runner, f"--model_path={pte}", f"--data_path={path}",
                          f"--prompt={PROMPT}", "--new_tokens=1")
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
        assert proc.returncode in (0, 1) and len(errors) == proc.returncode, (name, proc.returncode,
                                                                                proc.stderr[-3000:])
        refused += proc.returncode
    assert refused >= len(cases) // 2  # most damage is refused; what is left names other keys of equal layouts


def test_the_python_check_refuses_as_the_runner_does(programs, combined_build, tmp_path):
    """flow/data_file.py against runner/data_file.cpp on every damaged file: the same verdict in the same words."""
    from flow.data_file import problem

    pte = programs["ptd"][0]
    for name, content in damaged_files(programs).items():
        path = tmp_path / "damaged.ptd"
        path.write_bytes(content)
        proc = run_runner(combined_build.runner, f"--model_path={pte}", f"--data_path={path}",
                          f"--prompt={PROMPT}", "--new_tokens=1")
        found = problem(content)
        words = f"'{path}' is not a usable ExecuTorch data file (.ptd): {found}." if found else None
        runner_words = next((line for line in proc.stderr.splitlines() if "is not a usable" in line), None)
        assert (words is None and runner_words is None) or words in runner_words, (name, found, proc.stderr[-2000:])


def _field_mutants(data: bytes) -> dict[str, tuple[bytes, str]]:
    """Each field the checks rely on, set to a hostile value in a copy of the valid file `data` (found through the
    layout both checkers read): {field: (the damaged file, the words both checkers must say)}."""
    import struct

    from flow import xnnpack_layout as L
    from flow.xnnpack_payload import FlatReader

    r = FlatReader(data[:_tables_end(data)])
    root = r.target(0)
    segments = r.tables(root, L.SLOTS["FlatTensor"]["segments"])
    named = r.tables(root, L.SLOTS["FlatTensor"]["named_data"])
    entry = next(e for e in named if r.field(e, L.SLOTS["FlatTensorNamedData"]["segment_index"]))
    layout = r.child(entry, L.SLOTS["FlatTensorNamedData"]["tensor_layout"])
    sizes = r.child(layout, L.SLOTS["TensorLayout"]["sizes"])
    dim_order = r.child(layout, L.SLOTS["TensorLayout"]["dim_order"])
    segment = next(s for s in segments if r.field(s, L.SLOTS["DataSegment"]["offset"]))
    key = r.child(entry, L.SLOTS["FlatTensorNamedData"]["key"])
    at = {name: offset for name, (offset, _) in L.PTD_HEADER_FIELDS.items()}
    edits = {
        "header length": (at["header_length"], "<I", 8, "its header is 8 bytes long"),
        "flatbuffer size": (at["flatbuffer_size"], "<Q", 1 << 40, "places its tables or data outside"),
        "segment data size": (at["segment_data_size"], "<Q", 1 << 40, "places its tables or data outside"),
        "a segment's offset": (r.field(segment, L.SLOTS["DataSegment"]["offset"]), "<Q", 1 << 40,
                               "lies outside its data"),
        "a segment index": (r.field(entry, L.SLOTS["FlatTensorNamedData"]["segment_index"]), "<I", 999,
                            "names segment 999 of"),
        "a key's length": (key, "<I", 1 << 30, "a table points outside its tables"),
        "a dtype": (r.field(layout, L.SLOTS["TensorLayout"]["scalar_type"]), "<b", 100,
                    "has dtype 100, which this ExecuTorch does not define"),
        "a size": (sizes + 4, "<i", -1, "has a negative size"),
        "a dim order": (dim_order + 4, "<B", 7, "has a dim order that is not a permutation"),
        "the sizes' length": (sizes, "<I", 1 << 30, "a table points outside its tables"),
    }
    mutants = {}
    for name, (position, fmt, value, words) in edits.items():
        assert position, name  # the field is in the file (not left at its default)
        damaged = bytearray(data)
        struct.pack_into(fmt, damaged, position, value)
        mutants[name] = (bytes(damaged), words)
    return mutants


def test_each_field_the_checks_rely_on_damaged_is_refused_by_both_in_its_words(programs, combined_build, tmp_path):
    from flow.data_file import problem

    pte, ptd = programs["ptd"]
    with open(ptd, "rb") as f:
        data = f.read()
    assert problem(data) is None
    for name, (content, words) in _field_mutants(data).items():
        path = tmp_path / "damaged.ptd"
        path.write_bytes(content)
        proc = run_runner(combined_build.runner, f"--model_path={pte}", f"--data_path={path}",
                          f"--prompt={PROMPT}", "--new_tokens=1")
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
        assert proc.returncode == 1 and len(errors) == 1 and words in errors[0], (name, proc.stderr[-2000:])
        assert words in (problem(content) or ""), (name, problem(content))
