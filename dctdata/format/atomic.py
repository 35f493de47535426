"""Atomic local file writes that never follow a link planted at the temporary name.

A fixed temporary name (`path + ".tmp"`) is unsafe in a directory someone else wrote (a downloaded
pack): a symlink there makes `open(tmp, "w")` overwrite whatever it points to. `tempfile.mkstemp`
creates a fresh name with O_CREAT|O_EXCL (never an existing file or link), in the destination's own
directory so the final `os.replace` is a rename on one filesystem (and replaces a link at `path`
itself, never its target).
"""

from __future__ import annotations

import os
import tempfile
from typing import IO, Callable


def atomic_write(path: str | os.PathLike, write: Callable[[IO[bytes]], object] | bytes) -> str:
    """Write `path` through a fresh temporary sibling (`write(fh)` or the given bytes), fsync, rename."""
    path = os.fspath(path)
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            if isinstance(write, (bytes, bytearray, memoryview)):
                fh.write(write)
            else:
                write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path
