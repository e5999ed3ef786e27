"""Prints .buckconfig.local for this interpreter's wheels: where the Buck2 build finds Python, executorch and torch.
`bash test_custom_ops.sh buck2` writes it (git ignores it), so no path is hard-coded in TARGETS.

    python tools/buckconfig_local.py > .buckconfig.local
"""

import importlib.util
import os
import sys


def package_dir(name: str) -> str:
    return list(importlib.util.find_spec(name).submodule_search_locations)[0]


def cxx11_abi(torch_dir: str) -> int:
    """torch's C++ ABI, read from libc10's mangled names (std::__cxx11 appears only in a new-ABI build) rather than by
    importing torch (1.4 s of CPU; the tests write this file about ten times a run), as cmake/TorchFromWheel.cmake
    reads it."""
    with open(os.path.join(torch_dir, "lib", "libc10.so"), "rb") as f:
        return int(b"St7__cxx11" in f.read())


def main() -> None:
    torch_dir = package_dir("torch")
    print("# Written by tools/buckconfig_local.py (bash test_custom_ops.sh buck2): this machine's wheels. Not in git.")
    print("[custom_ops]")
    print(f"  python = {sys.executable}")
    print(f"  executorch_dir = {package_dir('executorch')}")
    print(f"  torch_dir = {torch_dir}")
    print(f"  torch_cxx11_abi = {cxx11_abi(torch_dir)}")


if __name__ == "__main__":
    main()
