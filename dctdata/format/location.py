"""Where a packed dataset lives: a local directory or a URL prefix (fsspec), and the paths inside it.

Paths a manifest names are checked here (`check_relative_path`), so nothing a manifest says can point
outside its dataset; every reader and writer opens files through `open_file`.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Mapping
from typing import Any, TypeGuard

from dctdata.format.http import RemoteError

MANIFEST_NAME = "manifest.json"


def is_url(path_or_url: object) -> bool:
    return isinstance(path_or_url, str) and "://" in path_or_url and not path_or_url.startswith("file://")


def join(root: str | os.PathLike[str], *parts: str) -> str:
    """Join a dataset root (local path or URL prefix) with relative parts, using '/' for URLs."""
    root = os.fspath(root)
    if is_url(root):
        return "/".join([root.rstrip("/"), *parts])
    return os.path.join(root, *parts)


def check_relative_path(where: str, path: object) -> str:
    """A stored file's path relative to the dataset root: '/'-separated plain names, never absolute,
    never '..' or '.', no backslashes or drive letters, so nothing a manifest names lies outside it."""
    from dctdata.errors import FormatError

    parts = path.split("/") if isinstance(path, str) else []
    if (
        not isinstance(path, str)
        or not parts
        or any(p in ("", ".", "..") or "\\" in p or ":" in p or "\x00" in p for p in parts)
    ):
        raise FormatError(
            f"{where}: expected a relative path inside the dataset ('/'-separated names, no '..', no absolute path). "
            f"Got {path!r}"
        )
    return path


def manifest_location(path_or_url: str | os.PathLike[str]) -> tuple[str, str]:
    """(dataset root, manifest path/URL): accepts the dataset root or its manifest.json."""
    if not isinstance(path_or_url, (str, os.PathLike)):
        raise TypeError(f"path_or_url: expected a path or URL string. Got {type(path_or_url).__name__}")
    s = os.fspath(path_or_url)
    if s.startswith("file://"):
        s = s[len("file://") :]
    if s.rstrip("/").endswith("/" + MANIFEST_NAME) or s == MANIFEST_NAME:
        root = s.rstrip("/")[: -len(MANIFEST_NAME)].rstrip("/") or "."
        return root, s
    return s, join(s, MANIFEST_NAME)


def check_location(path_or_url: str | os.PathLike[str], allow_pipe: bool) -> str:
    """A dataset location; a shell `pipe:` URL only when the caller opts in."""
    if not isinstance(path_or_url, (str, os.PathLike)):
        raise TypeError(f"path_or_url: expected a path or URL string. Got {type(path_or_url).__name__}")
    s = os.fspath(path_or_url)
    if s.startswith("pipe:"):
        if not allow_pipe:
            raise _error(
                f"{s}: expected a local path or an http(s)/fsspec URL. Got a shell 'pipe:' URL, which runs a command "
                "(pass allow_pipe=True to opt in)"
            )
        if "{}" not in s:
            raise _error(f"{s}: expected a pipe: command with '{{}}' where the file name goes. Got none")
    return s


def _is_path(value: object) -> TypeGuard[str | os.PathLike[str]]:
    return isinstance(value, (str, os.PathLike))


def shard_selection(path_or_url: object) -> tuple[str, tuple[str, ...] | None]:
    """(dataset root, shard file names or None for all shards) of what a user points a loader at: the
    pack's directory or URL, its manifest.json, or - as webdataset users do - a list of its shard
    files or a brace expression of them (`.../shard-{000000..000015}.tar`, expanded with
    `braceexpand`, webdataset's own). The shards must sit in one directory, beside the manifest."""
    if isinstance(path_or_url, (list, tuple)):
        items = [os.fspath(p) if _is_path(p) else p for p in path_or_url]
        if not items:
            raise _error("shards: expected at least one shard file. Got an empty list")
        bad = [p for p in items if not isinstance(p, str)]
        if bad:
            raise TypeError(f"shards: expected path or URL strings. Got {type(bad[0]).__name__}")
    elif _is_path(path_or_url):
        s = os.fspath(path_or_url)
        if "{" not in s and not s.rstrip("/").endswith(".tar"):
            return manifest_location(s)[0], None
        from braceexpand import braceexpand

        try:
            items = list(braceexpand(s))
        except Exception as exc:  # braceexpand raises on malformed ranges
            raise _error(f"{s}: expected a brace expression of shard files. Got {type(exc).__name__}: {exc}") from exc
    else:
        raise TypeError(f"path_or_url: expected a path or URL string, or a list of shard files. Got "
                        f"{type(path_or_url).__name__}")  # fmt: skip
    roots, names = [], []
    for item in items:
        s = item[len("file://") :] if item.startswith("file://") else item
        root, _, name = s.rpartition("/") if is_url(s) else (os.path.dirname(s) or ".", "", os.path.basename(s))
        if not name.endswith(".tar"):
            raise _error(f"{item}: expected a '.tar' shard file of a webdataset pack. Got another name")
        roots.append(root)
        if name not in names:
            names.append(name)
    if len(set(roots)) != 1:
        raise _error(
            f"shards: expected shard files of one pack (one directory, beside its manifest.json). Got files in "
            f"{sorted(set(roots))[:2]}"
        )
    return roots[0], tuple(names)


def _error(message: str) -> Exception:
    from dctdata.errors import DctDataError

    return DctDataError(message)


class SpecialFileError(OSError):
    """A pack's file that is not a regular file inside the pack (FIFO, device, socket, a link out of it)."""


_KINDS = {stat.S_IFIFO: "FIFO", stat.S_IFCHR: "character device", stat.S_IFBLK: "block device", stat.S_IFSOCK: "socket"}


def open_regular(path: str, root: str | None = None, dir_fd: int | None = None) -> int:
    """A read-only descriptor of a pack's local file: a regular file only (a FIFO blocks a reader forever,
    /dev/zero never ends), opened without blocking so a FIFO cannot hang the open itself; given the pack's
    `root`, one that resolves inside it (a symlink may not lead out of the pack). With `dir_fd`, `path`
    is relative to that open directory (the pack a reader pinned) and `root` names it."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_BINARY", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags, dir_fd=dir_fd)
    if dir_fd is not None and root is not None:  # a reader that pins its pack's directory names it
        path = os.path.join(root, path)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = _KINDS.get(stat.S_IFMT(mode), "directory" if stat.S_ISDIR(mode) else "special file")
            raise SpecialFileError(f"{path}: expected a regular file. Got a {kind}")
        real = os.path.realpath(path) if root is not None else None
        if (
            real is not None
            and root is not None
            and not real.startswith(os.path.realpath(root).rstrip(os.sep) + os.sep)
        ):
            raise SpecialFileError(f"{path}: expected a file inside the pack. Got a link to {real}")
    except BaseException:
        os.close(fd)
        raise
    return fd


# Remote reads: timeouts, and honest errors ----------------------------------------------------------
# Seconds an http(s) read may wait for a connection or for the next bytes of a body (aiohttp's default is
# 300 s per request, and fsspec reports its expiry as "no such file"). storage_options={"timeout": s}
# sets it per dataset (None: no limit), or an explicit client_kwargs={"timeout": aiohttp.ClientTimeout}.
DEFAULT_HTTP_TIMEOUT = 60.0
# An idle timeout alone lets a server that drips a byte a second hold a reader for days: every request
# also has a total deadline, headers and body (storage_options={"deadline": s}; None: none), by default
# this many times the idle timeout (300 s at the default 60 s: a 256 MiB webdataset shard then needs about
# 1 MB/s; a slower link sets a longer deadline).
DEADLINE_TIMEOUTS = 5


def fsspec_options(url: str, storage_options: Mapping[str, Any] | None) -> dict[str, Any]:
    """fsspec keyword arguments for `url`: the caller's storage_options with dctdata's `timeout` and
    `deadline` turned into aiohttp's read, connect and total timeouts for http(s) URLs."""
    options = dict(storage_options or {})
    timeout = options.pop("timeout", DEFAULT_HTTP_TIMEOUT)
    deadline = options.pop("deadline", "auto")
    if not str(url).startswith(("http://", "https://")):
        return options
    for name, value in (("timeout", timeout), ("deadline", None if deadline == "auto" else deadline)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
            raise _error(f"storage_options[{name!r}]: expected seconds > 0 or None. Got {value!r}")
    if deadline == "auto":
        deadline = None if timeout is None else DEADLINE_TIMEOUTS * timeout
    client = dict(options.get("client_kwargs") or {})
    if "timeout" not in client:
        import aiohttp

        client["timeout"] = aiohttp.ClientTimeout(total=deadline, sock_connect=timeout, sock_read=timeout)
        options["client_kwargs"] = client
    return options


def remote_error(exc: Exception, url: str) -> Exception:
    """The exception to raise for a failed remote read of `url`: a real "not found" stays
    FileNotFoundError; anything else (fsspec reports HTTP 500s and timeouts as FileNotFoundError, aiohttp
    raises ClientPayloadError for a short body) becomes a RemoteError saying what happened."""
    cause: BaseException | None = exc
    if isinstance(exc, FileNotFoundError):
        cause = exc.__cause__
        hidden = cause is not None and (
            isinstance(cause, TimeoutError)
            or getattr(cause, "status", None) not in (None, 404)
            or type(cause).__module__.split(".")[0] == "aiohttp"
        )
        if not hidden:  # a real "not found" (HTTP 404, memory:// KeyError, a missing local file)
            return exc
    if getattr(cause, "status", None) == 404:
        return FileNotFoundError(url)
    if isinstance(exc, RemoteError):
        return exc
    text = str(cause) or type(cause).__name__
    if isinstance(cause, TimeoutError):
        text = (
            f"no answer in time ({text}; storage_options={{'timeout': seconds}} sets the idle limit, "
            "{'deadline': seconds} the total per request)"
        )
    return RemoteError(f"{url}: {type(cause).__name__}: {text}")


class _RemoteFile:
    """A file object from fsspec whose read errors come out as `remote_error` says (never aiohttp's own
    exceptions, which are not OSError)."""

    def __init__(self, fh: Any, url: str) -> None:  # an fsspec file or an HTTPStream
        self._fh, self._url = fh, url

    def read(self, n: int = -1) -> bytes:
        try:
            data: bytes = self._fh.read(n)
            return data
        except Exception as exc:  # aiohttp/fsspec client errors of every kind
            raise remote_error(exc, self._url) from exc

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fh, name)

    def __enter__(self) -> _RemoteFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self._fh.close()


def open_file(
    path_or_url: str,
    mode: str = "rb",
    storage_options: Mapping[str, Any] | None = None,
    streaming: bool = False,
    root: str | None = None,
) -> Any:  # a file object: local, fsspec's, or a _RemoteFile
    """Open a local file or an fsspec URL. `streaming=True` reads http(s) bodies sequentially instead of
    issuing a range request per block. A local file opened for reading must be a regular file (inside
    `root`, when given: `open_regular`)."""
    if is_url(path_or_url):
        import fsspec

        options = fsspec_options(path_or_url, storage_options)
        if streaming and path_or_url.startswith(("http://", "https://")):
            options = {"block_size": 0, **options}
        if "r" not in mode:
            return fsspec.open(path_or_url, mode, **options).open()
        try:
            if path_or_url.startswith(("http://", "https://")) and mode == "rb":  # read as far as asked only
                from dctdata.format.http import HTTPStream

                fs, path = fsspec.core.url_to_fs(path_or_url, **options)
                return _RemoteFile(HTTPStream(fs, path), path_or_url)
            return _RemoteFile(fsspec.open(path_or_url, mode, **options).open(), path_or_url)
        except Exception as exc:  # as _RemoteFile.read
            raise remote_error(exc, path_or_url) from exc
    if mode in ("r", "rb"):
        return os.fdopen(open_regular(path_or_url, root), mode)
    return open(path_or_url, mode)


def remove_file(path_or_url: str, storage_options: Mapping[str, Any] | None = None) -> None:
    """Remove a local file or an fsspec URL's object; one that is already gone is fine (a rerun)."""
    if is_url(path_or_url):
        import fsspec

        fs, path = fsspec.core.url_to_fs(path_or_url, **fsspec_options(path_or_url, storage_options))
        with contextlib.suppress(FileNotFoundError):
            fs.rm_file(path)
        return
    with contextlib.suppress(FileNotFoundError):
        os.remove(path_or_url)
