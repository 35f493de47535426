"""Atomic local file writes that never follow a link planted at the temporary name.

A fixed temporary name (`path + ".tmp"`) is unsafe in a directory someone else wrote (a downloaded
pack): a symlink there makes `open(tmp, "w")` overwrite whatever it points to. The temporary file is a
fresh random name opened with O_CREAT|O_EXCL|O_NOFOLLOW (never an existing file or link), in the
destination's own directory so the final `os.replace` is a rename on one filesystem (and replaces a
link at `path` itself, never its target).

Why not `tempfile.mkstemp`: it creates the file with mode 0600 whatever the umask, so a manifest (or an
inspect PNG) was unreadable to a colleague or a job under another account while the shards beside it
were 0644. Opening with mode 0666 lets the process umask decide, as for every other file a pack writes.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Callable
from typing import IO

_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_ATTEMPTS = 100


def _fresh(directory: str, base: str) -> tuple[int, str]:
    """(fd, path) of a new file `.<base>.<random>.tmp` in `directory`, mode 0666 minus the umask."""
    for _ in range(_ATTEMPTS):
        tmp = os.path.join(directory, f".{base}.{secrets.token_hex(6)}.tmp")
        try:
            return os.open(tmp, _FLAGS | getattr(os, "O_BINARY", 0), 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"{directory}: expected a free temporary name for {base!r}. Got {_ATTEMPTS} taken")


def atomic_write(path: str | os.PathLike[str], write: Callable[[IO[bytes]], object] | bytes) -> str:
    """Write `path` through a fresh temporary sibling (`write(fh)` or the given bytes), fsync, rename."""
    path = os.fspath(path)
    directory = os.path.dirname(path) or "."
    fd, tmp = _fresh(directory, os.path.basename(path))
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
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def create_exclusive(directory: str, base: str) -> tuple[int, str]:
    """(fd, path) of a new file `.<base>.<random>.tmp` in `directory`, as `atomic_write` makes its own, for a
    writer that renames it itself (the shard cache)."""
    return _fresh(directory, base)
