"""Pack sources: everything `dctdata pack SOURCE` accepts, streamed sample by sample.

A source is a sequence of samples; a sample is a dict field name -> numpy array (0-d for scalars).
Sources never load a whole dataset: `.npy` is memory-mapped, `.npz` members are read row by row from
the zip stream, HDF5 datasets are sliced, directories read one file per sample.

Kinds (`open_source`):
- `X.npy`: first axis = samples; one field `image`.
- `X.npz`: each member one field (first axis = samples, all the same length).
- a directory of per-sample `.npy` (field `image`) or `.npz` (each key a field) files, in sorted name
  order (zero-pad the names).
- `X.h5`/`.hdf5`/`.hdf`/`.he5`: each dataset one field (nested names joined with `_`); `key=` picks some.
- an image folder (PNG/JPEG/TIFF, 8- or 16-bit, gray or colour): field `image` as (C, H, W), plus a
  `label` field (class index, sorted subfolder names as in torchvision's ImageFolder) when the images
  sit in class subfolders.
- `module:callable`: calls it with no arguments; any map-style dataset (`__len__` + `__getitem__`),
  torchvision datasets included. Items may be a dict (its keys name the fields), a tuple/list (named
  `image`, then `label` if a scalar else `target`, then `field2`, ...) or a single value (`image`).
  PIL images become (C, H, W) arrays.
- The Well's HDF5 layout (`sources.well`): a Well file, or a folder of them (a split folder such as
  `data/train`): one sample per frame of every trajectory; time-invariant fields, grids, time values and
  boundary conditions kept in the manifest. PDEBench's 2-D/3-D HDF5 layouts likewise
  (`sources.pdebench`).
- NetCDF files (`.nc`, ...) and zarr stores (a `.zarr` path or URL, or a directory with zarr
  metadata), through xarray: `sample_dim`, `variables`, `stack`; `time_dim` packs trajectories along time
  (`sources.xarray_store`).
- Python objects (`dctdata.pack(obj, ...)`): a NumPy array or torch tensor (samples first, field
  `image`), a dict of them (a field each), an `xarray.Dataset`, or a map-style dataset (a list of
  samples included). Iterables without random access (generators) go through the incremental
  `Writer` instead (`sources.iterables`).

`channels_last=True` moves the last axis of every 3-D per-sample array to the front ((H, W, C) ->
(C, H, W)), e.g. for SciML-Bench em_graphene_sim's (N, 256, 256, 1); with `dims=3` (volumes) that of
every 4-D one ((D, H, W, C) -> (C, D, H, W)). `dims=3` also makes `stack` stack 3-D variables as the
channels of one volume field ((V, D, H, W)) instead of as V * D channels.

`default_kinds` lets a source say what its fields are when the generic rule would be wrong: decoded
images (image folders, PIL items) are `dct` even though they are 8/16-bit integers.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from dctdata.errors import DctDataError
from dctdata.format.location import is_url
from dctdata.preprocess.sources.arrays import ArraySource, NpzSource, load_npy, npy_source
from dctdata.preprocess.sources.base import ChannelsLast, Source, field_name
from dctdata.preprocess.sources.callables import CALLABLE_RE, DatasetSource, sample_dict
from dctdata.preprocess.sources.hdf5 import HDF5_SUFFIXES, check_hdf5_inside, hdf5_source, is_hdf5_file
from dctdata.preprocess.sources.images import IMAGE_SUFFIXES, directory_source, read_image
from dctdata.preprocess.sources.iterables import IterableSource, is_sample_iterable
from dctdata.preprocess.sources.objects import SampleListSource, array_source, is_array
from dctdata.preprocess.sources.pdebench import PDEBenchSource, pdebench_layout
from dctdata.preprocess.sources.well import WellSource, well_files
from dctdata.preprocess.sources.xarray_store import XarraySource, is_xarray_object, is_xarray_path


def is_path(source: object) -> bool:
    return isinstance(source, (str, os.PathLike))


def describe(source: object) -> str:
    """What the manifest records as the source: the path, URL or module:callable; for a Python object a
    description in angle brackets (never followed by `inspect`)."""
    if is_path(source):
        return os.fspath(source)
    try:
        shape = f" {tuple(source.shape)}" if hasattr(source, "shape") else f" of {len(source)}"
    except TypeError:
        shape = ""
    return f"<{type(source).__name__}{shape}>"


def open_source(  # noqa: C901 (over the limit: to split)
    source: object,
    *,
    key: str | list[str] | None = None,
    channels_last: bool = False,
    sample_dim: str | None = None,
    time_dim: str | None = None,
    variables: str | list[str] | None = None,
    stack: str | None = None,
    dims: int = 2,
    allow_external: bool = False,
) -> Source:
    """Open any supported source (see the module docstring); errors name the path. `allow_external`: an HDF5
    (or NetCDF-4) file may make the pack read other local files (`sources.hdf5`)."""
    xarray_opts = {"sample_dim": sample_dim, "variables": variables, "stack": stack, "time_dim": time_dim}
    wants_xarray = any(v is not None for v in xarray_opts.values())
    if dims != 2:
        xarray_opts["dims"] = dims
    if not is_path(source):
        if is_xarray_object(source):
            src: Source = XarraySource(source, **xarray_opts)
        elif wants_xarray:
            raise DctDataError(
                f"--sample-dim/--variables/--stack: expected a NetCDF/zarr source or an xarray.Dataset. Got "
                f"{describe(source)}"
            )
        elif key is not None:
            raise DctDataError(f"--key: expected an HDF5 source ({', '.join(HDF5_SUFFIXES)}). Got {describe(source)}")
        elif is_array(source) or isinstance(source, Mapping):
            src = array_source(source)
        elif hasattr(source, "__len__") and hasattr(source, "__getitem__"):
            src = DatasetSource(source, describe(source))
        elif is_sample_iterable(source):
            raise DctDataError(
                f"source: expected random access here. Got an iterable {describe(source)} (dctdata.pack packs "
                "iterables through dctdata.Writer)"
            )
        else:
            raise TypeError(
                "source: expected a path, URL or module:callable string, a NumPy array or tensor, a dict of arrays, an "
                f"xarray.Dataset, a map-style dataset or an iterable of samples. Got {type(source).__name__}"
            )
        return ChannelsLast(src, dims) if channels_last else src
    s = os.fspath(source)
    xarray_path = is_xarray_path(s) or (is_url(s) and s.rstrip("/").lower().endswith(".zarr"))
    if wants_xarray and not xarray_path and (os.path.exists(s) or CALLABLE_RE.match(s)):
        raise DctDataError(f"--sample-dim/--variables/--stack: expected a NetCDF file or zarr store. Got {s}")
    if wants_xarray or xarray_path:
        if key is not None:
            raise DctDataError(f"--key: expected an HDF5 source ({', '.join(HDF5_SUFFIXES)}). Got {s}")
        if not allow_external and not is_url(s) and os.path.isfile(s) and is_hdf5_file(s):
            check_hdf5_inside(s)
        src = XarraySource(s, **xarray_opts)
    elif not os.path.exists(s) and CALLABLE_RE.match(s):
        src = DatasetSource.from_target(s)
    elif not os.path.exists(s):
        raise DctDataError(f"{s}: expected an existing file or directory (or module:callable). Got no such path")
    elif key is not None and not s.lower().endswith(HDF5_SUFFIXES):
        raise DctDataError(f"--key: expected an HDF5 source ({', '.join(HDF5_SUFFIXES)}). Got {s}")
    elif key is None and (well := well_files(s)):
        src = WellSource(s, well, allow_external, dims)
    elif key is None and s.lower().endswith(HDF5_SUFFIXES) and (layout := pdebench_layout(s)):
        src = PDEBenchSource(s, layout, allow_external, dims)
    elif os.path.isdir(s):
        src = directory_source(s)
    elif s.endswith(".npy"):
        src = npy_source(s)
    elif s.endswith(".npz"):
        src = NpzSource(s)
    elif s.lower().endswith(HDF5_SUFFIXES):
        src = hdf5_source(s, key, allow_external)
    else:
        raise DctDataError(
            f"{s}: expected a .npy, .npz, HDF5 ({', '.join(HDF5_SUFFIXES)}) file, a directory, or module:callable. "
            "Got an unknown source kind"
        )
    return ChannelsLast(src, dims) if channels_last else src


__all__ = [
    "HDF5_SUFFIXES",
    "IMAGE_SUFFIXES",
    "ArraySource",
    "ChannelsLast",
    "DatasetSource",
    "IterableSource",
    "NpzSource",
    "PDEBenchSource",
    "SampleListSource",
    "Source",
    "WellSource",
    "XarraySource",
    "describe",
    "field_name",
    "hdf5_source",
    "is_path",
    "is_sample_iterable",
    "load_npy",
    "npy_source",
    "open_source",
    "read_image",
    "sample_dict",
]
