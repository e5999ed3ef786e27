"""How the runner and the Python runtime hold a program's data: the runner's check before running reads the program,
not its weights; and a large program's weights go on 2 MiB pages where the system has them (a decode step streams
every weight, and on 4 KiB pages reads them well below the machine's bandwidth: runner/file_segment_loader.h,
flow/runtime.py's _unnamed_file)."""

import mmap
import os
import re
import subprocess
import sys

import pytest
import torch

WEIGHT_MIB = 64


class LargeConstant(torch.nn.Module):
    """64 MiB of weights in the program's constant segment, read by one linear layer."""

    def __init__(self):
        super().__init__()
        self.register_buffer("weight", torch.randn(4096, 4096, generator=torch.Generator().manual_seed(0)))

    def forward(self, x):
        return torch.ops.my_ops.linear_blocks(x, self.weight, "F32")


@pytest.fixture(scope="module")
def large_program(aot_ops, tmp_path_factory) -> str:
    from flow.export import export_to_pte

    directory = tmp_path_factory.mktemp("large_program")
    return str(export_to_pte(LargeConstant(), (torch.randn(1, 1, 4096),), directory / "large_constant.pte"))


def test_the_runners_check_reads_the_program_not_its_weights(combined_build, large_program, tmp_path):
    # The check before running walks the program's FlatBuffers data (the size exir's extended header gives); reading
    # the whole file beside the loaded constants doubled the runner's memory (seen: 134 MiB for this 64 MiB program,
    # 70 MiB now). The runner's own peak, through tools/own_peak_rss.py.
    from helpers import REPO_ROOT

    peak = tmp_path / "peak"
    subprocess.run([sys.executable, os.path.join(REPO_ROOT, "tools", "own_peak_rss.py"), str(peak),
                    combined_build.runner, f"--model_path={large_program}"], check=True, capture_output=True)
    file_mib, peak_mib = os.path.getsize(large_program) / 2 ** 20, int(peak.read_text()) / 1024
    assert peak_mib < 1.5 * file_mib, (peak_mib, file_mib)


def _transparent_huge_pages() -> bool:
    """Whether this system gives a process huge pages it asks for (`always` or `madvise`, not `never`)."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return "[never]" not in f.read()
    except OSError:
        return False


def test_the_runner_puts_a_large_programs_weights_on_huge_pages(combined_build, large_program):
    # Seen failing with the loader's madvise removed: 0 KiB (this machine's THP mode is `madvise`).
    proc = subprocess.run([combined_build.runner, f"--model_path={large_program}", "--num_executions=2"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = re.search(r"^On huge pages: (\d+) KiB$", proc.stdout, re.M)
    assert found, proc.stdout[-2000:]
    if _transparent_huge_pages():
        assert int(found.group(1)) >= WEIGHT_MIB // 2 * 1024, proc.stdout[-2000:]


def _huge_kib_of_mappings(prefix: str) -> int:
    """FilePmdMapped (KiB) of this process's mappings of files whose path starts with `prefix`."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
                inside = len(head) >= 6 and head[5].startswith(prefix)
            elif inside and head[0] == "FilePmdMapped:":
                total += int(head[1])
    return total


def test_the_python_runtime_maps_a_large_program_on_huge_pages(load_method, large_program, tmp_path):
    # What this filesystem gives a file written in one piece and mapped as the runtime maps a program: where that is
    # on 2 MiB pages, so is the program's data (the unnamed file beside it); where not, the program is still read from
    # that file, not from a memfd. Seen failing with the size threshold above 64 MiB (a memfd: 0 KiB on huge pages).
    control = tmp_path / "control.bin"
    control.write_bytes(os.urandom(WEIGHT_MIB << 20))
    with open(control, "rb") as f, mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ) as m:
        sum(m[i] for i in range(0, len(m), 4096))
        filesystem_gives = _huge_kib_of_mappings(str(control)) > 0
    directory = os.path.dirname(large_program)
    method = load_method(large_program)
    x = torch.randn(1, 1, 4096)
    assert torch.equal(method.execute([x])[0], method.execute([x])[0])
    with open("/proc/self/maps") as f:
        assert any(line.rstrip().endswith("(deleted)") and line.split()[-2].startswith(directory) for line in f), \
            "the program is not read from an unnamed file beside it"
    if filesystem_gives:
        assert _huge_kib_of_mappings(directory) >= WEIGHT_MIB // 2 * 1024
