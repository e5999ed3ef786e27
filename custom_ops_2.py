"""Step 2 of the mul4 flow: loads the C++ AOT library that registers my_ops::mul4 with PyTorch, then exports a model
calling mul4 to custom_ops_2.pte. The library comes from CMake (libcustom_ops_aot_lib.so) or, with --jit, from
torch.utils.cpp_extension building the same sources on the fly.

The loader is not mul4's alone: it loads the AOT library of any ops declared `registered_from: "cpp"` in
custom_ops.bzl, checks that every op the library should register is registered, and adds what C++ cannot register
(the vmap rule of elementwise ops, the torch 2.13 workaround).

    python custom_ops_2.py --so_library cmake-out/custom_ops_2/libcustom_ops_aot_lib.so [--output_dir DIR]
    python custom_ops_2.py --jit [--output_dir DIR]

Importing this module registers nothing; load_aot_library() or build_jit_library() does.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

import aot_python_side
import declared_ops

REPO_ROOT = os.path.dirname(os.path.abspath(__file__))
EXAMPLE_OP = "my_ops::mul4"
DEFAULT_AOT_LIBRARY = os.path.join(REPO_ROOT, "cmake-out", "custom_ops_2", "libcustom_ops_aot_lib.so")
JIT_BUILD_DIR = os.path.join(REPO_ROOT, "cmake-out", "jit")


def build_hint(ops) -> str:
    names = ",".join(op.out_name for op in ops)
    return (f"Build it with `bash test_custom_ops.sh cmake {ops[0].short_name}` (or cmake -S . -B cmake-out/DIR -G Ninja "
            f"-DCUSTOM_OPS_ROOT_OPS={names} && cmake --build cmake-out/DIR), or pass --jit to build it on the fly.")


_loaded_library: str | None = None


def _register_python_side(ops) -> None:
    for op in ops:
        aot_python_side.register(op.name, op.elementwise)


def _check_registered(path: str, expect) -> None:
    missing = [op for op in expect if not op.is_registered()]
    if missing:
        raise RuntimeError(f"{path} does not register {', '.join(op.name for op in missing)}: it was built without "
                           f"{'it' if len(missing) == 1 else 'them'}. {build_hint(missing)}")


def expected_ops(path: str):
    """The C++-registered ops a CMake-built AOT library should register: those its build selected (the selection
    codegen wrote beside it), else every op declared as registered from C++."""
    declared = [op for op in declared_ops.load().values() if op.from_cpp]
    selection = os.path.join(os.path.dirname(path), "aot_selected_operators.yaml")
    if os.path.isfile(selection):
        import yaml

        with open(selection) as f:
            names = set((yaml.safe_load(f) or {}).get("operators") or {})
        return [op for op in declared if op.out_name in names]
    return declared


def load_aot_library(so_library: str | None = None, expect=None) -> str:
    """Loads an AOT library (default: the CMake build of mul4's) into this process and returns its path.

    `expect`: the DeclaredOps it must register (default: expected_ops()); a missing one is a RuntimeError saying how
    to build it. A process takes one AOT library: every one defines the namespace (codegen's RegisterSchema.cpp), and
    PyTorch allows one definition per namespace; loading the same one again is a no-op.
    """
    global _loaded_library
    path = os.path.abspath(so_library or DEFAULT_AOT_LIBRARY)
    expect = list(expected_ops(path) if expect is None else expect)
    hint_ops = expect or [declared_ops.find(EXAMPLE_OP)]
    if not os.path.isfile(path):
        raise FileNotFoundError(f"AOT library not found: {path}. {build_hint(hint_ops)}")
    if _loaded_library is not None and _loaded_library != path:
        raise RuntimeError(f"the AOT library {_loaded_library} is already loaded; {path} would define its namespace a "
                           "second time, which PyTorch refuses. Build one AOT library with every C++ op you need, or "
                           "use a fresh process")
    if _loaded_library is None and expect and all(aot_python_side.is_defined(op.name) for op in expect):
        # Another AOT library registered them already (the my_ops package's): loading this one would define the
        # namespace a second time, so its ops are used as they are.
        _loaded_library = path
    if _loaded_library is None:
        try:
            torch.ops.load_library(path)
        except OSError as err:
            raise OSError(f"cannot load {path} as a PyTorch op library ({err}). {build_hint(hint_ops)}") from err
        _loaded_library = path
    _check_registered(path, expect)
    _register_python_side([op for op in declared_ops.load().values() if op.from_cpp and op.is_registered()])
    return path


def build_jit_library(ops=None, verbose: bool = False) -> str:
    """Builds the AOT library of `ops` (default: every op declared as registered from C++) with
    torch.utils.cpp_extension (ninja, incremental, in cmake-out/jit/), after running the same codegen as CMake, then
    loads it like load_aot_library(); returns its path."""
    from torch.utils.cpp_extension import load

    sys.path.insert(0, os.path.join(REPO_ROOT, "codegen"))
    import run_codegen

    global _loaded_library
    ops = list(ops or [op for op in declared_ops.load().values() if op.from_cpp])
    if _loaded_library is not None:
        raise RuntimeError(f"the AOT library {_loaded_library} is already loaded in this process; build the JIT "
                           "library in a fresh process")
    generated = os.path.join(JIT_BUILD_DIR, "generated")
    selection = os.path.join(generated, "aot_selected_operators.yaml")
    run_codegen.write_selection(selection, [op.out_name for op in ops])
    sources = [os.path.join(REPO_ROOT, s) for op in ops for s in (*op.aot_sources, *op.kernel_sources)]
    sources += run_codegen.generate(selection, generated, aten=True)
    flags = ["-O3", "-DUSE_ATEN_LIB"]
    if torch.version.cuda:
        sources += [os.path.join(REPO_ROOT, s) for op in ops for s in op.cuda_sources]
        flags.append("-DCUSTOM_OPS_WITH_CUDA")
    path = load(name="custom_ops_aot_lib_jit", sources=sources, extra_cflags=flags, extra_cuda_cflags=flags,
                extra_include_paths=[REPO_ROOT], build_directory=JIT_BUILD_DIR, is_python_module=False,
                verbose=verbose)
    _loaded_library = os.path.abspath(path)
    _check_registered(path, ops)
    _register_python_side(ops)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--so_library", help=f"the AOT library to load (default: {DEFAULT_AOT_LIBRARY})")
    source.add_argument("--jit", action="store_true", help="build the AOT library with torch.utils.cpp_extension")
    parser.add_argument("--output_dir", default=REPO_ROOT, help="where to write the .pte (default: the repo root)")
    parser.add_argument("--etrecord", action="store_true", help="also write the ETRecord for the devtools")
    args = parser.parse_args()
    from pte_export import export_example

    try:
        mul4 = declared_ops.find(EXAMPLE_OP)
        library = build_jit_library() if args.jit else load_aot_library(args.so_library, expect=[mul4])
        print(f"Loaded {library}")
        print(f"Exported {export_example(mul4, args.output_dir, etrecord=args.etrecord)}")
    except (OSError, RuntimeError, declared_ops.DeclarationError) as err:
        sys.exit(f"error: {err}")


if __name__ == "__main__":
    main()
