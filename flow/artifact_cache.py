"""Artifacts that take seconds to a minute to make (AOTInductor packages, the hf mode's lowered programs), kept under
cmake-out/ and named by a hash of everything they are made from, so an edit to any of it makes them again and
nothing else does.
"""

from __future__ import annotations

import functools
import glob
import hashlib
import os
import re
from importlib import metadata
from typing import Callable, Iterable

from flow import REPO_ROOT, declarations

CACHE_ROOT = os.path.join(REPO_ROOT, "cmake-out")
# What every artifact is made from: the machinery that exports, lowers and packages (the flow and my_ops packages, the
# kernel helpers, the example models, the top-level scripts and sources). The ops' own folders and declarations enter
# per artifact (op_files): those of the ops it calls, so declaring or editing another op keeps it.
MACHINERY_PATTERNS = ("*.py", "*.cpp", "kernel_helpers/*.h", "examples/*.py", "flow/*.py", "models/*.py",
                      "my_ops/**/*.py")
PACKAGES = ("torch", "executorch", "transformers")
# How an op's file reaches another op's folder: a C++ include by its path from the repository, a Python module path.
_INCLUDE = re.compile(r'#\s*include\s*"(ops/[^"]+)"')
_MODULE = re.compile(r"\bops\.(\w+)\b")


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "absent"


def _module_file(module: str | None) -> list[str]:
    """The repository file of a module the declarations name ("ops.rope.rope.rope_reference"'s module), if it is one."""
    path = os.path.join(*module.split(".")) + ".py" if module else ""
    return [path] if path and os.path.isfile(os.path.join(REPO_ROOT, path)) else []


def op_files(names, declared: dict | None = None) -> list[str]:
    """The files the ops `names` ("my_ops::rope") are made of, relative to the repository: every file of each folder
    under ops/ their declared sources are in, and of every folder those files reach (a C++ #include "ops/x/..." line,
    a Python `ops.x` module), to a fixed point; and their declared files outside ops/. `declared`: custom_ops.bzl's
    ops, if the caller read them already."""
    declared = declared or declarations.load(os.path.join(REPO_ROOT, "custom_ops.bzl"))
    folders: set[str] = set()
    files: set[str] = set()
    pending: list[str] = []

    def reach(relative: str) -> None:
        parts = os.path.normpath(relative).split(os.sep)
        if parts[0] != "ops" or len(parts) < 2:
            pending.append(relative)
        elif parts[1] not in folders:
            folders.add(parts[1])
            pending.extend(os.path.relpath(p, REPO_ROOT) for p in glob.glob(
                os.path.join(REPO_ROOT, "ops", glob.escape(parts[1]), "**"), recursive=True) if os.path.isfile(p))

    for name in names:
        if (op := declared.get(name)) is None:
            continue  # another library's op: the package versions key it
        for relative in [*op.kernel_sources, *op.aot_sources, *op.cuda_sources, *op.without_python_sources,
                         *_module_file(op.python_module), *_module_file(op.reference.rpartition(".")[0]),
                         *_module_file((op.example_model or "").rpartition(".")[0])]:
            reach(relative)
    while pending:
        relative = os.path.normpath(pending.pop())
        if relative in files or not os.path.isfile(os.path.join(REPO_ROOT, relative)):
            continue
        files.add(relative)
        if relative.startswith("ops" + os.sep):
            with open(os.path.join(REPO_ROOT, relative), errors="replace") as f:
                text = f.read()
            found = _MODULE.findall(text) if relative.endswith(".py") else [
                p.split("/")[1] for p in _INCLUDE.findall(text)]
            for folder in found:
                reach(os.path.join("ops", folder, ""))
    return sorted(files)


@functools.cache
def source_hash(*settings: str, ops: tuple[str, ...] = ()) -> str:
    """A hash of the installed versions of PACKAGES, `settings` (configuration an artifact is made with), the contents
    of every machinery file (MACHINERY_PATTERNS) and the declarations and files of `ops` (op_files). Once per process:
    the sources a process imported are the ones its artifacts are made from."""
    declared = declarations.load(os.path.join(REPO_ROOT, "custom_ops.bzl"))
    digest = hashlib.sha256(" ".join([*(f"{p}={_version(p)}" for p in PACKAGES), *settings]).encode())
    digest.update(repr([declared.get(name) for name in sorted(set(ops))]).encode())
    machinery = {os.path.relpath(p, REPO_ROOT) for pattern in MACHINERY_PATTERNS
                 for p in glob.glob(os.path.join(REPO_ROOT, pattern), recursive=True)}
    for relative in sorted(machinery | set(op_files(ops, declared))):
        digest.update(relative.encode() + b"\0")
        with open(os.path.join(REPO_ROOT, relative), "rb") as f:
            digest.update(hashlib.sha256(f.read()).digest())
    return digest.hexdigest()[:16]


def cached(directory: str, name: str, make: Callable[[str], None], *settings: str,
           ops: Iterable[str] = ()) -> tuple[str, bool]:
    """The path of artifact `name` (e.g. "model.pte") under cmake-out/<directory>, made by make(path) once per source
    hash (the ops it calls: their declared names, "my_ops::rope"); and whether it was made now. Made beside its place and
    renamed into it, so a process reading the cache sees a whole artifact or none (flow/file_cache.py, as `python -m
    my_ops.hf` keeps its programs)."""
    from flow.file_cache import cached as keyed

    key = source_hash(*settings, ops=tuple(sorted(set(ops))))
    return keyed(os.path.join(CACHE_ROOT, directory), name, key, make)
