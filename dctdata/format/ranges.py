"""Byte ranges of a dataset's stored files, many in one call: the I/O under the zarr reader.

The reader decodes chunks itself (crc32c, then the field's lossless codec), so all it needs from
storage is "these byte ranges of these files". Asking for a whole batch at once is what lets the
I/O overlap:
- local files: `posix_fadvise(WILLNEED)` for every range first, so a cold disk or network file
  system sees all requests at once, then positional reads (`os.pread`), no threads;
- URLs: fsspec's `cat_ranges`, which runs the requests concurrently on async filesystems (S3, GCS)
  and one after another on the others (memory://, ...); for http(s) `dctdata.format.http.cat_ranges`,
  which checks each answer and never reads more than asked.
Adjacent ranges of one file are merged into one request first, so consecutive samples cost one
request per shard.

Chosen by measurement (docs/benchmarks/design.md): tensorstore's kvstore was slower at reading the same
ranges locally and no faster over loopback HTTP, and tensorstore does not survive `fork`
(google/tensorstore#206), which DataLoader workers use by default. The reader keeps its own per-process
state, so this class is opened lazily in each process (file descriptors and the fsspec filesystem are
dropped when pickled or forked).
"""

from __future__ import annotations

import contextlib
import os
import weakref
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

from dctdata.errors import IntegrityError
from dctdata.format.location import fsspec_options, is_url, open_regular, remote_error

MAX_OPEN_FILES = 64  # local file descriptors kept open per process (least recently used are closed)


class RangeSource:
    """Read byte ranges of files under `root` (a local directory or an fsspec URL prefix)."""

    def __init__(self, root: str, storage_options: Mapping[str, Any] | None = None) -> None:
        self.root = root
        self.storage_options = dict(storage_options or {})
        self.remote = is_url(root)
        self.requests = 0  # requests issued and bytes received by this process (for benchmarks and tests)
        self.bytes = 0
        self._pid: int | None = None
        # The local pack directory this reader opened (device, inode): every process reads files through
        # a descriptor of that directory, so a pack replaced meanwhile (pack --overwrite renames a new
        # directory into place) is noticed instead of mixing two packs' files.
        self.dir_id = None if self.remote else _dir_id(root)

    def __getstate__(self) -> dict[str, Any]:
        return {
            "root": self.root,
            "storage_options": self.storage_options,
            "remote": self.remote,
            "requests": 0,
            "bytes": 0,
            "_pid": None,
            "dir_id": self.dir_id,
        }

    def _open(self) -> None:
        if self._pid == os.getpid():
            return
        self._fds: OrderedDict[str, int] = OrderedDict()  # this process's own descriptors
        self._dir_fd = None
        if self.remote:
            import fsspec

            self._fs, self._fs_root = fsspec.core.url_to_fs(
                self.root, **fsspec_options(self.root, self.storage_options)
            )
        else:
            self._dir_fd = self._pin()
            # raw descriptors have no finalizer of their own: close them when this reader is collected (a
            # dataset reopened every epoch leaked 6-8 per open, until "Too many open files")
            self._finalizer = weakref.finalize(self, _close_fds, self._fds, self._dir_fd, os.getpid())
        self._pid = os.getpid()

    def _pin(self) -> int | None:
        """A descriptor of the pack directory this reader opened (IntegrityError if another is there now)."""
        if self.dir_id is None:  # the directory could not be read when this reader was made
            return None
        try:
            fd = os.open(self.root, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            self._replaced()
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != self.dir_id:
            os.close(fd)
            self._replaced()
        return fd

    def _replaced(self) -> NoReturn:
        raise IntegrityError(
            f"{self.root}: expected the pack this reader opened. Got another directory (or none) at that path: the "
            "pack was replaced while being read (e.g. by pack --overwrite); open it again"
        )

    def _path(self, rel: str) -> str:
        if self.remote:
            return str(self._fs_root).rstrip("/") + "/" + rel
        return os.path.join(self.root, *rel.split("/"))

    def _fd(self, rel: str) -> int:
        fd = self._fds.get(rel)
        if fd is None:
            try:  # no FIFO, device or link out of the pack; relative to the pinned directory
                if self._dir_fd is None:
                    fd = open_regular(self._path(rel), self.root)
                else:
                    fd = open_regular(os.path.join(*rel.split("/")), self.root, dir_fd=self._dir_fd)
            except FileNotFoundError:
                if _dir_id(self.root) != self.dir_id:
                    self._replaced()  # the old pack's files are being deleted: say why, not "missing"
                raise
            self._fds[rel] = fd
            while len(self._fds) > MAX_OPEN_FILES:
                os.close(self._fds.popitem(last=False)[1])
        else:
            self._fds.move_to_end(rel)
        return fd

    def size(self, rel: str) -> int:
        """Size in bytes of a stored file; FileNotFoundError when it is missing."""
        self._open()
        if self.remote:
            try:
                return int(self._fs.size(self._path(rel)))
            except Exception as exc:  # aiohttp/fsspec client errors: see remote_error
                raise remote_error(exc, self._path(rel)) from exc
        return os.fstat(self._fd(rel)).st_size

    def fetch(self, requests: Sequence[tuple[str, int, int]]) -> list[bytes | Exception]:
        """The bytes [start, stop) of each (relative path, start, stop), in order. A failed read gives
        its exception in its slot (FileNotFoundError for a missing file); a short read gives fewer
        bytes (the caller checks lengths)."""
        self._open()
        merged: list[tuple[str, int, int]] = []  # (rel, start, stop) after merging touching ranges
        where: list[tuple[int, int]] = []  # each request: (merged index, offset inside it)
        for i in sorted(range(len(requests)), key=lambda i: requests[i][:2]):
            rel, start, stop = requests[i]
            if merged and merged[-1][0] == rel and merged[-1][1] <= start <= merged[-1][2]:
                merged[-1] = (rel, merged[-1][1], max(merged[-1][2], stop))
            else:
                merged.append((rel, start, stop))
            where.append((i, len(merged) - 1))
        got = self._fetch_remote(merged) if self.remote else self._fetch_local(merged)
        self.requests += len(merged)
        self.bytes += sum(len(g) for g in got if not isinstance(g, Exception))
        out: list[bytes | Exception] = [b""] * len(requests)
        for i, m in where:
            data = got[m]
            if isinstance(data, Exception):
                out[i] = data
            else:
                rel, start, stop = requests[i]
                at = start - merged[m][1]
                out[i] = data if at == 0 and stop - start == len(data) else data[at : at + stop - start]
        return out

    def _fetch_local(self, ranges: list[tuple[str, int, int]]) -> list[bytes | Exception]:
        fds: list[int | Exception] = []
        for rel, start, stop in ranges:
            try:
                fd = self._fd(rel)
            except OSError as exc:
                fds.append(exc)
                continue
            fds.append(fd)
            if hasattr(os, "posix_fadvise") and len(ranges) > 1:
                os.posix_fadvise(fd, start, stop - start, os.POSIX_FADV_WILLNEED)
        out: list[bytes | Exception] = []
        for opened, (_, start, stop) in zip(fds, ranges):
            if isinstance(opened, Exception):
                out.append(opened)
                continue
            try:
                out.append(os.pread(opened, stop - start, start))
            except OSError as exc:
                out.append(exc)
        return out

    def _fetch_remote(self, ranges: list[tuple[str, int, int]]) -> list[bytes | Exception]:
        from dctdata.format import http

        paths = [self._path(rel) for rel, _, _ in ranges]
        starts, stops = [s for _, s, _ in ranges], [e for _, _, e in ranges]
        got: list[bytes | Exception]
        try:
            if http.is_http(self._fs):  # a 206 or an exact length, and never more than asked (`format.http`)
                got = http.cat_ranges(self._fs, paths, starts, stops)
            else:
                got = self._fs.cat_ranges(paths, starts, stops, on_error="return")
        except Exception as exc:  # a filesystem that fails the whole call: every slot fails
            got = [exc] * len(ranges)
        return [remote_error(g, p) if isinstance(g, Exception) else bytes(g) for g, p in zip(got, paths)]

    def close(self) -> None:
        """Close this process's file descriptors (also done when the reader is collected or the process
        ends); a later read opens them again."""
        if self._pid == os.getpid():
            if not self.remote:
                self._finalizer()  # closes them once (a finalizer runs at most once)
            self._dir_fd = None
            self._pid = None


def _close_fds(fds: OrderedDict[str, int], dir_fd: int | None, pid: int) -> None:
    """Close a reader's descriptors (only in the process that opened them: a fork child holds copies that
    its own exit closes)."""
    if os.getpid() != pid:
        return
    while fds:
        with contextlib.suppress(OSError):
            os.close(fds.popitem()[1])
    if dir_fd is not None:
        with contextlib.suppress(OSError):
            os.close(dir_fd)


def _dir_id(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino
