"""Builds the my_ops wheel: the C++ AOT ops compiled with torch.utils.cpp_extension (setuptools), and the Python
registrations, as one package that `import my_ops` registers. The metadata is in pyproject.toml.

    pip wheel --no-build-isolation --no-deps . -w dist/     (bash test_custom_ops.sh wheel)
    pip install --no-build-isolation [-e] .

Every op declared `registered_from: "cpp"` in custom_ops.bzl goes into my_ops/_C.abi3.so: its registration sources,
its kernels in ATen mode, and the schemas and CPU registration of its out variants written by the project's codegen
entry point (codegen/run_codegen.py, as CMake and the JIT build do); CUDA sources only when torch has CUDA. The
library uses no Python C API, so it is built for the stable ABI (py_limited_api): one wheel for every Python 3.10+.
"""

import os
import shutil
import sys

from setuptools import setup
from setuptools.command.build_py import build_py
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "codegen")]

import run_codegen  # noqa: E402
from flow import compiler_flags, declarations  # noqa: E402

CODEGEN_DIR = os.path.join("build", "my_ops_codegen")  # relative: setuptools wants sources under setup.py's directory
# The ops' shared Python side, which the package carries a copy of (my_ops.<module>); each imports only torch.
SHARED_MODULES = ["flow/torch_compat.py", "flow/vmap_rules.py"]


def compile_through_ccache():
    """The wheel's compiles through ccache when it is found, as CMake's are (cmake/CompilerCache.cmake): the same AOT
    sources build again after a clean and in copies of the repository (an editable install compiles elsewhere,
    against its own venv's include directory, and misses). ccache stands in for c++ (a link named c++ ahead on PATH);
    paths under this directory are hashed relative to the build directory. CUSTOM_OPS_CCACHE=OFF compiles directly."""
    ccache = shutil.which("ccache") or shutil.which("ccache", path=os.path.dirname(sys.executable))  # the venv's
    if ccache is None or os.environ.get("CUSTOM_OPS_CCACHE", "ON").upper() in ("OFF", "0", "NO", "FALSE"):
        return
    links = os.path.join(HERE, "build", "ccache-bin")
    os.makedirs(links, exist_ok=True)
    for name in ("c++", "cc"):
        if not os.path.lexists(os.path.join(links, name)):
            os.symlink(ccache, os.path.join(links, name))
    os.environ["PATH"] = links + os.pathsep + os.environ.get("PATH", "")
    os.environ.setdefault("CCACHE_DIR", os.path.join(HERE, "cmake-out", "ccache"))
    os.environ["CCACHE_BASEDIR"] = HERE


def cpp_ops():
    return [op for op in declarations.load().values() if op.from_cpp]


def aot_extension():
    import torch

    ops = cpp_ops()
    selection = os.path.join(CODEGEN_DIR, "aot_selected_operators.yaml")
    run_codegen.write_selection(selection, [op.out_name for op in ops])
    sources = list(dict.fromkeys(s for op in ops for s in (*op.aot_sources, *op.kernel_sources)))  # shared ones once
    sources += [os.path.relpath(s, HERE) for s in run_codegen.generate(selection, CODEGEN_DIR, aten=True)]
    # -g0 and a stripped link: Python's own flags add -g, which made the library 14 MB instead of under 1 MB.
    flags = ["-O3", "-g0", *compiler_flags.ATEN_MODE]  # BuildExtension adds -DPy_LIMITED_API (its minimum, Python 3.10)
    kwargs = dict(include_dirs=[HERE], py_limited_api=True, extra_link_args=["-Wl,--strip-all"])
    if torch.version.cuda and CUDA_HOME:
        flags.append("-DCUSTOM_OPS_WITH_CUDA")
        sources += [s for op in ops for s in op.cuda_sources]
        return CUDAExtension("my_ops._C", sources, extra_compile_args={"cxx": flags + compiler_flags.CXX,
                                                                       "nvcc": flags + compiler_flags.NVCC}, **kwargs)
    return CppExtension("my_ops._C", sources, extra_compile_args={"cxx": flags + compiler_flags.CXX}, **kwargs)


class BuildExtensionWithoutPythonAPI(BuildExtension):
    """BuildExtension minus TORCH_API_INCLUDE_EXTENSION_H: with it, torch/torch.h (which the generated headers include)
    pulls in pybind11 and Python's full C API, which the limited API lacks and this library does not use."""

    def finalize_options(self):
        # Objects always under the checkout's build/, also for an editable install (setuptools would compile in a
        # fresh /tmp directory): the paths ccache hashes relative to this directory are then the same in every build
        # of these sources, so the wheel's objects serve `pip install -e` and copies of the repository.
        super().finalize_options()
        self.build_temp = os.path.join(HERE, "build", "temp.aot")

    def _add_compile_flag(self, extension, flag):
        if flag != "-DTORCH_API_INCLUDE_EXTENSION_H":
            super()._add_compile_flag(extension, flag)


class BuildPyWithRegistrations(build_py):
    """Adds to the package the modules that register the Python ops, the shared Python side, and the op list."""

    def run(self):
        super().run()
        package = os.path.join(self.build_lib, "my_ops")
        ops = declarations.load().values()
        python_modules = sorted({op.python_file for op in ops if not op.from_cpp})  # carried flat: my_ops.<name>
        for path in python_modules + SHARED_MODULES:
            shutil.copyfile(os.path.join(HERE, path), os.path.join(package, os.path.basename(path)))
        with open(os.path.join(package, "_declared.py"), "w") as f:
            f.write('"""The ops this wheel was built with (from custom_ops.bzl)."""\n\n')
            f.write(f"OPS = {[op.as_manifest() for op in ops]!r}\n")


compile_through_ccache()
setup(
    packages=["my_ops", "my_ops.hf"],
    py_modules=[],
    ext_modules=[aot_extension()] if cpp_ops() else [],
    cmdclass={"build_ext": BuildExtensionWithoutPythonAPI, "build_py": BuildPyWithRegistrations},
    options={"bdist_wheel": {"py_limited_api": "cp310"}},
)
