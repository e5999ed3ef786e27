"""Profiling and debugging with ExecuTorch's devtools: the runner's ETDump and debug buffer, the exporter's ETRecord,
Inspector over both (profile_program.py, `bash test_custom_ops.sh profile`), and the intermediate-output comparison
that names the op whose kernel is wrong."""

import os
import re
import subprocess

import pytest
import torch

from flow.compare import assert_bit_exact
from helpers import REPO_ROOT, run_flow, run_in_fresh_python, run_runner

NUM_EXECUTIONS = 5


@pytest.fixture(scope="module")
def profiled_mul3(combined_build, tmp_path_factory):
    """custom_ops_1's model exported with an ETRecord and run with an ETDump and a debug buffer."""
    import custom_ops_1  # noqa: F401
    from flow.export import CallOp, etrecord_path, export_to_pte

    out = tmp_path_factory.mktemp("profiled")
    pte = export_to_pte(CallOp(torch.ops.my_ops.mul3.default), (torch.ones(2, 3),), out / "mul3.pte", etrecord=True)
    etdump, debug_buffer = str(out / "mul3.etdump"), str(out / "mul3.debug.bin")
    proc = run_runner(combined_build.runner, f"--model_path={pte}", f"--num_executions={NUM_EXECUTIONS}",
                      f"--etdump_path={etdump}", f"--debug_buffer_path={debug_buffer}")
    assert proc.returncode == 0, proc.stderr
    return pte, etrecord_path(pte), etdump, debug_buffer


def test_the_etdump_times_the_custom_op_in_every_execution(profiled_mul3):
    from executorch.devtools import Inspector

    pte, etrecord, etdump, debug_buffer = profiled_mul3
    assert os.path.getsize(etrecord) > 0
    inspector = Inspector(etdump_path=etdump, etrecord=etrecord, debug_buffer_path=debug_buffer)
    events = [e for block in inspector.event_blocks for e in block.events if e.name == "native_call_mul3.out"]
    assert len(events) == 1, [e.name for b in inspector.event_blocks for e in b.events]
    (event,) = events
    assert event.op_types == ["my_ops.mul3.default"]  # named through the ETRecord's debug handles
    assert len(event.perf_data.raw) == NUM_EXECUTIONS and all(t > 0 for t in event.perf_data.raw)
    (output,) = event.debug_data  # the intermediate output, from the debug buffer
    assert_bit_exact(output, torch.ones(2, 3) * 3)


def test_an_etdump_without_debug_buffer_has_no_intermediate_outputs(combined_build, profiled_mul3, tmp_path):
    from executorch.devtools import Inspector

    pte, etrecord, _, _ = profiled_mul3
    etdump = str(tmp_path / "plain.etdump")
    assert run_runner(combined_build.runner, f"--model_path={pte}", f"--etdump_path={etdump}").returncode == 0
    inspector = Inspector(etdump_path=etdump, etrecord=etrecord)
    (event,) = [e for b in inspector.event_blocks for e in b.events if e.name == "native_call_mul3.out"]
    assert len(event.perf_data.raw) == 1 and not event.debug_data


@pytest.mark.parametrize("args,message", [
    (["--etdump_path=/nonexistent/dir/x.etdump"], "error: cannot write the ETDump to '/nonexistent/dir/x.etdump'"),
    (["--etdump_path={tmp}/x.etdump", "--debug_buffer_path=/nonexistent/dir/x.bin"],
     "error: cannot write the debug buffer to '/nonexistent/dir/x.bin'"),
    (["--debug_buffer_path={tmp}/x.bin"], "error: --debug_buffer_path needs --etdump_path"),  # a command line: exit 2
    (["--etdump_path={tmp}/x.etdump", "--debug_buffer_path={tmp}/x.bin", "--debug_buffer_size=64"],
     "error: the intermediate outputs did not fit the debug buffer (--debug_buffer_size=64)"),
    (["--etdump_path={tmp}/x.etdump", "--debug_buffer_path={tmp}/x.bin", "--debug_buffer_size=4G"],
     "error: --debug_buffer_size (4294967296 bytes) exceeds --max_memory"),
])
def test_bad_profiling_arguments_are_one_error_line(combined_build, profiled_mul3, tmp_path, args, message):
    proc = run_runner(combined_build.runner, f"--model_path={profiled_mul3[0]}",
                      *(a.format(tmp=tmp_path) for a in args))
    assert proc.returncode == (2 if "needs --etdump_path" in message else 1), proc.stdout + proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(message), proc.stderr


def test_a_junk_debug_buffer_size_is_a_usage_error(combined_build, profiled_mul3):
    proc = run_runner(combined_build.runner, f"--model_path={profiled_mul3[0]}", "--debug_buffer_size=lots")
    assert proc.returncode == 2 and "--debug_buffer_size must be a positive byte count" in proc.stderr


def run_profile_mode(repo: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", os.path.join(repo, "test_custom_ops.sh"), "profile", *args], capture_output=True,
                          text=True, timeout=1800)


def test_profile_mode_tables_and_checks_every_declared_op(combined_build, declared, aot_ops, python_ops):
    proc = run_profile_mode(REPO_ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    table = proc.stdout.split("Per-op time over 20 executions")[1].split("Intermediate outputs")[0]
    checked = proc.stdout.split("Intermediate outputs")[1]
    rows = {line.split()[0]: line.split() for line in table.splitlines()[2:] if line.strip()}
    for op in declared.values():
        kernel = op.out_name.split("::")[1]
        row = rows[kernel]
        assert int(row[-5]) == 20 and all(float(v) > 0 for v in row[-4:]), row
        if not op.mutates_an_argument():  # re-inplaced by EXIR without a debug handle (docs/profiling.md)
            assert row[1] == f"{op.namespace}.{op.short_name}.{op.functional_overload}", row
            how = "bit for bit" if op.bit_exact else "dtype tolerance"
            assert re.search(rf"{re.escape(kernel)}\s+ok\s+max \|diff\| \S+ \({how}; \d+ calls in 20 executions\)",
                             checked), checked
    for kernel, graph_op in (("addmm.out", "aten.addmm.default"), ("relu.out", "aten.relu.default")):
        assert rows[kernel][1] == graph_op
        assert kernel in checked  # aten ops are checked too, within tolerance
    assert "every op of every execution matches its reference" in proc.stdout


class Chain(torch.nn.Module):
    def forward(self, x):
        return torch.ops.my_ops.mul3(torch.ops.my_ops.mul4(torch.ops.my_ops.mul3(x)))


class InputDiesEarly(torch.nn.Module):
    def forward(self, x, y):
        return torch.ops.my_ops.mul3(torch.ops.my_ops.mul4(torch.ops.my_ops.mul3(x))) + y


@pytest.fixture(scope="module")
def programs_with_etrecords(mul4_aot, tmp_path_factory):
    import custom_ops_1  # noqa: F401
    from flow.export import export_to_pte

    out = tmp_path_factory.mktemp("etrecords")
    return {name: str(export_to_pte(model, inputs, out / f"{name}.pte", etrecord=True))
            for name, model, inputs in (("chain", Chain(), (torch.randn(4, 8),)),
                                        ("input_dies_early", InputDiesEarly(), (torch.randn(4, 8), torch.randn(4, 8))))}


MULTI_OP_CASES = [(program, executions) for program in ("chain", "input_dies_early") for executions in (1, 2, 5)]


@pytest.fixture(scope="module")
def profiled_programs(programs_with_etrecords, combined_build, tmp_path_factory) -> dict:
    """Each case's (exit code, output) of flow.profile.profile_program, what `python -m flow.profile --pte` runs: in one
    fresh process for all (each alone imported ExecuTorch's devtools and exporter again, ~7 s of CPU)."""
    out = tmp_path_factory.mktemp("profiled_programs")
    return {tuple(case): (code, output) for case, code, output in run_in_fresh_python(f"""
        import contextlib, io, os
        from flow import declarations
        from flow.profile import profile_program
        result = []
        for program, executions in {MULTI_OP_CASES!r}:
            output, directory = io.StringIO(), os.path.join({str(out)!r}, f"{{program}}-{{executions}}")
            os.makedirs(directory)
            with contextlib.redirect_stdout(output):
                code = profile_program({programs_with_etrecords!r}[program], {combined_build.build_dir!r}, directory,
                                       executions, declarations.load())
            result.append([[program, executions], code, output.getvalue()])
    """, timeout=600)}


def assert_every_execution_checked(output, executions):
    checked = output.split("Intermediate outputs")[1]
    for kernel, calls in (("mul3.out", 2), ("mul4.out", 1)):
        assert f"{kernel:<24} ok       max |diff| 0 (bit for bit; {calls * executions} calls in {executions} " \
               "executions)" in checked, checked
    assert "every op of every execution matches its reference" in output


@pytest.mark.parametrize("program, executions", MULTI_OP_CASES)
def test_profile_checks_every_execution_of_a_multi_op_program(program, executions, profiled_programs):
    code, output = profiled_programs[program, executions]
    assert code == 0, output[-3000:]
    assert_every_execution_checked(output, executions)


def test_the_profile_command_takes_a_program(programs_with_etrecords, combined_build, tmp_path):
    # The command line of the cases above (python -m flow.profile --pte), once.
    proc = run_flow("profile", "--build_dir", combined_build.build_dir, "--pte", programs_with_etrecords["chain"],
                    "--num_executions", "2", "--output_dir", str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert_every_execution_checked(proc.stdout, 2)


@pytest.fixture(scope="module")
def profiled_decoder(combined_build, aot_ops, python_ops, tmp_path_factory):
    """`profile decoder_q8`, decoding 4 tokens: the 8-bit model, whose XNNPACK outputs differ most from eager."""
    out = tmp_path_factory.mktemp("profiled_decoder")
    proc = run_flow("models.example_decoder", "--build_dir", combined_build.build_dir, "--profile", "decoder_q8",
                    "--new_tokens", "4", "--output_dir", str(out))
    return proc, out


def test_profile_of_the_model_times_xnnpacks_ops_and_the_custom_ops_per_decode_step(profiled_decoder):
    proc, _ = profiled_decoder
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    table = proc.stdout.split("Time per execution")[1].split("Intermediate outputs")[0]
    rows = [line.split() for line in table.splitlines() if line.strip()]
    assert any(row[0] == "Fully" and "XnnpackBackend" in row for row in rows), table  # an op inside the delegate
    assert any(row[0] == "DELEGATE_CALL" for row in rows), table
    calls = {row[0]: int(row[-3]) for row in rows if row[0].endswith(".out")}
    assert calls["rms_norm.out"] == 5 and calls["update_cache.out"] == 4, table  # per execution: 5 norms, 2 caches x 2
    checked = proc.stdout.split("Intermediate outputs")[1]
    assert re.search(r"rms_norm\.out +ok .*; 20 calls in 4 executions",
                     checked), checked
    assert "every op of every execution matches its reference" in proc.stdout


def test_the_models_op_checks_pin_a_wrong_custom_op_output_to_its_execution(profiled_decoder):
    """The check behind the table, on the decoder's own ETDump: the unaltered outputs pass (delegate outputs fed in,
    the caches carried from one execution to the next); one rms_norm output of the third execution made 1e-3 off is
    named with that execution."""
    from executorch.devtools import parse_etrecord

    from flow import declarations
    from flow.profile import check_executions, decoding_runs, outputs_per_execution
    from models import example_decoder

    proc, out = profiled_decoder
    tokens = [int(t) for t in re.search(r"^Generated tokens:(.*)$", proc.stdout, re.M).group(1).split()]
    runs = decoding_runs(example_decoder.model_module().PROMPT, tokens)
    etrecord = parse_etrecord(str(out / "decoder_q8.etrecord"))
    executions = outputs_per_execution(str(out / "decoder_q8.etdump"), str(out / "decoder_q8.debug.bin"), etrecord)
    ops = list(declarations.load().values())
    assert len(executions) == len(runs) == 4
    assert [c for c in check_executions(executions, etrecord, runs, ops) if c.problem] == []

    norms = [key for key in executions[2] if key[1] == "rms_norm"]
    kernel, tensors = executions[2][norms[1]][0]
    executions[2][norms[1]][0] = (kernel, [tensors[0] + 1e-3])
    failed = [c for c in check_executions(executions, etrecord, runs, ops) if c.problem]
    assert [(c.name, c.execution) for c in failed][:1] == [("rms_norm.out", 3)]
