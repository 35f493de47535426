"""Atomic local file writes that never follow a link planted at the temporary name.

A fixed temporary name (`path + ".tmp"`) is unsafe in a directory someone else wrote (a downloaded
pack): a symlink there makes `open(tmp, "w")` overwrite whatever it points to. `create_exclusive`
creates a fresh random name with O_CREAT|O_EXCL|O_NOFOLLOW (never an existing file or link), in the
destination's own directory so the final `os.replace` is a rename on one filesystem (and replaces a link
at `path` itself, never its target).

Hand-written rather than `tempfile.mkstemp`: mkstemp creates its file 0600 whatever the umask, and the
rename kept that mode, so a manifest written into a shared directory (or served by a web server running as
another user) could be read by its writer only, while the pack's other files were 0644. Creating with mode
0666 lets the kernel apply the user's umask, as a plain `open()` would (no process-wide `os.umask` call,
which would race with other threads).
"""

from __future__ import annotations

import os
import secrets
from typing import IO, Callable

_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_TRIES = 100


def create_exclusive(directory: str, prefix: str, suffix: str) -> tuple[int, str]:
    """A new file `directory/prefix<random>suffix` opened for writing (fd, path), with the mode a plain
    `open()` gives (0666 less the umask); never an existing file or a link."""
    for _ in range(_TRIES):
        path = os.path.join(directory, f"{prefix}{secrets.token_hex(6)}{suffix}")
        try:
            return os.open(path, _FLAGS | getattr(os, "O_BINARY", 0), 0o666), path
        except FileExistsError:
            continue
    raise FileExistsError(f"{directory}: expected a free temporary name {prefix}*{suffix}. Got {_TRIES} taken")


def atomic_write(path: str | os.PathLike, write: Callable[[IO[bytes]], object] | bytes) -> str:
    """Write `path` through a fresh temporary sibling (`write(fh)` or the given bytes), fsync, rename."""
    path = os.fspath(path)
    directory = os.path.dirname(path) or "."
    fd, tmp = create_exclusive(directory, f".{os.path.basename(path)}.", ".tmp")
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
