"""The op machinery's modes of test_custom_ops.sh, one function each over flow's entry points: `cmake` and `buck2`
(each declared op's flow: select -> generate -> build -> export -> run -> verify), `aarch64` (the same cross-compiled,
run under qemu), `profile NAME` (an op's example with ETDump and the Inspector), `wheel` and `doctor`. The script makes
the venv, then runs `python -m flow.modes MODE [ARGS]`; the model layer's modes are models/model_modes.py's, which
build on cmake_build and step here.
"""

from __future__ import annotations

import fcntl
import glob
import importlib.metadata
import os
import platform
import shutil
import subprocess
import sys
from collections import defaultdict

from . import declarations, forked_steps

REPO_ROOT = declarations.REPO_ROOT
BUILD_ROOT = os.path.join(REPO_ROOT, "cmake-out")
ALL_OPS = os.path.join(BUILD_ROOT, "all_ops")  # every declared op: the build the modes beyond one op share
PYTHON = sys.executable
EXIT_BUCK2_NOT_RUN = 3  # `buck2` without buck2 on PATH: the graph check ran (and passed), buck2 itself did not
QEMU_AARCH64 = ["qemu-aarch64", "-L", "/usr/aarch64-linux-gnu"]


class ModeError(Exception):
    """A mode stops: `error: <message>`, exit 1."""


def step(text: str) -> None:
    print(f"\n\033[1m==> {text}\033[0m", flush=True)


def relative(path: str) -> str:
    return os.path.relpath(path, REPO_ROOT)


def run(*command, **kwargs) -> None:
    """One command of a mode; where it fails the mode ends with its exit status (it said why)."""
    returncode = subprocess.run([str(part) for part in command], **kwargs).returncode
    if returncode != 0:
        raise SystemExit(returncode)


def python(*arguments, **kwargs) -> None:
    """A Python step: `-m MODULE ARGS` in a child of this process that imported torch once for all the steps
    (forked_steps.py), anything else in a new interpreter."""
    if arguments[:1] == ("-m",) and not kwargs:
        returncode = forked_steps.run_module(str(arguments[1]), [str(a) for a in arguments[2:]])
        if returncode != 0:
            raise SystemExit(returncode)
        return
    run(PYTHON, *arguments, **kwargs)


def cmake_build(build_dir: str, *options: str, quiet: bool = False) -> None:
    """Configures (its output in configure.log, shown where it fails) and builds one tree of the runtime side. A lock
    on the tree keeps two builds of it (the tests run in parallel) from interleaving."""
    os.makedirs(build_dir, exist_ok=True)
    with open(os.path.join(build_dir, ".build.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        log = os.path.join(build_dir, "configure.log")
        with open(log, "w") as out:
            configured = subprocess.run(["cmake", "-S", REPO_ROOT, "-B", build_dir, "-G", "Ninja",
                                         f"-DPython3_EXECUTABLE={PYTHON}", *options], stdout=out,
                                        stderr=subprocess.STDOUT).returncode == 0
        if not configured:
            sys.stderr.write(open(log).read())
            raise ModeError(f"configuring {build_dir} failed")
        run("cmake", "--build", build_dir, "-j", str(os.cpu_count() or 1),
            stdout=subprocess.DEVNULL if quiet else None)


def selected_ops(names: list[str]) -> list[declarations.DeclaredOp]:
    """The declared ops to run: all, or those named (a short name like mul3, or namespace::name)."""
    try:
        declared = list(declarations.load().values())
    except declarations.DeclarationError as err:
        raise ModeError(f"custom_ops.bzl could not be read: {err}") from None
    chosen = []
    for name in names:
        found = [op for op in declared if name in (op.short_name, op.name)]
        if not found:
            raise ModeError(f"no op '{name}' is declared in custom_ops.bzl; declared: "
                            f"{' '.join(op.short_name for op in declared)}")
        chosen += found
    return chosen or declared


def registered_where(op: declarations.DeclaredOp) -> str:
    return " ".join(op.aot_sources) if op.from_cpp else op.python_file or "PyTorch itself"


def export_and_verify(op, runner: str, aot_library: str | None, verify_with: list[str],
                      runner_named: str | None = None) -> None:
    """Steps 2-4 of an op's flow: export its example (PyTorch learning a C++ op from `aot_library`), smoke-run it,
    verify it against its reference (`verify_with`: the libraries the verifier loads)."""
    pte = os.path.join(REPO_ROOT, f"{op.example_program}.pte")
    registered = {"cpp": f"register {op.name} with PyTorch from C++ ({registered_where(op)})",
                  "aten": f"{op.name} is PyTorch's own"}.get(
        op.registered_from, f"register {op.name} with PyTorch from Python ({registered_where(op)})")
    step(f"{op.short_name} 2/4: {registered}, export {op.example_program}.pte (flow/export.py)")
    python("-m", "flow.export", "--op", op.name, "--output_dir", REPO_ROOT,
           *(["--aot_library", aot_library] if aot_library else []))
    step(f"{op.short_name} 3/4: run {op.example_program}.pte in {runner_named or relative(runner)} on its default "
         "inputs, every element 1 (a smoke run: step 4 feeds the example's inputs and checks them)")
    run(runner, f"--model_path={pte}")
    step(f"{op.short_name} 4/4: the example's inputs through the runner and the Python runtime, checked against the "
         "op's ATen reference, executed 3 times (flow/verify.py)")
    python("-m", "flow.verify", "--pte", pte, "--runner", runner, *verify_with)


def flow_cmake(op) -> None:
    build_dir = os.path.join(BUILD_ROOT, op.example_program)
    built = (f"the kernels, runner and libcustom_ops_aot_lib.so ({registered_where(op)} + kernels in ATen mode)"
             if op.from_cpp else "the kernels and runner")
    step(f"{op.short_name} 1/4: select {op.out_name}, generate its registration, build {built} (CMakeLists.txt)")
    cmake_build(build_dir, f"-DCUSTOM_OPS_ROOT_OPS={op.out_name}")
    export_and_verify(op, os.path.join(build_dir, "custom_ops_executor_runner"),
                      os.path.join(build_dir, "libcustom_ops_aot_lib.so"),
                      ["--kernel_library", os.path.join(build_dir, "libcustom_ops_lib.so")])


def link_variants() -> None:
    """The same kernels linked as apps and firmware link them (CMakeLists.txt, 4b): a static archive linked whole, and
    an archive generated with --manual_registration whose runner calls register_all_kernels(); every example the flows
    exported checked in both runners (the manual one on ops codegen registers: an op that registers itself from its
    source needs its object linked, docs/adding-an-op.md). One verifier process per AOT library: a C++ op's is its
    flow's."""
    build_dir = os.path.join(BUILD_ROOT, "linked_as_archives")
    groups = defaultdict(list)
    for op in selected_ops([]):
        aot = os.path.join(BUILD_ROOT, op.example_program, "libcustom_ops_aot_lib.so") if op.from_cpp else None
        groups[op.runtime_registration, aot].append(os.path.join(REPO_ROOT, f"{op.example_program}.pte"))
    step(f"Link the kernels as a static archive (linked whole) and with manual registration ({relative(build_dir)})")
    # Every declared op (an empty selection, set so a selection cached in the tree does not stay).
    cmake_build(build_dir, "-DCUSTOM_OPS_LINK_VARIANTS=ON", "-DCUSTOM_OPS_BUILD_AOT_LIBRARY=OFF",
                "-DCUSTOM_OPS_ROOT_OPS=")
    step("Each example in the whole-archive runner and, registered by codegen, the manual-registration one "
         "(flow/verify.py)")
    for (registration, aot), ptes in sorted(groups.items(), key=lambda group: (group[0][0], group[0][1] or "")):
        runners = ["custom_ops_executor_runner_whole_archive"]
        runners += ["custom_ops_executor_runner_manual"] if registration == "codegen" else []
        python("-m", "flow.verify", *(a for r in runners for a in ("--runner", os.path.join(build_dir, r))),
               *(["--aot_library", aot] if aot else []), *(a for pte in ptes for a in ("--pte", pte)))


def mode_cmake(names: list[str]) -> None:
    ops = selected_ops(names)
    for op in ops:
        flow_cmake(op)
    step(f"All flows passed: {' '.join(op.short_name for op in ops)} match their references")
    if not names:
        link_variants()


def flow_buck2(op) -> None:
    targets = [f"//:custom_ops_executor_runner_{op.short_name}"]
    targets += [f"//:custom_ops_aot_lib_{op.short_name}[shared]"] if op.from_cpp else []
    step(f"{op.short_name} 1/4: buck2 build {' '.join(targets)}")
    built = subprocess.run(["buck2", "build", "--show-full-output", *targets], capture_output=True, text=True)
    sys.stderr.write(built.stderr)
    if built.returncode != 0:
        raise ModeError(f"buck2 build {' '.join(targets)} failed")
    outputs = dict(line.split(maxsplit=1) for line in built.stdout.splitlines() if len(line.split()) == 2)
    found = {target: path for target in targets for label, path in outputs.items() if label.endswith(target[1:])}
    runner, aot = found.get(targets[0]), found.get(targets[1]) if op.from_cpp else None
    if not runner or not os.access(runner, os.X_OK):
        raise ModeError(f"buck2 printed no runner for {op.short_name}:\n{built.stdout}")
    export_and_verify(op, runner, aot, ["--aot_library", aot] if aot else [], "the buck2-built runner")


def mode_buck2(names: list[str]) -> int:
    # Where the wheels are, for TARGETS (read_config): written here, never committed.
    with open(os.path.join(REPO_ROOT, ".buckconfig.local"), "w") as out:
        run(PYTHON, os.path.join(REPO_ROOT, "tools", "buckconfig_local.py"), stdout=out)
    os.chdir(REPO_ROOT)
    if shutil.which("buck2") is None:
        step("buck2 is not on PATH: checking the Buck2 graph without it (tests/buck2_graph.py)")
        # Ops named on the command line: only their own targets built and run (every target still checked).
        checked = subprocess.run([PYTHON, os.path.join(REPO_ROOT, "tests", "buck2_graph.py"),
                                  *(["--ops", ",".join(names)] if names else [])])
        if checked.returncode != 0:
            raise ModeError("the Buck2 graph check failed (see above)")
        print("error: buck2 itself was NOT run: it is not on PATH. The check above evaluated TARGETS with "
              "starlark-rust, checked every attribute against the prelude, executed the graph as buck2 would and "
              "verified every example, but only buck2 builds it for real. Get buck2 from "
              "https://github.com/facebook/buck2/releases (buck2-x86_64-unknown-linux-musl.zst: zstd -d, chmod +x, "
              "put it on PATH), then rerun 'bash test_custom_ops.sh buck2'.", file=sys.stderr)
        return EXIT_BUCK2_NOT_RUN
    # The daemon keeps the environment it started with: restart it so it sees this venv.
    subprocess.run(["buck2", "kill"], capture_output=True)
    ops = selected_ops(names)
    for op in ops:
        flow_buck2(op)
    step(f"All buck2 flows passed: {' '.join(op.short_name for op in ops)} match their references")
    return 0


def aarch64_executorch_package() -> str:
    """The executorch wheel for manylinux aarch64, of the version installed here (the .pte format and codegen must
    match): downloaded once and unpacked, not installed, under cmake-out/aarch64/. Returns its package directory."""
    version = importlib.metadata.version("executorch")
    wheels = os.path.join(BUILD_ROOT, "aarch64", "wheels")
    site = os.path.join(BUILD_ROOT, "aarch64", f"site-executorch-{version}")
    if not os.path.isfile(os.path.join(site, ".unpacked")):
        fetched = subprocess.run([PYTHON, "-m", "pip", "download", "--quiet", "--no-deps", "--platform",
                                  "manylinux_2_28_aarch64", "--only-binary=:all:", "--python-version",
                                  platform.python_version_tuple()[0] + "." + platform.python_version_tuple()[1],
                                  f"executorch=={version}", "-d", wheels], stdout=sys.stderr)
        if fetched.returncode != 0:
            raise ModeError(f"could not download the aarch64 executorch {version} wheel")
        shutil.rmtree(site, ignore_errors=True)
        wheel = sorted(glob.glob(os.path.join(wheels, f"executorch-{version}-*aarch64*.whl")))
        if not wheel or subprocess.run([PYTHON, "-m", "zipfile", "-e", wheel[0], site]).returncode != 0:
            raise ModeError("could not unpack the aarch64 executorch wheel")
        open(os.path.join(site, ".unpacked"), "w").close()
    return os.path.join(site, "executorch")


def mode_aarch64(names: list[str]) -> None:
    """The selected ops' kernels and one runner cross-compiled once (cmake-out/aarch64/all_ops); every example exported
    on this machine in one process, each run under qemu, then all verified in one process (one runner and one AOT
    library serve them all). The host's combined build (cmake-out/all_ops) gives PyTorch here the C++-registered
    ops."""
    if subprocess.run(["bash", os.path.join(REPO_ROOT, "tools", "require_packages.sh"), "g++-aarch64-linux-gnu",
                       "qemu-user"]).returncode != 0:
        raise ModeError("the ARM64 flow needs the GNU cross toolchain and qemu-user (see above)")
    package = aarch64_executorch_package()
    ops = selected_ops(names)
    out_names = ",".join(op.out_name for op in ops)
    step(f"Cross-compile the kernels of {out_names} and the runner for aarch64 into cmake-out/aarch64/all_ops; build "
         "this machine's AOT library (cmake-out/all_ops)")
    build_dir = os.path.join(BUILD_ROOT, "aarch64", "all_ops")
    cmake_build(build_dir, "--toolchain", os.path.join(REPO_ROOT, "cmake", "aarch64-linux-gnu.toolchain.cmake"),
                f"-DEXECUTORCH_PACKAGE_DIR={package}", "-DCUSTOM_OPS_BUILD_AOT_LIBRARY=OFF",
                f"-DCUSTOM_OPS_ROOT_OPS={out_names}")
    cmake_build(ALL_OPS, quiet=True)
    runner = os.path.join(build_dir, "custom_ops_executor_runner")
    aot = os.path.join(ALL_OPS, "libcustom_ops_aot_lib.so")
    shorts = " ".join(op.short_name for op in ops)
    step(f"1/3: export the examples of {shorts} on this machine (flow/export.py)")
    python("-m", "flow.export", *(a for op in ops for a in ("--op", op.name)), "--output_dir", REPO_ROOT,
           "--aot_library", aot)
    ptes = [os.path.join(REPO_ROOT, f"{op.example_program}.pte") for op in ops]
    for op, pte in zip(ops, ptes):
        step(f"2/3: run {op.example_program}.pte ({op.short_name}) in the aarch64 runner under "
             f"{' '.join(QEMU_AARCH64)}")
        run(*QEMU_AARCH64, runner, f"--model_path={pte}")
    step("3/3: each example's inputs through the aarch64 runner, checked against its op's ATen reference here "
         "(flow/verify.py)")
    python("-m", "flow.verify", *(a for pte in ptes for a in ("--pte", pte)), "--runner", runner, "--emulator",
           " ".join(QEMU_AARCH64), "--aot_library", aot)
    step(f"All aarch64 flows (under qemu-aarch64) passed: {shorts} match their references")


def mode_profile(names: list[str]) -> None:
    """A program calling every op (or the named op's example, in the op's own build), exported with an ETRecord, run
    with an ETDump and a debug buffer, inspected."""
    if len(names) > 1:
        raise ModeError("profile takes at most one op or model name")
    build_dir, op_args = ALL_OPS, []
    if names:
        op = selected_ops(names)[0]
        build_dir, op_args = os.path.join(BUILD_ROOT, op.example_program), ["--op", op.name]
        step(f"Build {op.name}'s kernels, the runner and the AOT library ({relative(build_dir)})")
        cmake_build(build_dir, f"-DCUSTOM_OPS_ROOT_OPS={op.out_name}", quiet=True)
    else:
        step("Build every declared op's kernels, the runner and the AOT library (cmake-out/all_ops)")
        cmake_build(build_dir, quiet=True)
    step("Export with an ETRecord, run with an ETDump and a debug buffer, inspect (flow/profile.py)")
    python("-m", "flow.profile", "--build_dir", build_dir, *op_args)


def mode_wheel(_: list[str]) -> None:
    step("Build the my_ops wheel into dist/ (setup.py: the AOT library built by CMakeLists.txt in build/aot_library, "
         "and the Python registrations)")
    log = os.path.join(BUILD_ROOT, "wheel.log")
    os.makedirs(BUILD_ROOT, exist_ok=True)
    # setuptools stages the package in build/lib.*/ and keeps what an earlier build put there: a module since renamed
    # or removed would ship again. build/aot_library (CMake's tree) stays, for the compiler cache.
    for staged in glob.glob(os.path.join(REPO_ROOT, "build", "lib.*")) + glob.glob(
            os.path.join(REPO_ROOT, "build", "bdist.*")):
        shutil.rmtree(staged)
    with open(log, "w") as out:
        built = subprocess.run([PYTHON, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", REPO_ROOT, "-w",
                                os.path.join(REPO_ROOT, "dist")], stdout=out, stderr=subprocess.STDOUT)
    if built.returncode != 0:
        sys.stderr.write("".join(open(log).readlines()[-40:]))
        raise ModeError(f"building the wheel failed (full log: {log})")
    wheel = max(glob.glob(os.path.join(REPO_ROOT, "dist", "my_ops-*.whl")), key=os.path.getmtime)
    print(f"Built {relative(wheel)} ({os.path.getsize(wheel) // 1024} KiB). Install it with: pip install "
          f"{relative(wheel)}, then 'import my_ops' registers every declared op.")


def mode_doctor(_: list[str]) -> None:
    import importlib.util

    def located(package: str) -> str:
        return list(importlib.util.find_spec(package).submodule_search_locations)[0]

    def first_line(*command) -> str:
        return subprocess.run(command, capture_output=True, text=True).stdout.splitlines()[0]

    et, torch_dir = located("executorch"), located("torch")
    print(f"repository:        {REPO_ROOT}")
    print(f"python:            {platform.python_version()} {PYTHON}")
    print(f"torch:             {importlib.metadata.version('torch')}  ({torch_dir})")
    print(f"executorch:        {importlib.metadata.version('executorch')}  ({et})")
    print(f"  include:         {os.path.join(et, 'include')}")
    print(f"  lib:             {os.path.join(et, 'lib')}")
    print(f"  cmake package:   {os.path.join(et, 'share', 'cmake')}")
    libraries = sorted(f for f in os.listdir(os.path.join(et, "lib")) if f.endswith(".so"))
    print(f"  libraries:       {', '.join(libraries)}")
    print(f"torch cmake:       {os.path.join(torch_dir, 'share', 'cmake')}")
    print(f"torchgen yaml:     {os.path.join(located('torchgen'), 'packaged', 'ATen', 'native')}")
    print(f"cmake:             {first_line('cmake', '--version')} ({shutil.which('cmake')})")
    print(f"ninja:             {first_line('ninja', '--version')} ({shutil.which('ninja')})")
    compiler = os.environ.get("CXX", "c++")
    print(f"c++ compiler:      {first_line(compiler, '--version')}")
    print(f"build directory:   {BUILD_ROOT}")
    print(f"buck2:             {shutil.which('buck2') or 'not found'}")


MODES = {"cmake": mode_cmake, "buck2": mode_buck2, "aarch64": mode_aarch64, "profile": mode_profile,
         "wheel": mode_wheel, "doctor": mode_doctor}


def main(modes: dict = MODES, module: str = "flow.modes", argv: list[str] | None = None) -> int:
    """Runs one mode: its exit status, 1 with one error line where it stops, 2 for a mode this module has not."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in modes:
        print(f"usage: python -m {module} {{{','.join(modes)}}} [ARGS]", file=sys.stderr)
        return 2
    try:
        return modes[argv[0]](argv[1:]) or 0
    except ModeError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
