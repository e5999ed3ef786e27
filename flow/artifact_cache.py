"""Artifacts that take seconds to a minute to make (AOTInductor packages, the hf mode's lowered programs), kept under
cmake-out/ and named by a hash of everything they are made from, so an edit to any of it makes them again and
nothing else does.
"""

from __future__ import annotations

import functools
import glob
import hashlib
import os
from importlib import metadata
from typing import Callable

from flow import REPO_ROOT

CACHE_ROOT = os.path.join(REPO_ROOT, "cmake-out")
# The project's sources an export reads: the declarations, the ops' Python and C++ (registrations, Meta kernels), the
# kernel helpers, the example models, the flow package and the my_ops package (its module swaps).
SOURCE_PATTERNS = ("*.py", "*.cpp", "custom_ops.bzl", "ops/**/*.py", "ops/**/*.cpp", "ops/**/*.h", "kernel_helpers/*.h",
                   "examples/*.py", "flow/*.py", "my_ops/**/*.py")
PACKAGES = ("torch", "executorch", "transformers")


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "absent"


@functools.cache
def source_hash(*settings: str) -> str:
    """A hash of the installed versions of PACKAGES, `settings` (configuration an artifact is made with) and the
    contents of every file of SOURCE_PATTERNS. Once per process: the sources a process imported are the ones its
    artifacts are made from."""
    digest = hashlib.sha256(" ".join([*(f"{p}={_version(p)}" for p in PACKAGES), *settings]).encode())
    files = sorted({p for pattern in SOURCE_PATTERNS
                    for p in glob.glob(os.path.join(REPO_ROOT, pattern), recursive=True)})
    for path in files:
        digest.update(os.path.relpath(path, REPO_ROOT).encode() + b"\0")
        with open(path, "rb") as f:
            digest.update(hashlib.sha256(f.read()).digest())
    return digest.hexdigest()[:16]


def cached(directory: str, name: str, make: Callable[[str], None], *settings: str) -> tuple[str, bool]:
    """The path of artifact `name` (e.g. "llama.pte") under cmake-out/<directory>, made by make(path) once per source
    hash; and whether it was made now. Made beside its place and renamed into it, so a process reading the cache sees
    a whole artifact or none (my_ops.hf.runtime.cached, the cache `python -m my_ops.hf` keeps its programs in)."""
    from my_ops.hf.runtime import cached as keyed

    return keyed(os.path.join(CACHE_ROOT, directory), name, source_hash(*settings), make)
