"""Shared fixtures: builds of the runtime side (cached in cmake-out/, incremental across runs) and exported programs.

Kernel registrations are process-global, so anything that must see one library's registry alone runs in a fresh
interpreter (helpers.run_in_fresh_python); the pytest process itself loads only the combined build's kernels.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from helpers import CMakeBuild  # noqa: E402

_builds: dict[str, CMakeBuild] = {}


def cmake_build(name: str, *definitions: str) -> CMakeBuild:
    """Configures and builds cmake-out/<name> once per session with -D<definitions>."""
    if name not in _builds:
        build_dir = os.path.join(REPO_ROOT, "cmake-out", name)
        env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
        configure = ["cmake", "-S", REPO_ROOT, "-B", build_dir, "-G", "Ninja",
                     f"-DPython3_EXECUTABLE={sys.executable}", *(f"-D{d}" for d in definitions)]
        for cmd in (configure, ["cmake", "--build", build_dir, "-j", str(os.cpu_count() or 2)]):
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if proc.returncode != 0:
                pytest.fail(f"{' '.join(cmd)} failed:\n{proc.stdout[-6000:]}\n{proc.stderr[-6000:]}")
        _builds[name] = CMakeBuild(build_dir)
    return _builds[name]


@pytest.fixture(scope="session")
def mul3_build() -> CMakeBuild:
    return cmake_build("custom_ops_1", "REGISTER_EXAMPLE_CUSTOM_OP=1")


@pytest.fixture(scope="session")
def mul4_build() -> CMakeBuild:
    """The mul4 flow's build: libcustom_ops_aot_lib.so, and the kernels + runner for my_ops::mul4.out alone."""
    return cmake_build("custom_ops_2", "REGISTER_EXAMPLE_CUSTOM_OP=2")


@pytest.fixture(scope="session")
def mul4_aot(mul4_build) -> str:
    """Registers my_ops::mul4 in this process from the CMake-built AOT library (alongside custom_ops_1's mul3)."""
    import custom_ops_2

    return custom_ops_2.load_aot_library(mul4_build.aot_lib)


@pytest.fixture(scope="session")
def mul4_pte(mul4_aot, tmp_path_factory) -> str:
    import custom_ops_2

    return custom_ops_2.export_mul4(tmp_path_factory.mktemp("mul4"))


@pytest.fixture(scope="session")
def mul3_pte(tmp_path_factory) -> str:
    import custom_ops_1

    return custom_ops_1.export_mul3(tmp_path_factory.mktemp("mul3"))


@pytest.fixture(scope="session")
def combined_build() -> CMakeBuild:
    """Both example ops in one kernel library and one runner."""
    return cmake_build("custom_ops_both", "REGISTER_EXAMPLE_CUSTOM_OP=3")


@pytest.fixture(scope="session")
def et_runtime(combined_build):
    """The ExecuTorch Python runtime with the combined kernel library loaded into this process (once: registrations
    are process-global, and this is the only kernel library the pytest process loads)."""
    import ctypes

    ctypes.CDLL(combined_build.kernel_lib, mode=ctypes.RTLD_GLOBAL)
    from executorch.runtime import Runtime

    return Runtime.get()
