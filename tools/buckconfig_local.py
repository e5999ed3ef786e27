"""Prints .buckconfig.local for this interpreter's wheels: where the Buck2 build finds Python, executorch and torch.
`bash test_custom_ops.sh buck2` writes it (git ignores it), so no path is hard-coded in TARGETS.

    python tools/buckconfig_local.py > .buckconfig.local
"""

import importlib.util
import os
import sys


def package_dir(name: str) -> str:
    return list(importlib.util.find_spec(name).submodule_search_locations)[0]


def main() -> None:
    import torch

    print("# Written by tools/buckconfig_local.py (bash test_custom_ops.sh buck2): this machine's wheels. Not in git.")
    print("[custom_ops]")
    print(f"  python = {sys.executable}")
    print(f"  executorch_dir = {package_dir('executorch')}")
    print(f"  torch_dir = {os.path.dirname(torch.__file__)}")
    print(f"  torch_cxx11_abi = {int(torch._C._GLIBCXX_USE_CXX11_ABI)}")


if __name__ == "__main__":
    main()
