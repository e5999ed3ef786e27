"""The PyTorch AOT library's build: the libtorch side is C++20 like torch.utils.cpp_extension's JIT build, the CUDA
kernels are skipped with a reason where they cannot be built, and the CUDA source compiles with nvcc against the torch
headers using the flags a CUDA build would use (CUSTOM_OPS_CUDA=CHECK)."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from helpers import REPO_ROOT


def configure(build_dir, *definitions):
    return subprocess.run(
        ["cmake", "-S", REPO_ROOT, "-B", str(build_dir), "-G", "Ninja", f"-DPython3_EXECUTABLE={sys.executable}",
         "-DCUSTOM_OPS_ROOT_OPS=my_ops::mul4.out", *(f"-D{d}" for d in definitions)], capture_output=True, text=True)


def test_the_libtorch_side_is_cpp20_and_the_runtime_side_cpp17(mul4_build):
    with open(os.path.join(mul4_build.build_dir, "compile_commands.json")) as f:
        commands = {os.path.basename(entry["file"]) + ("@aot" if "custom_ops_aot_lib" in entry["command"] else ""):
                    entry["command"] for entry in json.load(f)}
    for source in ("custom_ops_2.cpp@aot", "custom_ops_2_out.cpp@aot", "RegisterSchema.cpp@aot"):
        assert "-std=c++20" in commands[source], commands[source]
    assert "-std=c++17" in commands["custom_ops_2_out.cpp"]  # the ExecuTorch-mode kernel


def test_a_cpu_torch_skips_the_cuda_kernels_and_says_so(tmp_path):
    proc = configure(tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "CUDA kernels: skipped (the torch in use is a CPU build); the CPU kernels are built" in proc.stdout


def test_requiring_cuda_with_a_cpu_torch_fails_at_configure_time(tmp_path):
    proc = configure(tmp_path, "CUSTOM_OPS_CUDA=ON")
    assert proc.returncode != 0
    assert "CUSTOM_OPS_CUDA=ON, but the torch in use is a CPU build" in proc.stderr


def test_the_cuda_source_compiles_with_nvcc(tmp_path):
    if shutil.which("nvcc") is None:
        if os.environ.get("CI"):
            pytest.fail("nvcc is not on PATH; CI machines have CUDA 13.0's nvcc")
        pytest.skip("nvcc is not on PATH: the CUDA source could not be compiled here")
    proc = configure(tmp_path, "CUSTOM_OPS_CUDA=CHECK")
    assert proc.returncode == 0, proc.stderr
    build = subprocess.run(["cmake", "--build", str(tmp_path), "--target", "custom_ops_aot_lib_cuda_check"],
                           capture_output=True, text=True)
    assert build.returncode == 0, build.stdout[-5000:]
    assert (tmp_path / "CMakeFiles" / "custom_ops_aot_lib_cuda_check.dir" / "ops" / "mul4" / "custom_ops_2_cuda.cu.o").is_file()
