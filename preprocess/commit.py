"""Where a pack writes and how it commits: OUT checks, the temporary sibling, the final rename.

A local OUT is written into the temporary sibling `.OUT.partial` and renamed to OUT only when
everything worked (an old OUT, with `--overwrite`, is replaced only then; `--overwrite` replaces only a
dctdata pack or an empty folder, never a folder of other files typed as OUT). One pack at a time per local
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

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from typing import Any

from dctdata.errors import DctDataError
from dctdata.format import MANIFEST_NAME, Manifest, is_url, write_manifest, write_manifest_url
from dctdata.format.location import fsspec_options
from dctdata.format.manifest import FORMAT_NAME


def check_out(out: str, overwrite: bool, storage_options: Mapping[str, Any] | None) -> str:
    """OUT checked (and normalized: absolute, a symbolic link resolved) before a pack writes anything: a
    local OUT must not exist, or with --overwrite be a dctdata pack or an empty folder (`replaceable`); its
    missing parent folders are made (as `mkdir -p`). An fsspec URL prefix must not hold a manifest, or with
    --overwrite a dctdata one."""
    if not isinstance(out, (str, os.PathLike)):
        raise TypeError(f"out: expected a local directory path or an fsspec URL. Got {type(out).__name__}")
    out = os.fspath(out)
    if is_url(out):
        import fsspec

        fs, path = fsspec.core.url_to_fs(out, **fsspec_options(out, storage_options))
        loc = path.rstrip("/") + "/" + MANIFEST_NAME
        if fs.exists(loc):
            if not overwrite:
                raise DctDataError(
                    f"{out}: expected an OUT prefix without a dataset. Got an existing {MANIFEST_NAME} (use "
                    "--overwrite to replace it)"
                )
            with fs.open(loc, "rb") as fh:
                head = fh.read(MAX_OVERWRITE_MANIFEST_BYTES + 1)
            if not _is_pack_manifest(head):
                raise DctDataError(
                    f"{out}: --overwrite: expected a dctdata pack to replace. Got a {MANIFEST_NAME} that is not a "
                    "dctdata manifest (nothing was deleted; remove it yourself or choose another OUT)"
                )
        return out.rstrip("/")
    out = os.path.abspath(out.removeprefix("file://"))
    if os.path.lexists(out):
        if not overwrite:
            raise DctDataError(
                f"{out}: expected an OUT path that does not exist. Got an existing path (use --overwrite to replace it)"
            )
        what = replaceable(out)
        if what is not None:
            raise DctDataError(
                f"{out}: --overwrite: expected a dctdata pack (a folder holding a dctdata {MANIFEST_NAME}) or an empty "
                f"folder to replace. Got {what} (nothing was deleted; remove it yourself or choose another OUT)"
            )
    if os.path.islink(out):  # pack where it points (module docstring)
        out = os.path.realpath(out)
    parent = os.path.dirname(out)
    if not os.path.isdir(parent):
        if os.path.lexists(parent) or any(os.path.isfile(p) for p in _ancestors(parent)):
            raise DctDataError(f"{out}: expected an existing parent directory. Got a file in the way at {parent}")
        try:
            os.makedirs(parent, exist_ok=True)  # OUT's missing parents, as mkdir -p
        except OSError as exc:
            raise unwritable(out, exc) from None
    return out


# The most of an old manifest --overwrite reads to see that it is a dctdata one (readers open at most
# MAX_MANIFEST_BYTES; only its first key matters here, and a JSON parse needs the whole text).
MAX_OVERWRITE_MANIFEST_BYTES = 64 << 20


def _is_pack_manifest(raw: bytes) -> bool:
    if len(raw) > MAX_OVERWRITE_MANIFEST_BYTES:
        return False
    try:
        d = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return False
    return isinstance(d, dict) and d.get("format") == FORMAT_NAME


def replaceable(out: str) -> str | None:
    """None when `--overwrite` may replace the local path OUT (following a symbolic link): a folder holding
    a dctdata manifest (any version; its data files need not be intact), or an empty folder. Otherwise what
    is there instead, for the error: --overwrite must never delete a results folder typed as OUT."""
    target = os.path.realpath(out)
    if not os.path.isdir(target):
        return "a file" if os.path.exists(target) else "a broken symbolic link"
    try:
        names = os.listdir(target)
    except OSError as exc:
        return f"a folder that cannot be listed ({exc.strerror})"
    if not names:
        return None
    manifest = os.path.join(target, MANIFEST_NAME)
    if not os.path.isfile(manifest):
        return f"a folder of {len(names)} entr{'y' if len(names) == 1 else 'ies'} without a {MANIFEST_NAME}"
    try:
        with open(manifest, "rb") as fh:
            head = fh.read(MAX_OVERWRITE_MANIFEST_BYTES + 1)
    except OSError as exc:
        return f"a {MANIFEST_NAME} that cannot be read ({exc.strerror})"
    if not _is_pack_manifest(head):
        return f"a folder whose {MANIFEST_NAME} is not a dctdata manifest"
    return None


def unwritable(out: str, exc: OSError) -> DctDataError:
    """The error for an OUT whose folder cannot be written (a missing parent that cannot be made, a read-only
    or virtual file system): it names OUT and the folder, not the lock or partial file a pack tried first."""
    reason = exc.strerror or type(exc).__name__
    return DctDataError(
        f"{out}: expected an OUT whose folder {os.path.dirname(out)} can be written. Got {reason} when creating a "
        "file there (choose another OUT)"
    )


def lock_path(out: str) -> str:
    return os.path.join(os.path.dirname(out), f".{os.path.basename(out)}.lock")


class OutLock:
    """An exclusive lock on a local OUT for one pack (module docstring). Released by `release()`; the
    lock file is removed then (a holder checks after locking that the file it locked is still the one at
    the path, so removing it cannot let two packs in)."""

    def __init__(self, out: str) -> None:
        self.out, self.path, self._fd = out, lock_path(out), None

    def acquire(self) -> OutLock:
        try:
            import fcntl
        except ImportError:  # pragma: no cover - no flock (Windows): packs are not serialized there
            return self
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            except OSError as exc:  # OUT's folder is read-only or virtual (/proc): say OUT, not the lock file
                raise unwritable(self.out, exc) from None
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
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        os.close(self._fd)
        self._fd = None

    def __del__(self) -> None:  # a Writer dropped without close() must not keep OUT locked
        with contextlib.suppress(Exception):  # at interpreter exit module globals may be gone; the kernel unlocks
            self.release()

    def __enter__(self) -> OutLock:
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
