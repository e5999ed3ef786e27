"""One command line for both runners (runner/command_line.cpp): the same bad command line, given to the ExecuTorch
runner and to the AOTInductor runner, is exit 2 with one `error:` line saying the same thing; a flag one runner does
not take is an error there, never ignored; every --inputs list is checked against the others and against the shapes
or specs before any file is read (the AOTInductor runner once compared only the first list and crashed)."""

import os
import subprocess

import pytest

from flow import aoti

PROGRAM = {"executorch": "--model_path=PROGRAM", "aoti": "--package=PROGRAM"}

# Rows run through both runners: (arguments after the program flag, words of the one error line).
BOTH = [
    (["--inputs=a.bin", "--inputs=a.bin,b.bin"], "--inputs list 2 names 2 file(s) but list 1 names 1"),
    (["--inputs=a.bin,b.bin", "--inputs=a.bin,b.bin", "--inputs=a.bin"], "--inputs list 3 names 1 file(s)"),
    (["--logits_path=logits.bin"], "--logits_path needs --prompt and --new_tokens"),
    (["--prompt=1,2"], "--prompt and --new_tokens go together"),
    (["--new_tokens=3"], "--prompt and --new_tokens go together"),
    (["--prompt=1,x", "--new_tokens=1"], "--prompt must be token ids"),
    (["--prompt=1,-2", "--new_tokens=1"], "--prompt must be token ids"),
    (["--prompt=1", "--new_tokens=2", "--inputs=a.bin"], "does not combine with --inputs"),
    (["--prompt=1", "--new_tokens=2", "--outputs=o.bin"], "does not combine with --inputs"),
    (["--new_tokens=0", "--prompt=1"], "--new_tokens must be an integer from 1 to 1000000"),
    (["--num_executions=0"], "--num_executions must be an integer from 1 to 1000000"),
    (["--num_executions=99999999999999999999"], "--num_executions must be an integer from 1 to 1000000"),
    (["--num_executions", "-1"], "--num_executions must be an integer from 1 to 1000000"),
    (["--num_executions"], "option --num_executions needs a value"),
    (["--num_executions=1e3"], "--num_executions must be an integer from 1 to 1000000"),
    (["--outputs=a.bin,,b.bin"], "--outputs has an empty file name"),
    (["--inputs="], "--inputs has an empty file name"),
    (["--outputs"], "option --outputs needs a value"),
    (["--frobnicate=1"], "unknown option --frobnicate"),
    (["stray"], "unexpected argument 'stray'"),
]

# Rows for one runner: (runner, arguments after the program flag, words of the one error line).
ONE = [
    ("executorch", ["--package=x.pt2"], "--package is an option of custom_ops_aoti_runner, not of "
                                        "custom_ops_executor_runner"),
    ("executorch", ["--op_library=x.so"], "--op_library is an option of custom_ops_aoti_runner"),
    ("executorch", ["--input_specs=float32:2"], "--input_specs is an option of custom_ops_aoti_runner"),
    ("executorch", ["--inputs=a.bin,b.bin", "--input_shapes=2x3"], "--input_shapes gives 1 shape(s)"),
    ("executorch", ["--input_shapes=2x3junk"], "--input_shapes entry '2x3junk' is not a shape like 2x3"),
    ("executorch", ["--debug_buffer_path=d.bin"], "--debug_buffer_path needs --etdump_path"),
    ("executorch", ["--list_registered=yes"], "--list_registered takes no value"),
    ("executorch", ["--max_memory=12Q"], "--max_memory must be a positive byte count"),
    ("aoti", ["--max_memory=1G"], "--max_memory is an option of custom_ops_executor_runner, not of "
                                  "custom_ops_aoti_runner"),
    ("aoti", ["--etdump_path=e.etdp"], "--etdump_path is an option of custom_ops_executor_runner"),
    ("aoti", ["--method=forward"], "--method is an option of custom_ops_executor_runner"),
    ("aoti", ["--input_shapes=2x3"], "--input_shapes is an option of custom_ops_executor_runner"),
    ("aoti", ["--list_registered"], "--list_registered is an option of custom_ops_executor_runner"),
    ("aoti", ["--inputs=a.bin"], "--inputs names 1 file(s) per list but --input_specs gives 0 spec(s)"),
    ("aoti", ["--input_specs=float32:2x3"], "--input_specs describes the --inputs files; pass --inputs too"),
    ("aoti", ["--inputs=a.bin", "--input_specs=complex:2"], "--input_specs entry 'complex:2' is not DTYPE:SHAPE"),
    ("aoti", ["--inputs=a.bin", "--input_specs=float32:2xx3"], "--input_specs entry 'float32:2xx3' has a shape"),
    ("aoti", ["--op_library=a.so,,b.so"], "--op_library has an empty library name"),
]


@pytest.fixture(scope="module")
def runners(combined_build) -> dict[str, str]:
    return {"executorch": combined_build.runner,
            "aoti": os.path.join(combined_build.build_dir, aoti.RUNNER)}


def refused(runner: str, args: list[str], cwd) -> tuple[int, list[str], str]:
    proc = subprocess.run([runner, *args], capture_output=True, text=True, timeout=60, cwd=cwd)
    return proc.returncode, [line for line in proc.stderr.splitlines() if line.startswith("error: ")], proc.stderr


@pytest.mark.parametrize("args, words", BOTH, ids=[" ".join(a) for a, _ in BOTH])
def test_a_bad_command_line_is_the_same_error_in_both_runners(args, words, runners, tmp_path):
    lines = {}
    for name, runner in runners.items():
        rc, errors, stderr = refused(runner, [PROGRAM[name], *args], tmp_path)
        assert rc == 2 and len(errors) == 1 and words in errors[0], (name, stderr[-1500:])
        assert "usage:" in stderr
        lines[name] = errors[0]
    assert len(set(lines.values())) == 1, lines


@pytest.mark.parametrize("runner, args, words", ONE, ids=[f"{r}: {' '.join(a)}" for r, a, _ in ONE])
def test_a_flag_or_combination_one_runner_does_not_take_is_refused_there(runner, args, words, runners, tmp_path):
    rc, errors, stderr = refused(runners[runner], [PROGRAM[runner], *args], tmp_path)
    assert rc == 2 and len(errors) == 1 and words in errors[0], stderr[-1500:]


@pytest.mark.parametrize("runner", ["executorch", "aoti"])
def test_the_program_flag_is_required_and_help_lists_only_the_runners_flags(runner, runners, tmp_path):
    rc, errors, _ = refused(runners[runner], ["--num_executions=2"], tmp_path)
    assert rc == 2 and errors == [f"error: {PROGRAM[runner].split('=')[0]} is required"]
    proc = subprocess.run([runners[runner], "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.startswith("usage:")
    listed = {line.split("=")[0].split()[0] for line in proc.stdout.splitlines() if line.startswith("  --")}
    own = {"--model_path", "--method", "--max_memory", "--etdump_path", "--input_shapes", "--list_registered"}
    other = {"--package", "--op_library", "--input_specs"}
    shared = {"--inputs", "--outputs", "--num_executions", "--prompt", "--new_tokens", "--logits_path"}
    assert shared <= listed
    assert (own <= listed and not other & listed) if runner == "executorch" else (other <= listed and not own & listed)


def test_the_inputs_lists_that_crashed_the_aoti_runner_are_refused_before_any_is_read(runners, declared, python_ops,
                                                                                     tmp_path):
    """The issue's command line on mul3's package: the second --inputs list has two files, --input_specs one. The
    runner compared only the first list with the specs, then indexed the specs for every list (SIGSEGV, rc 139)."""
    package, _, _ = aoti.example_package(declared["my_ops::mul3"])
    for name in ("a.bin", "b.bin"):
        (tmp_path / name).write_bytes(b"\0" * 24)
    rc, errors, stderr = refused(runners["aoti"], [f"--package={package}", "--inputs=a.bin", "--inputs=a.bin,b.bin",
                                                   "--input_specs=float32:2x3", "--num_executions=2"], tmp_path)
    assert rc == 2 and errors == ["error: --inputs list 2 names 2 file(s) but list 1 names 1; every execution "
                                  "takes the same inputs"], stderr[-1500:]
