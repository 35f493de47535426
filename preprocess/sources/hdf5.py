"""HDF5 files: each dataset one field (nested names joined with `_`); `key=` picks some.

An HDF5 file can make its reader open other files: a dataset's raw data may live in external files
(`external=[("/abs/path", offset, size)]`), a virtual dataset maps other files' datasets, and an external
link names a dataset in another file. Packing someone else's HDF5 file would then copy, say, the packer's
private keys into the pack (or block forever on a FIFO). So the datasets a pack reads must keep their data
inside the file unless the user opts in (`allow_external=True`, `--allow-external`): checked before any
data is read.
"""

from __future__ import annotations

from typing import Any

from dctdata.errors import DctDataError
from dctdata.preprocess.sources.arrays import ArraySource
from dctdata.preprocess.sources.base import field_name

HDF5_SUFFIXES = (".h5", ".hdf5", ".hdf", ".he5")
OPT_IN = "--allow-external (Python: allow_external=True)"


# HDF5 --------------------------------------------------------------------------------------------
def hdf5_source(path: str, key: str | list[str] | None = None, allow_external: bool = False) -> ArraySource:
    import h5py

    try:
        fh = h5py.File(path, "r")
    except OSError as exc:
        raise DctDataError(f"{path}: expected a readable HDF5 file. Got {exc}") from exc
    try:
        return _source(fh, path, key, allow_external)
    except BaseException:
        fh.close()
        raise


def _source(fh, path: str, key, allow_external: bool) -> ArraySource:
    import h5py

    found: dict[str, Any] = {}

    def collect(name, obj):  # must return None: h5py stops visiting on any other value
        if isinstance(obj, h5py.Dataset):
            found[name] = obj

    fh.visititems(collect)  # objects reached through hard links: never another file
    external: dict[str, h5py.ExternalLink] = {}

    def links(name):
        link = fh.get(name, getlink=True)
        if isinstance(link, h5py.ExternalLink):
            external[name] = link

    fh.visit_links(links)
    keys = [k.strip("/") for part in ([key] if isinstance(key, str) else key or []) for k in part.split(",") if k]
    wanted = keys or list(found) + list(external)
    for name in [k for k in wanted if k in external]:
        link = external[name]
        if not allow_external:
            raise _outside(path, name, f"an external link to {link.filename}:{link.path}")
        obj = fh[name]
        if isinstance(obj, h5py.Dataset):
            found[name] = obj
        elif isinstance(obj, h5py.Group):
            obj.visititems(lambda sub, o, at=name: collect(f"{at}/{sub}", o))
    if keys:
        missing = [k for k in keys if k not in found]
        if missing:
            raise DctDataError(f"{path}: --key {missing[0]!r}: expected one of {sorted(found)}. Got no such dataset")
        found = {k: found[k] for k in keys}
    if not found:
        raise DctDataError(f"{path}: expected at least one HDF5 dataset. Got none")
    arrays = {}
    for name, ds in found.items():
        if ds.dtype.hasobject or ds.dtype.kind in "OUSVMm":
            raise DctDataError(
                f"{path}[{name}]: expected a numeric dataset. Got dtype {ds.dtype} (use --key to pick datasets)"
            )
        if not allow_external:
            _check_inside(path, name, ds)
        arrays[field_name(name)] = ds
    return ArraySource(path, arrays, owner=fh)


def is_hdf5_file(path: str) -> bool:
    """Whether a local file is HDF5 (NetCDF-4 files are): its signature at offset 0 (a user block may move it
    to 512, 1024, ...; h5py finds it there, and so does this)."""
    try:
        with open(path, "rb") as fh:
            for at in (0, 512, 1024, 2048, 4096):
                fh.seek(at)
                if fh.read(8) == b"\x89HDF\r\n\x1a\n":
                    return True
    except OSError:
        return False
    return False


def check_hdf5_inside(path: str) -> None:
    """Refuse an HDF5 file (a NetCDF-4 file opened through xarray) with any dataset whose data lies outside
    it, or an external link (what `hdf5_source` refuses for the datasets it reads)."""
    import h5py

    try:
        fh = h5py.File(path, "r")
    except OSError:
        return  # not for h5py: the reader that opens it names the problem
    with fh:
        datasets: dict[str, Any] = {}

        def collect(name, obj):  # must return None: h5py stops visiting on any other value
            if isinstance(obj, h5py.Dataset):
                datasets[name] = obj

        fh.visititems(collect)
        for name, ds in datasets.items():
            _check_inside(path, name, ds)

        def links(name):
            link = fh.get(name, getlink=True)
            if isinstance(link, h5py.ExternalLink):
                raise _outside(path, name, f"an external link to {link.filename}:{link.path}")

        fh.visit_links(links)


def _check_inside(path: str, name: str, ds) -> None:
    """A dataset whose raw data lives in the file itself: no external storage, no virtual dataset mapping
    another file."""
    if ds.external:
        files = sorted({str(e[0]) for e in ds.external})
        more = f" and {len(files) - 1} more" if files[1:] else ""
        raise _outside(path, name, f"external storage in {files[0]}{more}")
    if ds.is_virtual:
        others = sorted({s.file_name for s in ds.virtual_sources() if s.file_name != "."})
        if others:
            raise _outside(path, name, f"a virtual dataset mapping {others[0]}")


def _outside(path: str, name: str, what: str) -> DctDataError:
    return DctDataError(
        f"{path}[{name}]: expected data stored inside the HDF5 file. Got {what} (an HDF5 file can make a pack read "
        f"other local files: pass {OPT_IN} only for a file you trust)"
    )
