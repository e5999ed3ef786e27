"""Files made once per key: `<cache_dir>/<stem>-<hash of key><ext>`, made beside their place and renamed into it (a
reader sees a whole file or none), the versions a newer key supersedes removed once unused for a while. The project's
artifact cache (flow/artifact_cache.py) and `python -m my_ops.hf`'s program cache both keep their files this way; it
imports only the standard library, and the my_ops wheel carries a copy (my_ops.file_cache)."""

from __future__ import annotations

import contextlib
import glob
import hashlib
import os
import tempfile
import time
from typing import Callable


# A version of a name that a newer one supersedes stays this long after its last use: the cache is shared by every
# checkout, and another one (older sources) may be reading it in a test run right now.
SUPERSEDED_KEPT_S = 600


def cached(cache_dir: str, name: str, key: str, make: Callable[[str], None]) -> tuple[str, bool]:
    """<cache_dir>/<name stem>-<hash of key><ext>, made by make(path) once per key; and whether it was made now. Made
    beside its place and renamed into it, so a reader sees a whole file or none; each use marks it used (its mtime), and
    the versions of the same name it supersedes are removed once unused for SUPERSEDED_KEPT_S (a program is hundreds
    of MiB)."""
    stem, ext = os.path.splitext(name)
    path = os.path.join(cache_dir, f"{stem}-{hashlib.sha256(key.encode()).hexdigest()[:16]}{ext}")
    if os.path.isfile(path):
        with contextlib.suppress(OSError):  # a read-only cache is still a cache
            os.utime(path)
        return path, False
    os.makedirs(cache_dir, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir) as tmp:
        partial = os.path.join(tmp, name)
        make(partial)
        os.replace(partial, path)
    for old in glob.glob(os.path.join(cache_dir, f"{glob.escape(stem)}-{'[0-9a-f]' * 16}{ext}")):
        with contextlib.suppress(FileNotFoundError):  # another process may prune it first
            if old != path and time.time() - os.path.getmtime(old) > SUPERSEDED_KEPT_S:
                os.remove(old)
    return path, True
