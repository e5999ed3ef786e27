"""test_custom_ops.sh's `bench` mode: builds what a benchmark needs, then runs it (benchmark/bench_<name>.py, or the
prefill ceiling's C++). `bench` alone: the element-wise kernels vs ExecuTorch's aten::mul.out and memcpy; `bench hf`
and `bench real` run beside optimum-executorch, in a venv of its own (.venv-peer). The benchmarks are apart from the
tests: a ratio is measured side by side in one run, never asserted.

    python benchmark/bench.py [rms_norm|decoder|attention|hf|real|presets|scale|aoti|ceiling] [ARGS]
"""

from __future__ import annotations

import os
import subprocess
import sys

from flow.modes import ALL_OPS, BUILD_ROOT, PYTHON, REPO_ROOT, ModeError, cmake_build, main, run, step
from models.model_modes import build_aoti

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH_BUILD = os.path.join(BUILD_ROOT, "bench")  # the kernels' benchmark programs (CUSTOM_OPS_BUILD_BENCHMARK)
PEER = os.path.join(REPO_ROOT, ".venv-peer")


def peer_python() -> str:
    """optimum-executorch in a venv of its own that sees .venv's packages through a .pth file, so torch, ExecuTorch
    and transformers are the very files the project uses; pip adds only what the peer needs more."""
    python = os.path.join(PEER, "bin", "python")
    if os.access(python, os.X_OK) and subprocess.run([python, "-c", "import optimum.exporters.executorch"],
                                                     capture_output=True).returncode == 0:
        return python
    step(f"Creating {PEER}: optimum-executorch 1.1.0 beside this project's pins (the peer of bench hf)")
    run(os.environ.get("PYTHON_FOR_VENV", "python3"), "-m", "venv", PEER)
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    ours = subprocess.run([PYTHON, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout
    with open(os.path.join(site, "project_venv.pth"), "w") as f:
        f.write(ours)
    log = os.path.join(PEER, "pip-install.log")
    with open(log, "w") as out:
        installed = subprocess.run([python, "-m", "pip", "install", "-q", "optimum-executorch==1.1.0"], stdout=out,
                                   stderr=subprocess.STDOUT).returncode == 0
    if not installed:
        sys.stderr.write(open(log).read())
        raise ModeError(f"installing optimum-executorch into {PEER} failed")
    return python


def bench_script(name: str) -> str:
    return os.path.join(HERE, f"bench_{name}.py")


def bench_hf(args: list[str]) -> None:
    python = peer_python()
    cmake_build(ALL_OPS, quiet=True)
    run(python, bench_script("hf"), "--build_dir", ALL_OPS, "--runner_dir", ALL_OPS, *args)


def bench_real(args: list[str]) -> None:
    python = PYTHON if "--llama_cpp_only" in args else peer_python()  # optimum-executorch's environment, when it runs
    cmake_build(ALL_OPS, quiet=True)
    cmake_build(BENCH_BUILD, "-DCUSTOM_OPS_BUILD_BENCHMARK=ON", quiet=True)  # memcpy_bandwidth
    environment = dict(os.environ, PATH=os.path.dirname(PYTHON) + os.pathsep + os.environ["PATH"])
    run(python, bench_script("real"), "--build_dir", ALL_OPS, "--memcpy", os.path.join(BENCH_BUILD, "memcpy_bandwidth"),
        *args, env=environment)


def bench_presets(args: list[str]) -> None:
    cmake_build(ALL_OPS, quiet=True)
    run(PYTHON, bench_script("presets"), "--build_dir", ALL_OPS, *args)


def bench_scale(args: list[str]) -> None:
    """GGUF files at 135M to 8B parameters (the 1B and 8B ones made once into ~/.cache/my_ops/scale)."""
    cmake_build(ALL_OPS, quiet=True)
    cmake_build(BENCH_BUILD, "-DCUSTOM_OPS_BUILD_BENCHMARK=ON", quiet=True)  # memcpy_bandwidth
    memcpy = os.path.join(BENCH_BUILD, "memcpy_bandwidth")
    run(PYTHON, bench_script("scale"), "--build_dir", ALL_OPS, "--memcpy", memcpy, *args)


def bench_aoti(args: list[str]) -> None:
    build_aoti()
    run(PYTHON, bench_script("aoti"), "--build_dir", ALL_OPS, *args)


def bench_ceiling(args: list[str]) -> None:
    """The multiply-add peak beside linear_blocks' prefill: [TOKENS] [ROUNDS] [FORMAT,...]."""
    cmake_build(BENCH_BUILD, "-DCUSTOM_OPS_BUILD_BENCHMARK=ON", quiet=True)
    run(os.path.join(BENCH_BUILD, "prefill_ceiling"), *args)


def kernel_bench(name: str):
    def bench(args: list[str]) -> None:
        cmake_build(BENCH_BUILD, "-DCUSTOM_OPS_BUILD_BENCHMARK=ON", quiet=True)
        run(PYTHON, bench_script(name), "--build_dir", BENCH_BUILD, *args)
    return bench


BENCHES = {"hf": bench_hf, "real": bench_real, "presets": bench_presets, "scale": bench_scale, "aoti": bench_aoti,
           "ceiling": bench_ceiling,
           **{name: kernel_bench(name) for name in ("rms_norm", "decoder", "attention")}}

if __name__ == "__main__":
    given = sys.argv[1:]
    if given and given[0] in BENCHES:
        sys.exit(main(BENCHES, "benchmark/bench.py", given))
    sys.exit(main({"elementwise": kernel_bench("elementwise")}, "benchmark/bench.py", ["elementwise", *given]))
