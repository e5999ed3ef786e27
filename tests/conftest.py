"""Shared fixtures: builds of the runtime side (cached in cmake-out/, incremental across runs) and exported programs.

Kernel registrations are process-global, so anything that must see one library's registry alone runs in a fresh
interpreter (helpers.run_in_fresh_python); the pytest process itself loads only the combined build's kernels.

Test files run in parallel (pytest-xdist, a file's tests on one worker). Builds in cmake-out/ are shared, behind a
lock per build directory (the script takes the same lock); programs the script exports into this tree are written
whole (flow.export.written_whole), so two files running its flows at once read complete, identical programs.
"""

from __future__ import annotations

import fcntl
import glob
import json
import os
import subprocess
import sys

import pytest
import torch

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import forked_python  # noqa: E402
from helpers import CMakeBuild, fuzzing_toolchain_problem  # noqa: E402

# One compiler cache for every build tree of the session, the repository copies' included (cmake/CompilerCache.cmake).
os.environ.setdefault("CCACHE_DIR", os.path.join(REPO_ROOT, "cmake-out", "ccache"))
# One Inductor cache for every process of the session (torch.compile, AOTInductor, the copies' runs): a new cache
# folder first compiles Inductor's checks of this CPU's vector ISAs, ~9 CPU-s each time.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(REPO_ROOT, "cmake-out", "inductor_cache"))
# Without a precompiled header (it names its tree's paths), the AOT objects too are shared between those trees.
os.environ.setdefault("CUSTOM_OPS_PRECOMPILED_HEADER", "OFF")

_builds: dict[str, CMakeBuild] = {}

def cmake_build(name: str, *definitions: str) -> CMakeBuild:
    """Configures and builds cmake-out/<name> once per session with -D<definitions>."""
    if name not in _builds:
        build_dir = os.path.join(REPO_ROOT, "cmake-out", name)
        env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
        configure = ["cmake", "-S", REPO_ROOT, "-B", build_dir, "-G", "Ninja",
                     f"-DPython3_EXECUTABLE={sys.executable}", *(f"-D{d}" for d in definitions)]
        os.makedirs(build_dir, exist_ok=True)
        with open(os.path.join(build_dir, ".build.lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another worker (or the script) may be building this directory
            for cmd in (configure, ["cmake", "--build", build_dir, "-j", str(os.cpu_count() or 2)]):
                proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
                if proc.returncode != 0:
                    pytest.fail(f"{' '.join(cmd)} failed:\n{proc.stdout[-6000:]}\n{proc.stderr[-6000:]}")
        _builds[name] = CMakeBuild(build_dir)
    return _builds[name]


def shared_once(request, tmp_path_factory, name: str, compute):
    """compute() once per test run, shared by the xdist workers (they wait on a lock, then read the first one's
    result); its result must be JSON. Without xdist: compute() itself."""
    workerinput = getattr(request.config, "workerinput", None)
    if workerinput is None:
        return compute()
    root = tmp_path_factory.getbasetemp().parent  # the workers' basetemps share this parent
    result = root / f"{name}-{workerinput['testrunuid']}.json"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not result.exists():
            result.write_text(json.dumps(compute()))
        return json.loads(result.read_text())


def op_build(op) -> CMakeBuild:
    """The build the flow makes for one declared op: cmake-out/<example_program>, selecting just that op."""
    return cmake_build(op.example_program, f"CUSTOM_OPS_ROOT_OPS={op.out_name}")


@pytest.fixture(scope="session")
def declared():
    """The ops declared in custom_ops.bzl, by name."""
    from flow import declarations

    return declarations.load()


@pytest.fixture(scope="session")
def representatives(declared, aot_ops, python_ops) -> list:
    """One op of each kind (flow/op_kinds.py): what the checks that build a whole configuration per op run."""
    from flow import op_kinds

    return op_kinds.representatives(declared, op_kinds.registered_schemas(declared))


@pytest.fixture(scope="session")
def mul3_build(declared) -> CMakeBuild:
    return op_build(declared["my_ops::mul3"])


@pytest.fixture(scope="session")
def mul4_build(declared) -> CMakeBuild:
    """The mul4 flow's build: libcustom_ops_aot_lib.so, and the kernels + runner for my_ops::mul4.out alone."""
    return op_build(declared["my_ops::mul4"])


@pytest.fixture(scope="session")
def aot_ops(combined_build) -> str:
    """Registers every op declared from C++ (mul4, rms_norm) in this process, from the combined CMake build's AOT
    library (one library: a process may hold only one that defines my_ops), beside the Python-registered ops."""
    from flow import registration

    return registration.load_aot_library(combined_build.aot_lib)


@pytest.fixture(scope="session")
def mul4_aot(aot_ops) -> str:
    return aot_ops


@pytest.fixture(scope="session")
def python_ops(declared):
    """Registers every op declared from Python (their modules) in this process."""
    from flow import registration

    registration.register_with_pytorch([op for op in declared.values() if op.from_python])


@pytest.fixture(scope="session")
def mul4_pte(declared, mul4_aot, tmp_path_factory) -> str:
    from flow.export import export_example

    return export_example(declared["my_ops::mul4"], tmp_path_factory.mktemp("mul4"))


@pytest.fixture(scope="session")
def mul3_pte(declared, tmp_path_factory) -> str:
    from flow import registration
    from flow.export import export_example

    registration.register_with_pytorch([declared["my_ops::mul3"]])
    return export_example(declared["my_ops::mul3"], tmp_path_factory.mktemp("mul3"))


class MulBinsAndMax(torch.nn.Module):
    """A model calling a project op, a declared kernel for an ATen op ExecuTorch lacks, and ExecuTorch's own ops."""

    def forward(self, x, boundaries):
        return torch.ops.my_ops.mul3(x) + 1, torch.bucketize(x, boundaries), torch.amax(x, 0)


@pytest.fixture(scope="session")
def model_file_build(declared, tmp_path_factory) -> tuple[CMakeBuild, str]:
    """(the build, the program): a tree selected by a program's own op list (-DCUSTOM_OPS_MODEL_FILE), MulBinsAndMax's:
    its declared kernels (mul3, bucketize) beside ExecuTorch's for the rest."""
    from flow import registration
    from flow.export import export_to_pte

    registration.register_with_pytorch([declared["my_ops::mul3"]])
    pte = export_to_pte(MulBinsAndMax(), (torch.randn(6, 4), torch.tensor([-1.0, 0.0, 1.0])),
                        tmp_path_factory.mktemp("model_file") / "mul_bins_and_max.pte")
    return cmake_build("custom_ops_from_model", f"CUSTOM_OPS_MODEL_FILE={pte}"), pte


@pytest.fixture(scope="session")
def aarch64_flow(request, tmp_path_factory):
    """Runs the aarch64 mode once per test run (it installs the Debian packages when missing and fetches the wheel);
    its output."""
    def run():
        proc = subprocess.run(["bash", os.path.join(REPO_ROOT, "test_custom_ops.sh"), "aarch64"],
                              capture_output=True, text=True, timeout=1800)
        return {"returncode": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr}

    proc = subprocess.CompletedProcess(args="aarch64", **shared_once(request, tmp_path_factory, "aarch64_flow", run))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc


@pytest.fixture(scope="session")
def aarch64_package(aarch64_flow) -> str:
    from importlib.metadata import version

    (package,) = glob.glob(os.path.join(REPO_ROOT, "cmake-out", "aarch64", f"site-executorch-{version('executorch')}",
                                        "executorch"))
    return package


@pytest.fixture(scope="session")
def decoder_programs(request, aot_ops, python_ops, tmp_path_factory) -> dict[str, str]:
    """The decoder exported as `test_custom_ops.sh model` tests it: float32 and 8-bit, both delegated to XNNPACK;
    exported once per source hash (models.example_decoder.export_cached)."""
    from models import example_decoder

    def export():
        directory = str(tmp_path_factory.mktemp("decoder"))
        return {name: example_decoder.export_cached(name, directory) for name in example_decoder.TESTED}

    return shared_once(request, tmp_path_factory, "decoder_programs", export)


@pytest.fixture(scope="session")
def combined_build() -> CMakeBuild:
    """Every declared op in one kernel library, one runner and one AOT library; and AOTInductor's side (its runner and
    libcustom_ops_without_python.so), as `test_custom_ops.sh aoti` builds it there, the kernel helpers' checks, and
    the kernels linked as a static archive and with manual registration (CMakeLists.txt 4b), each in its own runner.
    $CUSTOM_OPS_TEST_COMBINED_EXTRAS=OFF leaves those two out, for a run of test files that need neither (the own-op
    test's run in a copy of the repository)."""
    extras = os.environ.get("CUSTOM_OPS_TEST_COMBINED_EXTRAS", "ON")
    return cmake_build("all_ops", f"CUSTOM_OPS_BUILD_AOTI={extras}", f"CUSTOM_OPS_BUILD_CHECKS={extras}",
                       f"CUSTOM_OPS_LINK_VARIANTS={extras}")


@pytest.fixture(scope="session")
def sanitized_build() -> CMakeBuild:
    """Every declared op's kernels and the runner built with AddressSanitizer and UBSan (no AOT library: it would be
    loaded into Python, which has no sanitizer runtime). With clang, the tree of the libFuzzer target (CUSTOM_OPS_FUZZ:
    the same sanitizers plus coverage counters), so the sanitized runner and fuzz_program come from one build; without
    it, GCC's sanitizers (CUSTOM_OPS_SANITIZE)."""
    if fuzzing_toolchain_problem() is None:
        return cmake_build("fuzz", "CMAKE_CXX_COMPILER=clang++", "CUSTOM_OPS_FUZZ=ON",
                           "CUSTOM_OPS_BUILD_AOT_LIBRARY=OFF")
    return cmake_build("sanitize", "CUSTOM_OPS_SANITIZE=ON", "CUSTOM_OPS_BUILD_AOT_LIBRARY=OFF")


@pytest.fixture(scope="session", params=["runner", "sanitized runner"])
def any_runner(request, mul3_build) -> str:
    """The mul3 flow's runner, and the sanitized one (which runs every declared op)."""
    return mul3_build.runner if request.param == "runner" else request.getfixturevalue("sanitized_build").runner


@pytest.fixture(scope="session")
def load_method(combined_build):
    """flow.runtime.load_method_checked, with the combined kernel library loaded into this process (once:
    registrations are process-global, and this is the only kernel library the pytest process loads). The method it
    returns keeps its program alive: executorch.runtime's own Method does not."""
    from flow.runtime import load_kernel_library, load_method_checked

    load_kernel_library(combined_build.kernel_lib)
    return load_method_checked


class DynamicPrograms:
    """Exported programs with every dimension dynamic (0..MAX_DIM), one per (op, dtype, rank), exported on first use."""

    MAX_DIM = 16

    def __init__(self, out_dir):
        self.out_dir = out_dir
        self._paths: dict[tuple[str, torch.dtype, int], str] = {}

    def get(self, op: str, dtype: torch.dtype, rank: int) -> str:
        key = (op, dtype, rank)
        if key not in self._paths:
            from flow.export import CallOp, export_to_pte

            dims = {i: torch.export.Dim(f"d{i}", min=0, max=self.MAX_DIM) for i in range(rank)}
            example = torch.ones([3] * rank, dtype=dtype)
            path = os.path.join(self.out_dir, f"{op}_{str(dtype).split('.')[-1]}_{rank}d.pte")
            self._paths[key] = export_to_pte(CallOp(getattr(torch.ops.my_ops, op).default), (example,), path,
                                             dynamic_shapes=(dims,))
        return self._paths[key]


@pytest.fixture(scope="session")
def dynamic_programs(mul4_aot, declared, tmp_path_factory) -> DynamicPrograms:
    from flow import registration

    registration.register_with_pytorch([declared["my_ops::mul3"]])
    return DynamicPrograms(str(tmp_path_factory.mktemp("dynamic")))


# ---- Order, and the developer's quick loop --------------------------------------------------------------------------
# The files that take longest first (by a cold run's time; docs/tests.md: what a run costs). pytest-xdist hands whole
# files to the workers in collection order, so the long ones start at once and no long file starts last. Any file not
# named runs after them.
HEAVIEST_FIRST = [
    # The first two start together: the second compiles with the Buck2 graph's own commands while the first builds the
    # combined tree, and the recipe's copy (third) then finds that tree's objects in the compiler cache.
    "test_real_model.py", "test_buck2_graph.py", "test_own_op.py", "test_wheel.py", "test_untrusted_programs.py",
    "test_bad_input.py", "test_references.py", "test_mul4_aot.py",
    "test_compile.py", "test_op_contracts.py", "test_selective_build.py", "test_hf.py", "test_verifier.py",
    "test_decoder.py", "test_aot_build.py", "test_fuzz.py", "test_command_line.py",
    "test_xnnpack_payload.py", "test_aarch64.py", "test_profiling.py", "test_torch_compat.py",
]
# `bash test_custom_ops.sh test quick`: the PyTorch side of both registrations (mul3 from Python, rms_norm from C++),
# codegen, the runner and Python runtime, the verifier, and the import and docs checks: under three minutes once
# the builds exist (a cold tree builds them first). The full suite stays what CI runs.
QUICK = [
    "test_mul3_aot.py", "test_rms_norm.py", "test_schema_types.py", "test_runtime.py", "test_verifier.py",
    "test_imports.py", "test_docs.py", "test_kernel_errors.py", "test_argument_checks.py",
]


def pytest_addoption(parser):
    parser.addoption("--quick", action="store_true",
                     help=f"run only the quick loop's files: {', '.join(QUICK)} (tests/conftest.py), and every op's "
                          "own tests (ops/<name>/test_*.py)")
    parser.addoption("--cpu-report", metavar="FILE",
                     help="append each test file's CPU seconds and wall seconds to FILE: the worker's own and the "
                          "processes it waited for, its fixtures' setups included (a fixture shared by several "
                          "files counts in the first that asked for it)")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--quick"):
        quick = [item for item in items if item.path.name in QUICK or item.path.parent.parent.name == "ops"]
        config.hook.pytest_deselected(items=[item for item in items if item not in quick])
        items[:] = quick
    rank = {name: i for i, name in enumerate(HEAVIEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each file keeps its own order


# --cpu-report: where a run's time goes, by test file.
_cost_by_file: dict[str, list[float]] = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not item.config.getoption("--cpu-report"):
        yield
        return
    before, forked_before = os.times(), forked_python.cpu_seconds
    yield
    after = os.times()
    cost = _cost_by_file.setdefault(os.path.relpath(item.path, REPO_ROOT), [0.0, 0.0])
    cost[0] += sum(getattr(after, field) - getattr(before, field)
                   for field in ("user", "system", "children_user", "children_system"))
    cost[0] += forked_python.cpu_seconds - forked_before  # the template's children are not this process's
    cost[1] += after.elapsed - before.elapsed


def pytest_sessionfinish(session):
    report = session.config.getoption("--cpu-report")
    if report and _cost_by_file:  # each xdist worker appends its own files' lines
        with open(report, "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            f.writelines(f"{cpu:9.1f} {wall:9.1f}  {path}\n" for path, (cpu, wall) in sorted(_cost_by_file.items()))
