"""Where a pack writes and how it commits: OUT checks, the temporary sibling, the final rename.

A local OUT is written into the temporary sibling `.OUT.partial` and renamed to OUT only when
everything worked (an old OUT, with `--overwrite`, is replaced only then). One pack at a time per local
OUT: the writer holds an exclusive `flock` on the sibling `.OUT.lock` from its OUT checks to its commit,
so a second pack into the same OUT is refused instead of deleting the first's partial directory (the
kernel drops the lock when a pack dies, even by kill -9: no stale locks). An fsspec URL OUT has no
rename: data files are written in place and the manifest, written last, is the commit (readers refuse
a prefix without one; `--overwrite` deletes the old manifest first). Shared by `pack` and `Writer`.

An OUT that is a symbolic link (`train.dct -> /big/disk/train.dct`) is packed where it points: with
`--overwrite` the link's target is replaced atomically (the new pack is written beside the target and
renamed over it) and the link stays, now naming the new pack. Replacing the link itself by a directory
would leave the old pack at the target and break whatever else follows the link.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from typing import Any, Callable, Mapping

from dctdata.errors import DctDataError
from dctdata.format import MANIFEST_NAME, Manifest, is_url, write_manifest, write_manifest_url
from dctdata.format.location import fsspec_options


def check_out(out: str, overwrite: bool, storage_options: Mapping[str, Any] | None) -> str:
    if not isinstance(out, (str, os.PathLike)):
        raise TypeError(f"out: expected a local directory path or an fsspec URL. Got {type(out).__name__}")
    out = os.fspath(out)
    if is_url(out):
        import fsspec

        fs, path = fsspec.core.url_to_fs(out, **fsspec_options(out, storage_options))
        if fs.exists(path.rstrip("/") + "/" + MANIFEST_NAME) and not overwrite:
            raise DctDataError(
                f"{out}: expected an OUT prefix without a dataset. Got an existing {MANIFEST_NAME} (use --overwrite to "
                "replace it)"
            )
        return out.rstrip("/")
    out = os.path.abspath(out.removeprefix("file://"))
    if os.path.lexists(out) and not overwrite:
        raise DctDataError(
            f"{out}: expected an OUT path that does not exist. Got an existing path (use --overwrite to replace it)"
        )
    if os.path.islink(out):  # pack where it points (module docstring)
        out = os.path.realpath(out)
    parent = os.path.dirname(out)
    if not os.path.isdir(parent):
        got = (
            "a file in the way"
            if os.path.lexists(parent) or any(os.path.isfile(p) for p in _ancestors(parent))
            else "a missing directory"
        )
        raise DctDataError(f"{out}: expected an existing parent directory. Got {got} at {parent}")
    return out


def lock_path(out: str) -> str:
    return os.path.join(os.path.dirname(out), f".{os.path.basename(out)}.lock")


class OutLock:
    """An exclusive lock on a local OUT for one pack (module docstring). Released by `release()`; the
    lock file is removed then (a holder checks after locking that the file it locked is still the one at
    the path, so removing it cannot let two packs in)."""

    def __init__(self, out: str) -> None:
        self.out, self.path, self._fd = out, lock_path(out), None

    def acquire(self) -> "OutLock":
        try:
            import fcntl
        except ImportError:  # pragma: no cover - no flock (Windows): packs are not serialized there
            return self
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise DctDataError(
                    f"{self.out}: expected no other pack writing here. Got a lock held on {self.path} (another "
                    "dctdata pack or Writer is writing this OUT: wait for it to finish, or choose another OUT)"
                ) from None
            try:
                st, held = os.stat(self.path, follow_symlinks=False), os.fstat(fd)
                same = (st.st_dev, st.st_ino) == (held.st_dev, held.st_ino)
            except FileNotFoundError:
                same = False
            if same:
                self._fd = fd
                return self
            os.close(fd)  # the previous holder removed it after we opened it: lock the new file

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        os.close(self._fd)
        self._fd = None

    def __del__(self) -> None:  # a Writer dropped without close() must not keep OUT locked
        try:
            self.release()
        except Exception:  # noqa: BLE001 - at interpreter exit module globals may be gone; the kernel unlocks
            pass

    def __enter__(self) -> "OutLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def lock_out(out: str, overwrite: bool, storage_options: Mapping[str, Any] | None = None) -> OutLock | None:
    """Lock a local OUT (None for a URL: object stores have no locks) and check it again under the lock
    (another pack may have committed it since `check_out`)."""
    if is_url(out):
        return None
    lock = OutLock(out).acquire()
    try:
        check_out(out, overwrite, storage_options)
    except BaseException:
        lock.release()
        raise
    return lock


def _ancestors(path: str) -> list[str]:
    out = []
    while os.path.dirname(path) != path:
        path = os.path.dirname(path)
        out.append(path)
    return out


def check_not_source(source: object, out: str) -> None:
    """Refuse an OUT that is the source or contains it: --overwrite would delete the data being packed."""
    if not isinstance(source, (str, os.PathLike)) or is_url(out) or not os.path.exists(os.fspath(source)):
        return
    src, dst = os.path.realpath(os.fspath(source)), os.path.realpath(out)
    if src == dst or src.startswith(dst.rstrip(os.sep) + os.sep):
        raise DctDataError(
            f"{out}: expected an OUT path outside the source. Got the source {os.fspath(source)} itself or a directory "
            "holding it"
        )


def partial_dir(out: str) -> str:
    """The temporary sibling a local pack writes into (fixed name, so --resume finds it)."""
    return os.path.join(os.path.dirname(out), f".{os.path.basename(out)}.partial")


def remove_manifest(out: str, storage_options: Mapping[str, Any]) -> None:
    import fsspec

    fs, path = fsspec.core.url_to_fs(out, **fsspec_options(out, storage_options))
    loc = path.rstrip("/") + "/" + MANIFEST_NAME
    if fs.exists(loc):
        fs.rm(loc)


def rename_into_place(tmp: str, out: str) -> None:
    """Rename the finished temporary directory to OUT (replacing an old OUT only now)."""
    old = None
    if os.path.lexists(out):
        # a short fixed prefix: OUT's own name may already be near the 255-byte limit
        old = tempfile.mkdtemp(prefix=".dctdata-old-", dir=os.path.dirname(out))
        os.replace(out, os.path.join(old, "d"))
    os.replace(tmp, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def commit(
    manifest: Manifest,
    root: str,
    out: str,
    storage_options: Mapping[str, Any] | None = None,
    before_rename: Callable[[], None] | None = None,
) -> None:
    """Write the manifest last: into `root` then rename it to OUT (local), or under the URL prefix.
    `before_rename` runs between the two (the journal goes then: a crash before it leaves a resumable
    journal, a crash after it a finished `root` that `--resume` renames: `finished_partial`)."""
    if is_url(out):
        write_manifest_url(manifest, out, storage_options)  # the commit on an object store
    else:
        write_manifest(manifest, root)
        if before_rename is not None:
            before_rename()
        rename_into_place(root, out)


def finished_partial(root: str, record: Mapping[str, Any]) -> Manifest | None:
    """The manifest of a temporary directory whose pack finished but was stopped before its rename (it
    has a manifest; the journal is gone), or None when it has none. A manifest of other settings is
    refused, as a journal of other settings is."""
    from dctdata.format import read_manifest

    if not os.path.isfile(os.path.join(root, MANIFEST_NAME)):
        return None
    manifest = read_manifest(root)
    record = json.loads(json.dumps(dict(record)))  # as the manifest stores it (lists, not tuples)
    diff = sorted(k for k, v in record.items() if k in manifest.pack and manifest.pack[k] != v)
    if diff:
        raise DctDataError(
            f"{root}: --resume: expected the settings of the interrupted pack. Got different {', '.join(diff)} (run "
            "without --resume to start over)"
        )
    return manifest
