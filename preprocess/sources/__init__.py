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

`channels_last=True` moves the last axis of every 3-D per-sample array to the front ((H, W, C) ->
(C, H, W)), e.g. for SciML-Bench em_graphene_sim's (N, 256, 256, 1).

`default_kinds` lets a source say what its fields are when the generic rule would be wrong: decoded
images (image folders, PIL items) are `dct` even though they are 8/16-bit integers.
"""

from __future__ import annotations

import os

from dctdata.errors import DctDataError
from dctdata.preprocess.sources.arrays import ArraySource, NpzSource, load_npy, npy_source
from dctdata.preprocess.sources.base import ChannelsLast, Source, field_name
from dctdata.preprocess.sources.callables import CALLABLE_RE, DatasetSource
from dctdata.preprocess.sources.hdf5 import HDF5_SUFFIXES, hdf5_source
from dctdata.preprocess.sources.images import IMAGE_SUFFIXES, directory_source, read_image


def open_source(
    source: str | os.PathLike, *, key: str | list[str] | None = None, channels_last: bool = False
) -> Source:
    """Open any supported source (see the module docstring); errors name the path."""
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(f"source: expected a path or module:callable string. Got {type(source).__name__}")
    s = os.fspath(source)
    if not os.path.exists(s) and CALLABLE_RE.match(s):
        src: Source = DatasetSource(s)
    elif not os.path.exists(s):
        raise DctDataError(f"{s}: expected an existing file or directory (or module:callable). Got no such path")
    elif key is not None and not s.lower().endswith(HDF5_SUFFIXES):
        raise DctDataError(f"--key: expected an HDF5 source ({', '.join(HDF5_SUFFIXES)}). Got {s}")
    elif os.path.isdir(s):
        src = directory_source(s)
    elif s.endswith(".npy"):
        src = npy_source(s)
    elif s.endswith(".npz"):
        src = NpzSource(s)
    elif s.lower().endswith(HDF5_SUFFIXES):
        src = hdf5_source(s, key)
    else:
        raise DctDataError(
            f"{s}: expected a .npy, .npz, HDF5 ({', '.join(HDF5_SUFFIXES)}) file, a directory, or module:callable. "
            "Got an unknown source kind"
        )
    return ChannelsLast(src) if channels_last else src


__all__ = [
    "HDF5_SUFFIXES",
    "IMAGE_SUFFIXES",
    "ArraySource",
    "ChannelsLast",
    "NpzSource",
    "Source",
    "field_name",
    "hdf5_source",
    "load_npy",
    "npy_source",
    "open_source",
    "read_image",
]
