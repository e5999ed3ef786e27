"""Profiling and debugging with ExecuTorch's devtools: the runner's ETDump and debug buffer, the exporter's ETRecord,
Inspector over both (profile_program.py, `bash test_custom_ops.sh profile`), and the intermediate-output comparison
that names the op whose kernel is wrong."""

import os
import subprocess

import pytest
import torch

from helpers import REPO_ROOT, copy_repository, run_runner

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
    torch.testing.assert_close(output, torch.ones(2, 3) * 3, rtol=0, atol=0)


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
    (["--debug_buffer_path={tmp}/x.bin"], "error: --debug_buffer_path needs --etdump_path"),
    (["--etdump_path={tmp}/x.etdump", "--debug_buffer_path={tmp}/x.bin", "--debug_buffer_size=64"],
     "error: the intermediate outputs did not fit the debug buffer (--debug_buffer_size=64)"),
    (["--etdump_path={tmp}/x.etdump", "--debug_buffer_path={tmp}/x.bin", "--debug_buffer_size=4G"],
     "error: --debug_buffer_size (4294967296 bytes) exceeds --max_memory"),
])
def test_bad_profiling_arguments_are_one_error_line(combined_build, profiled_mul3, tmp_path, args, message):
    proc = run_runner(combined_build.runner, f"--model_path={profiled_mul3[0]}",
                      *(a.format(tmp=tmp_path) for a in args))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(message), proc.stderr


def test_a_junk_debug_buffer_size_is_a_usage_error(combined_build, profiled_mul3):
    proc = run_runner(combined_build.runner, f"--model_path={profiled_mul3[0]}", "--debug_buffer_size=lots")
    assert proc.returncode == 2 and "--debug_buffer_size must be a positive byte count" in proc.stderr


def run_profile_mode(repo: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", os.path.join(repo, "test_custom_ops.sh"), "profile", *args], capture_output=True,
                          text=True, timeout=1800)


def test_profile_mode_tables_every_op_of_the_mlp_and_finds_no_difference(combined_build):
    proc = run_profile_mode(REPO_ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    table = proc.stdout.split("Per-op time over 20 executions")[1].split("Intermediate outputs")[0]
    for kernel, graph_op in (("mul3.out", "my_ops.mul3.default"), ("mul4.out", "my_ops.mul4.default"),
                             ("addmm.out", "aten.addmm.default"), ("relu.out", "aten.relu.default")):
        row = next(line.split() for line in table.splitlines() if line.startswith(kernel))
        assert row[1] == graph_op and int(row[2]) == 20 and all(float(v) > 0 for v in row[3:7]), row
    assert "mul3.out                 ok" in proc.stdout and "mul4.out                 ok" in proc.stdout
    assert "every op matches eager" in proc.stdout


# One element of mul4's runtime kernel off by one ulp: eager (the AOT library) stays right.
OFF_BY_ONE_ULP = """
  auto& result = unary_elementwise_out<MultiplyBy<4>>(ctx, input, output, "my_ops::mul4.out");
  if (result.scalar_type() == executorch::aten::ScalarType::Float && result.numel() > 0) {
    float* data = result.mutable_data_ptr<float>();
    data[result.numel() / 2] = std::nextafter(data[result.numel() / 2], 1e30f);
  }
  return result;
"""


def test_profile_mode_names_the_op_whose_kernel_is_one_ulp_off(tmp_path):
    repo = copy_repository(tmp_path / "repo")
    kernel = os.path.join(repo, "custom_ops_2_out.cpp")
    with open(kernel) as f:
        source = f.read()
    correct = '  return unary_elementwise_out<MultiplyBy<4>>(ctx, input, output, "my_ops::mul4.out");\n'
    assert correct in source
    with open(kernel, "w") as f:
        f.write("#include <cmath>\n" + source.replace(correct, OFF_BY_ONE_ULP))
    proc = run_profile_mode(repo)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "mul3.out                 ok" in proc.stdout
    assert "mul4.out                 DIFFERS" in proc.stdout
    assert "error: first op whose output differs from eager: mul4.out" in proc.stderr
