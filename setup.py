"""Builds the my_ops wheel: the C++ AOT ops compiled by CMakeLists.txt (the AOT library every CMake build makes), and
the Python registrations, as one package that `import my_ops` registers. The metadata is in pyproject.toml.

    pip wheel --no-build-isolation --no-deps . -w dist/     (bash test_custom_ops.sh wheel)
    pip install --no-build-isolation [-e] .

Every op declared `registered_from: "cpp"` in custom_ops.bzl goes into my_ops/_C.abi3.so: CMake's
libcustom_ops_aot_lib.so (its registration sources, its kernels in ATen mode, the schemas and CPU registration of its
out variants from codegen/run_codegen.py; CUDA sources when torch has CUDA), stripped. One build definition for the
wheel and the flows, so their flags cannot drift, and through ccache the wheel reuses the objects of any CMake tree
that selected every op. The library uses no Python C API, so the wheel is for the stable ABI: one for Python 3.10+.
"""

import os
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from flow import declarations  # noqa: E402

# Two levels under the checkout, like cmake-out/<tree>: ccache hashes paths relative to the build directory, so the
# same source compiled here and in cmake-out/all_ops is one cache entry.
CMAKE_BUILD_DIR = os.path.join(HERE, "build", "aot_library")


def cpp_ops():
    return [op for op in declarations.load().values() if op.from_cpp]


def build_tool(name: str) -> str:
    """cmake or ninja: on PATH, else from its PyPI package in this interpreter (a venv's bin/ may not be on PATH)."""
    found = shutil.which(name) or shutil.which(name, path=os.path.dirname(sys.executable))
    if found is None:
        try:
            module = __import__(name)
            found = shutil.which(name, path=getattr(module, "BIN_DIR", None) or getattr(module, "CMAKE_BIN_DIR", None))
        except ImportError:
            pass
    if found is None:
        sys.exit(f"error: building my_ops' C++ library needs {name}; install it (pip install {name})")
    return found


class BuildAotLibraryWithCMake(build_ext):
    """my_ops._C is CMake's custom_ops_aot_lib (every op selected), configured and built in CMAKE_BUILD_DIR."""

    def build_extension(self, extension):
        configure = [build_tool("cmake"), "-S", HERE, "-B", CMAKE_BUILD_DIR, "-G", "Ninja",
                     f"-DCMAKE_MAKE_PROGRAM={build_tool('ninja')}", f"-DPython3_EXECUTABLE={sys.executable}",
                     "-DCMAKE_BUILD_TYPE=Release",
                     # A wheel's library carries no path of this machine and no symbols (-g0 is Release's default).
                     "-DCMAKE_SKIP_BUILD_RPATH=ON", "-DCMAKE_SHARED_LINKER_FLAGS=-Wl,--strip-all"]
        if "CUSTOM_OPS_CCACHE" in os.environ:
            configure.append(f"-DCUSTOM_OPS_CCACHE={os.environ['CUSTOM_OPS_CCACHE']}")
        build = [build_tool("cmake"), "--build", CMAKE_BUILD_DIR, "--target", "custom_ops_aot_lib",
                 "-j", str(os.cpu_count() or 1)]
        for command in (configure, build):
            subprocess.run(command, check=True)
        target = self.get_ext_fullpath(extension.name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(os.path.join(CMAKE_BUILD_DIR, "libcustom_ops_aot_lib.so"), target)


class BuildPyWithRegistrations(build_py):
    """Adds to the package the modules that register the Python ops, the shared Python side, and the op list."""

    def run(self):
        super().run()
        package = os.path.join(self.build_lib, "my_ops")
        ops = declarations.load().values()
        python_modules = sorted({op.python_file for op in ops if op.from_python})  # carried flat: my_ops.<name>
        for path in python_modules + list(declarations.WHEEL_SHARED_MODULES):  # the shared Python side
            shutil.copyfile(os.path.join(HERE, path), os.path.join(package, os.path.basename(path)))
        with open(os.path.join(package, "_declared.py"), "w") as f:
            f.write('"""The ops this wheel was built with (from custom_ops.bzl)."""\n\n')
            f.write(f"OPS = {[op.as_manifest() for op in ops]!r}\n")


setup(
    packages=["my_ops", "my_ops.hf"],
    py_modules=[],
    # No sources of its own: BuildAotLibraryWithCMake makes it; py_limited_api names it _C.abi3.so.
    ext_modules=[Extension("my_ops._C", sources=[], py_limited_api=True)] if cpp_ops() else [],
    cmdclass={"build_ext": BuildAotLibraryWithCMake, "build_py": BuildPyWithRegistrations},
    options={"bdist_wheel": {"py_limited_api": "cp310"}},
)
