"""Makes declared ops known to PyTorch, whichever way each is registered: a Python op's module is imported; a C++ op
comes from an AOT library (libcustom_ops_aot_lib.so from CMake, or built here with torch.utils.cpp_extension), checked
to register every op it should. Then what C++ cannot register is added from Python (vmap_rules), and the torch 2.13
Inductor workaround (torch_compat) is applied to each op's namespace.

    register_with_pytorch(ops, aot_library=None)    what the exporter, the verifier and the profiler call
    register_build(build_dir)                       every declared op, from a build with all of them
    load_aot_library(path, expect=None)             one AOT library per process
    build_jit_library(ops=None)                     the same sources and codegen as CMake, compiled on the fly
"""

from __future__ import annotations

import os

import torch

from flow import REPO_ROOT, declarations, torch_compat, vmap_rules

JIT_BUILD_DIR = os.path.join(declarations.BUILD_ROOT, "jit")

_loaded_library: str | None = None


def build_hint(ops) -> str:
    names = ",".join(op.out_name for op in ops)
    return (f"Build it with `bash test_custom_ops.sh cmake {ops[0].short_name}` (or cmake -S . -B cmake-out/DIR -G Ninja "
            f"-DCUSTOM_OPS_ROOT_OPS={names} && cmake --build cmake-out/DIR), or pass --jit to build it on the fly.")


def _add_python_side(ops) -> None:
    for op in ops:
        torch_compat.apply(op.namespace)
        if op.from_cpp and op.elementwise:
            vmap_rules.register_elementwise(op.name)


def _check_registered(path: str, expect) -> None:
    missing = [op for op in expect if not op.is_registered()]
    if missing:
        raise RuntimeError(f"{path} does not register {', '.join(op.name for op in missing)}: it was built without "
                           f"{'it' if len(missing) == 1 else 'them'}. {build_hint(missing)}")


def expected_ops(path: str):
    """The C++-registered ops a CMake-built AOT library should register: those its build selected (the selection
    codegen wrote beside it), else every op declared as registered from C++."""
    declared = [op for op in declarations.load().values() if op.from_cpp]
    selection = os.path.join(os.path.dirname(path), "aot_selected_operators.yaml")
    if os.path.isfile(selection):
        import yaml

        with open(selection) as f:
            names = set((yaml.safe_load(f) or {}).get("operators") or {})
        return [op for op in declared if op.out_name in names]
    return declared


def load_aot_library(path: str, expect=None) -> str:
    """Loads an AOT library into this process and returns its path.

    `expect`: the DeclaredOps it must register (default: expected_ops()); a missing one is a RuntimeError saying how
    to build it. A process takes one AOT library: every one defines the namespace (codegen's RegisterSchema.cpp), and
    PyTorch allows one definition per namespace; loading the same one again is a no-op.
    """
    global _loaded_library
    path = os.path.abspath(path)
    expect = list(expected_ops(path) if expect is None else expect)
    hint_ops = expect or [op for op in declarations.load().values() if op.from_cpp]
    if not os.path.isfile(path):
        raise FileNotFoundError(f"AOT library not found: {path}. {build_hint(hint_ops)}")
    if _loaded_library is not None and _loaded_library != path:
        raise RuntimeError(f"the AOT library {_loaded_library} is already loaded; {path} would define its namespace a "
                           "second time, which PyTorch refuses. Build one AOT library with every C++ op you need, or "
                           "use a fresh process")
    if _loaded_library is None and expect and all(vmap_rules.is_defined(op.name) for op in expect):
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
    _add_python_side([op for op in declarations.load().values() if op.from_cpp and op.is_registered()])
    return path


def build_jit_library(ops=None, verbose: bool = False) -> str:
    """Builds the AOT library of `ops` (default: every op declared as registered from C++) with
    torch.utils.cpp_extension (ninja, incremental, in cmake-out/jit/), after running the same codegen as CMake, then
    loads it like load_aot_library(); returns its path."""
    from torch.utils.cpp_extension import load

    from codegen import run_codegen

    global _loaded_library
    ops = list(ops or [op for op in declarations.load().values() if op.from_cpp])
    if _loaded_library is not None:
        raise RuntimeError(f"the AOT library {_loaded_library} is already loaded in this process; build the JIT "
                           "library in a fresh process")
    generated = os.path.join(JIT_BUILD_DIR, "generated")
    selection = os.path.join(generated, "aot_selected_operators.yaml")
    run_codegen.write_selection(selection, [op.out_name for op in ops])
    sources = [os.path.join(REPO_ROOT, s) for op in ops for s in (*op.aot_sources, *op.kernel_sources)]
    sources += run_codegen.generate(selection, generated, aten=True)
    run_codegen.declared_dtypes(generated)  # the ops' dtype sets, as CMake's
    from flow import compiler_flags

    flags = ["-O3", *compiler_flags.ATEN_MODE]
    if torch.version.cuda:
        sources += [os.path.join(REPO_ROOT, s) for op in ops for s in op.cuda_sources]
        flags.append("-DCUSTOM_OPS_WITH_CUDA")

    path = load(name="custom_ops_aot_lib_jit", sources=sources, extra_cflags=flags + compiler_flags.CXX,
                extra_cuda_cflags=flags + compiler_flags.NVCC,
                extra_include_paths=[REPO_ROOT, generated], build_directory=JIT_BUILD_DIR, is_python_module=False,
                verbose=verbose)
    _loaded_library = os.path.abspath(path)
    _check_registered(path, ops)
    _add_python_side(ops)
    return path


def register_with_pytorch(ops, aot_library: str | None = None) -> None:
    """Makes `ops` known to PyTorch: imports the module of each Python-registered op, and loads the AOT library (which
    must register every C++-registered one; default: the one loaded already, else the CMake build of the first such
    op's example). ATen's ops need nothing: PyTorch ships them."""
    cpp_ops = [op for op in ops if op.from_cpp]
    python_ops = [op for op in ops if op.from_python]
    for op in python_ops:
        if op.defined_by:  # the library that defines the op, whose out variant the op's module adds
            declarations.import_repository_module(op.defined_by)
        declarations.import_repository_module(op.python_module)
    if cpp_ops:
        default = _loaded_library or os.path.join(cpp_ops[0].build_dir, "libcustom_ops_aot_lib.so")
        load_aot_library(aot_library or default, expect=cpp_ops)
    _add_python_side(python_ops)


def register_build(build_dir: str) -> None:
    """Every declared op known to PyTorch, the C++ ones from `build_dir`'s AOT library (a build with every op)."""
    register_with_pytorch(list(declarations.load().values()),
                          aot_library=os.path.join(build_dir, "libcustom_ops_aot_lib.so"))
