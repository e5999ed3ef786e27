"""Step 2 of the mul4 flow: loads the C++ AOT library that registers my_ops::mul4 with PyTorch, then exports a model
calling mul4 to custom_ops_2.pte. The library comes from CMake (libcustom_ops_aot_lib.so) or, with --jit, from
torch.utils.cpp_extension building the same sources on the fly.

    python custom_ops_2.py --so_library cmake-out/custom_ops_2/libcustom_ops_aot_lib.so [--output_dir DIR]
    python custom_ops_2.py --jit [--output_dir DIR]

Importing this module registers nothing; load_aot_library() or build_jit_library() does.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import torch

import torch_compat

REPO_ROOT = os.path.dirname(os.path.abspath(__file__))
DEFAULT_AOT_LIBRARY = os.path.join(REPO_ROOT, "cmake-out", "custom_ops_2", "libcustom_ops_aot_lib.so")
JIT_BUILD_DIR = os.path.join(REPO_ROOT, "cmake-out", "jit")
BUILD_HINT = (
    "Build it with `bash test_custom_ops.sh cmake` (or: cmake -S . -B cmake-out/custom_ops_2 -G Ninja "
    "-DREGISTER_EXAMPLE_CUSTOM_OP=2 && cmake --build cmake-out/custom_ops_2), or pass --jit to build it on the fly."
)


def _mul4_registered() -> bool:
    return hasattr(torch.ops.my_ops, "mul4")


_python_registrations = []  # keeps the vmap rule's library alive


def _register_python_side() -> None:
    """What the C++ library cannot register itself: the vmap rule (functorch's C++ batching headers need nlohmann/json,
    which the torch wheel does not ship), and the workaround for the pinned torch's Inductor bug (torch_compat)."""
    if _python_registrations:
        return
    lib = torch.library.Library("my_ops", "FRAGMENT")

    def mul4_vmap(info, in_dims, input):
        return torch.ops.my_ops.mul4.default(input), in_dims[0]

    torch.library.register_vmap("my_ops::mul4", mul4_vmap, lib=lib)
    _python_registrations.append(lib)
    torch_compat.apply("my_ops")


def load_aot_library(so_library: str | None = None) -> str:
    """Loads libcustom_ops_aot_lib.so (default: the CMake build's) into this process; returns its path.

    Loading is once per process: PyTorch would reject a second registration of the same schemas.
    """
    path = os.path.abspath(so_library or DEFAULT_AOT_LIBRARY)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"AOT library not found: {path}. {BUILD_HINT}")
    if _mul4_registered():
        _register_python_side()
        return path
    try:
        torch.ops.load_library(path)
    except OSError as err:
        raise OSError(f"cannot load {path} as a PyTorch op library ({err}). {BUILD_HINT}") from err
    if not _mul4_registered():
        raise RuntimeError(f"{path} loaded but registered no my_ops::mul4: it is not libcustom_ops_aot_lib.so. {BUILD_HINT}")
    _register_python_side()
    return path


def _generate_aot_registration(out_dir: str) -> list[str]:
    """Runs codegen (--use-aten-lib) for mul4.out: its schema (RegisterSchema.cpp) and CPU registration."""
    import importlib.util

    native_dir = os.path.join(list(importlib.util.find_spec("torchgen").submodule_search_locations)[0],
                              "packaged", "ATen", "native")
    os.makedirs(out_dir, exist_ok=True)
    selection = os.path.join(out_dir, "selected_operators.yaml")
    run = lambda *args: subprocess.run([sys.executable, "-m", *args], check=True, capture_output=True)  # noqa: E731
    run("executorch.codegen.tools.gen_oplist", "--output_path", selection, "--root_ops", "my_ops::mul4.out")
    run("executorch.codegen.gen", "--source-path", os.path.join(REPO_ROOT, "codegen"), "--install-dir", out_dir,
        "--custom-ops-yaml-path", os.path.join(REPO_ROOT, "custom_ops.yaml"), "--op-selection-yaml-path", selection,
        "--tags-path", os.path.join(native_dir, "tags.yaml"),
        "--aten-yaml-path", os.path.join(native_dir, "native_functions.yaml"), "--use-aten-lib")
    return [os.path.join(out_dir, "RegisterCPUCustomOps.cpp"), os.path.join(out_dir, "RegisterSchema.cpp")]


def build_jit_library(verbose: bool = False) -> str:
    """Builds custom_ops_2.cpp + custom_ops_2_out.cpp (+ the generated registration) with
    torch.utils.cpp_extension (ninja, incremental, in cmake-out/jit/), loads the result and returns its path."""
    from torch.utils.cpp_extension import load

    if _mul4_registered():
        raise RuntimeError("my_ops::mul4 is already registered in this process (the CMake-built library was loaded); "
                           "build the JIT library in a fresh process")
    sources = [os.path.join(REPO_ROOT, "custom_ops_2.cpp"), os.path.join(REPO_ROOT, "custom_ops_2_out.cpp")]
    sources += _generate_aot_registration(os.path.join(JIT_BUILD_DIR, "generated"))
    flags = ["-O3", "-DUSE_ATEN_LIB"]
    if torch.version.cuda:
        sources.append(os.path.join(REPO_ROOT, "custom_ops_2_cuda.cu"))
        flags.append("-DCUSTOM_OPS_WITH_CUDA")
    os.makedirs(JIT_BUILD_DIR, exist_ok=True)
    path = load(name="custom_ops_aot_lib_jit", sources=sources, extra_cflags=flags, extra_cuda_cflags=flags,
                extra_include_paths=[REPO_ROOT], build_directory=JIT_BUILD_DIR, is_python_module=False,
                verbose=verbose)
    _register_python_side()
    return path


def example_inputs() -> tuple[torch.Tensor, ...]:
    """The inputs the example program is exported with (made on call: importing must not touch the global RNG)."""
    return (torch.randn(2, 3),)


def export_mul4(output_dir: str | os.PathLike) -> str:
    """Exports a model calling mul4 to <output_dir>/custom_ops_2.pte (load the AOT library first)."""
    from pte_export import CallOp, export_to_pte

    return export_to_pte(CallOp(torch.ops.my_ops.mul4.default), example_inputs(),
                         os.path.join(output_dir, "custom_ops_2.pte"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--so_library", help=f"the AOT library to load (default: {DEFAULT_AOT_LIBRARY})")
    source.add_argument("--jit", action="store_true", help="build the AOT library with torch.utils.cpp_extension")
    parser.add_argument("--output_dir", default=REPO_ROOT, help="where to write custom_ops_2.pte (default: repo root)")
    args = parser.parse_args()
    try:
        library = build_jit_library() if args.jit else load_aot_library(args.so_library)
    except (OSError, RuntimeError) as err:
        sys.exit(f"error: {err}")
    print(f"Loaded {library}")
    print(f"Exported {export_mul4(args.output_dir)}")


if __name__ == "__main__":
    main()
