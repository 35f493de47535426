"""HDF5 files: each dataset one field (nested names joined with `_`); `key=` picks some."""

from __future__ import annotations

from typing import Any

from dctdata.errors import DctDataError
from dctdata.preprocess.sources.arrays import ArraySource
from dctdata.preprocess.sources.base import field_name

HDF5_SUFFIXES = (".h5", ".hdf5", ".hdf", ".he5")


# HDF5 --------------------------------------------------------------------------------------------
def hdf5_source(path: str, key: str | list[str] | None = None) -> ArraySource:
    import h5py

    try:
        fh = h5py.File(path, "r")
    except OSError as exc:
        raise DctDataError(f"{path}: expected a readable HDF5 file. Got {exc}") from exc
    found: dict[str, Any] = {}

    def collect(name, obj):  # must return None: h5py stops visiting on any other value
        if isinstance(obj, h5py.Dataset):
            found[name] = obj

    fh.visititems(collect)
    keys = [k for part in ([key] if isinstance(key, str) else key or []) for k in part.split(",") if k]
    if keys:
        missing = [k for k in keys if k.strip("/") not in found]
        if missing:
            fh.close()
            raise DctDataError(f"{path}: --key {missing[0]!r}: expected one of {sorted(found)}. Got no such dataset")
        found = {k.strip("/"): found[k.strip("/")] for k in keys}
    if not found:
        fh.close()
        raise DctDataError(f"{path}: expected at least one HDF5 dataset. Got none")
    arrays = {}
    for name, ds in found.items():
        if ds.dtype.hasobject or ds.dtype.kind in "OUSVMm":
            fh.close()
            raise DctDataError(
                f"{path}[{name}]: expected a numeric dataset. Got dtype {ds.dtype} (use --key to pick datasets)"
            )
        arrays[field_name(name)] = ds
    return ArraySource(path, arrays, owner=fh)
