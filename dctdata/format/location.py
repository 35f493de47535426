"""Where a packed dataset lives: a local directory or a URL prefix (fsspec), and the paths inside it.

Paths a manifest names are checked here (`check_relative_path`), so nothing a manifest says can point
outside its dataset; every reader and writer opens files through `open_file`.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

MANIFEST_NAME = "manifest.json"


def is_url(path_or_url: object) -> bool:
    return isinstance(path_or_url, str) and "://" in path_or_url and not path_or_url.startswith("file://")


def join(root: str | os.PathLike, *parts: str) -> str:
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
    if not parts or any(p in ("", ".", "..") or "\\" in p or ":" in p or "\x00" in p for p in parts):
        raise FormatError(
            f"{where}: expected a relative path inside the dataset ('/'-separated names, no '..', no absolute path). "
            f"Got {path!r}"
        )
    return path


def manifest_location(path_or_url: str | os.PathLike) -> tuple[str, str]:
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


def open_file(
    path_or_url: str, mode: str = "rb", storage_options: Mapping[str, Any] | None = None, streaming: bool = False
):
    """Open a local file or an fsspec URL. `streaming=True` reads http(s) bodies sequentially instead of
    issuing a range request per block."""
    if is_url(path_or_url):
        import fsspec

        options = dict(storage_options or {})
        if streaming and path_or_url.startswith(("http://", "https://")):
            options = {"block_size": 0, **options}
        return fsspec.open(path_or_url, mode, **options).open()
    return open(path_or_url, mode)
