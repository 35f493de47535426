"""sha256 of stored files: the one helper writers, `--resume`, verify and the readers share."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import IO, Any

from dctdata.format.location import open_file

BLOCK = 1 << 20


def sha256_file(
    path: str,
    storage_options: Mapping[str, Any] | None = None,
    block: int = BLOCK,
    root: str | None = None,
    limit: int | None = None,
) -> tuple[str, int]:
    """(sha256 hex, bytes) of a local file (a regular file, inside `root` when given) or fsspec URL, read
    in blocks; with `limit`, reading stops one byte past it (a file that long is wrong anyway)."""
    h, n = hashlib.sha256(), 0
    with open_file(path, "rb", storage_options, root=root) as fh:
        while chunk := fh.read(block if limit is None else min(block, limit + 1 - n)):
            h.update(chunk)
            n += len(chunk)
    return h.hexdigest(), n


class HashingWriter:
    """Write-only file wrapper that hashes and counts what passes through (one pass, no re-read)."""

    def __init__(self, fh: IO[bytes]) -> None:
        self.fh, self.sha, self.bytes = fh, hashlib.sha256(), 0
        self.abandoned = False

    def write(self, data: bytes | bytearray | memoryview) -> int:
        if self.abandoned:  # a write that failed (disk full) is being unwound: nothing more goes to the file
            return len(data)
        self.sha.update(data)
        self.bytes += len(data)
        return self.fh.write(data)

    def flush(self) -> None:
        if not self.abandoned:
            self.fh.flush()

    def abandon(self) -> None:
        """Drop every later write: a failed file is deleted or redone, and a writer on top of this one (tarfile's
        stream) must not flush its buffer into the closed file when it is collected (a second traceback
        after the real error)."""
        self.abandoned = True

    def entry(self) -> dict[str, Any]:
        """The manifest's checksum entry for what was written."""
        return {"sha256": self.sha.hexdigest(), "bytes": self.bytes}


def with_path(exc: OSError, path: str) -> OSError:
    """`exc` naming the file it is about (a failed write() has no file name: "[Errno 28] No space left on
    device" alone does not say which disk); the same errno, so callers still tell ENOSPC from others."""
    if exc.filename:
        return exc
    return type(exc)(exc.errno, exc.strerror or str(exc), path) if exc.errno else OSError(f"{path}: {exc}")


def read_expected(fh: IO[bytes], expected_bytes: int, block: int = 4 << 20) -> tuple[bytes, str]:
    """Read a file whose size is known, hashing as it goes: (bytes, sha256 hex). Reads at most one
    block past the expected size, enough to tell a too-long file from a right one."""
    h, parts, n = hashlib.sha256(), [], 0
    while n <= expected_bytes:
        chunk = fh.read(min(block, expected_bytes + 1 - n))
        if not chunk:
            break
        h.update(chunk)
        parts.append(chunk)
        n += len(chunk)
    return b"".join(parts), h.hexdigest()
