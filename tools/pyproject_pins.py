"""Prints the pins test_custom_ops.sh installs into .venv/: a group of [dependency-groups] in pyproject.toml (dev by
default; no-deps: the packages installed without their dependencies), one a line.

Works on Python 3.10, which has no tomllib: pip vendors the same parser as tomli, and every venv has pip.
    python tools/pyproject_pins.py pyproject.toml [GROUP]
"""

import sys

try:
    import tomllib
except ImportError:  # Python 3.10
    from pip._vendor import tomli as tomllib

with open(sys.argv[1], "rb") as f:
    print("\n".join(tomllib.load(f)["dependency-groups"][sys.argv[2] if len(sys.argv) > 2 else "dev"]))
