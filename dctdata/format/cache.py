"""A bounded local disk cache of remote shard files, opt-in by a path (`cache_dir=`).

LitData and MosaicML Streaming keep remote shards on local disk so the second epoch does not download
them again; this is that, for dctdata's whole-file reads of webdataset shards.

- **Content-addressed.** A shard is stored as `<cache_dir>/<sha256>.tar`, the sha256 its manifest
  records, so packs and URLs that share a shard share one copy, and a changed pack can never be served
  a stale file under an old name.
- **Checked on reuse.** A cached copy is opened as the pack's own files are (`location.open_regular`: a
  regular file inside the cache; a FIFO, device, directory or link out of it is skipped, never blocks),
  its size compared (fstat) before anything is read, then read whole and hashed; one whose sha256 no
  longer matches its name (bit rot, truncation, a hand edit) is deleted, logged and fetched again. A copy
  whose size differs from what a manifest claims but whose bytes still hash to its name is another
  pack's good shard and a lying manifest: it is kept (that manifest's read then fails on its own).
- **Bounded (LRU).** After each new file, the least recently used files (modification time, refreshed
  on every hit) are deleted until the cache holds at most `limit` bytes.
- **Safe to share.** DataLoader workers and ranks on one machine may share a directory: files are
  written to a temporary name and renamed into place, so a reader sees a whole file or none.
- **Errors.** A directory that cannot be created or written, a disk without room for the largest
  shard, or a write that runs out of space raises one `DctDataError` naming the directory.

Written by hand: fsspec's `filecache::` has no size bound and no content check, and the cache has to
sit under the sha256 check every shard read already does.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import shutil
import tempfile
from typing import IO

from dctdata.errors import DctDataError
from dctdata.format.atomic import create_exclusive
from dctdata.format.checksum import read_expected
from dctdata.format.location import open_regular
from dctdata.parse import parse_size

log = logging.getLogger(__name__)

DEFAULT_CACHE_LIMIT = 50 << 30
SUFFIX = ".tar"


class ShardCache:
    """Shard bytes by sha256 in a local directory of at most `limit` bytes (see the module docstring)."""

    def __init__(
        self, directory: str | os.PathLike[str], limit: int | str = DEFAULT_CACHE_LIMIT, largest: int = 0
    ) -> None:
        if not isinstance(directory, (str, os.PathLike)):
            raise TypeError(f"cache_dir: expected a local directory path. Got {type(directory).__name__}")
        self.directory = os.path.abspath(os.fspath(directory))
        self.limit = parse_size(limit, "cache_limit", minimum=1, type_error=DctDataError)
        if largest > self.limit:
            raise DctDataError(
                f"cache_limit: expected at least the largest shard ({largest} bytes) so a shard fits. Got {self.limit}"
            )
        try:
            os.makedirs(self.directory, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=self.directory, prefix=".probe-"):
                pass
            free = shutil.disk_usage(self.directory).free
        except OSError as exc:
            raise DctDataError(
                f"cache_dir {self.directory}: expected a writable directory. Got {type(exc).__name__}: "
                f"{exc.strerror or exc}"
            ) from exc
        if free < largest:
            raise DctDataError(
                f"cache_dir {self.directory}: expected room for the largest shard ({largest} bytes). Got {free} bytes "
                "free (cache is full: free space or choose another cache_dir)"
            )

    def __repr__(self) -> str:
        return f"ShardCache({self.directory!r}, limit={self.limit})"

    def path(self, sha256: str) -> str:
        return os.path.join(self.directory, sha256 + SUFFIX)

    def get(self, sha256: str, size: int) -> bytes | None:
        """The cached bytes of the shard with this sha256 and size, or None (a bad copy is dropped; see the
        module docstring)."""
        path = self.path(sha256)
        try:
            fh = os.fdopen(open_regular(path, self.directory), "rb")
        except FileNotFoundError:
            return None
        except OSError as exc:  # a FIFO, a directory, a link out of the cache, permissions: not an entry of ours
            log.warning("cache: cannot use %s (%s): reading the shard from the pack", path, exc)
            return None
        with fh:
            actual = os.fstat(fh.fileno()).st_size
            if actual != size:  # never read (or allocate) what a manifest claims: the file says its own size
                good = self._hashes_to_name(fh, sha256, actual)
                log.warning(
                    "cache: %s holds %d bytes, not the %d its manifest claims%s", path, actual, size,
                    ": kept (its bytes match its sha256; the manifest is wrong)" if good else ": fetching it again",
                )  # fmt: skip
                if not good:
                    self._remove(path)
                return None
            try:
                data, digest = read_expected(fh, size)
            except OSError as exc:
                log.warning("cache: cannot read %s (%s): fetching it again", path, exc)
                return None
        if len(data) != size or digest != sha256:
            log.warning("cache: %s fails its size or sha256 check: fetching it again", path)
            self._remove(path)
            return None
        try:
            os.utime(path)  # most recently used
        except OSError:  # evicted by another worker meanwhile: the bytes read are still good
            pass
        return data

    @staticmethod
    def _hashes_to_name(fh: IO[bytes], sha256: str, actual: int) -> bool:
        """Whether an open cache file's own bytes (read in blocks, never whole) hash to its name."""
        h, left = hashlib.sha256(), actual
        try:
            while left > 0 and (block := fh.read(min(left, 4 << 20))):
                h.update(block)
                left -= len(block)
        except OSError:
            return False
        return h.hexdigest() == sha256

    def put(self, sha256: str, data: bytes) -> None:
        """Store checked shard bytes, then evict least recently used files down to the limit."""
        path = self.path(sha256)
        tmp = None
        try:
            fd, tmp = create_exclusive(self.directory, "part")
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            if os.path.isdir(path):  # not an entry of ours in the way: leave it, cache nothing
                log.warning("cache: %s is a directory: not caching the shard", path)
                return
            os.replace(tmp, path)
            tmp = None
        except OSError as exc:
            full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
            raise DctDataError(
                f"cache_dir {self.directory}: expected room to write {os.path.basename(path)} ({len(data)} bytes). "
                f"Got {type(exc).__name__}: {exc.strerror or exc}" + (" (cache disk is full)" if full else "")
            ) from exc
        finally:
            if tmp is not None:
                self._remove(tmp)
        self._evict(keep=path)

    def _evict(self, keep: str) -> None:
        entries = []
        with os.scandir(self.directory) as it:
            for e in it:
                if e.name.endswith(SUFFIX) and not e.name.startswith("."):
                    try:
                        if not e.is_file(follow_symlinks=False):
                            continue  # only the regular files the cache wrote count and are evicted
                        st = e.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        continue
                    entries.append((st.st_mtime, e.path, st.st_size))
        total = sum(size for _, _, size in entries)
        for _, path, size in sorted(entries):
            if total <= self.limit:
                break
            if path != keep:
                self._remove(path)
                total -= size

    @staticmethod
    def _remove(path: str) -> None:
        try:
            os.remove(path)
        except FileNotFoundError:
            pass
        except OSError as exc:  # not ours to remove (another user's file in a shared cache, a directory)
            log.warning("cache: cannot remove %s (%s)", path, exc)
