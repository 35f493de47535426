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

import importlib
import os
import re
import sys
import zipfile
from typing import Any, Iterator

import numpy as np

from dctdata.errors import DctDataError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".tif", ".tiff")
HDF5_SUFFIXES = (".h5", ".hdf5", ".hdf", ".he5")
_CALLABLE_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


def field_name(raw: str) -> str:
    """A stored field name from a source name (npz key, HDF5 path): non-identifier characters -> '_'."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", raw.strip("/"))
    return name if re.match(r"^[A-Za-z_]", name) else f"f_{name}"


class Source:
    """Base class: random access by `sample(i)`; `batches()` stacks consecutive samples."""

    description = "source"
    random_access = True
    default_kinds: dict[str, str] = {}
    info: dict[str, Any] = {}

    def __len__(self) -> int:
        raise NotImplementedError

    def where(self, index: int) -> str:
        """Human description of sample `index` for error messages."""
        return f"{self.description} sample {index}"

    def sample(self, index: int) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def probe(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """Per-sample (shape, dtype) of every field, in field order (from the first sample)."""
        if len(self) == 0:
            raise DctDataError(f"{self.description}: expected at least one sample. Got 0")
        first = next(self.batches(1, stop=1))[1]
        return {k: (tuple(v.shape[1:]), v.dtype) for k, v in first.items()}

    def read_batch(self, start: int, stop: int) -> dict[str, np.ndarray]:
        """Samples [start, stop) stacked per field; ragged samples raise naming the sample."""
        samples = [self.sample(i) for i in range(start, stop)]
        out = {}
        for name in samples[0]:
            ref = samples[0][name]
            for i, s in enumerate(samples):
                if name not in s:
                    raise DctDataError(f"{self.where(start + i)}: expected field {name!r}. Got fields {sorted(s)}")
                if s[name].shape != ref.shape:
                    raise DctDataError(
                        f"{self.where(start + i)}: field {name!r}: expected shape {ref.shape} like sample {start}. "
                        f"Got {s[name].shape} (ragged samples)"
                    )
            out[name] = np.stack([s[name] for s in samples])
        return out

    def batches(self, batch_size: int, start: int = 0, stop: int | None = None) -> Iterator[tuple[int, dict[str, np.ndarray]]]:
        stop = len(self) if stop is None else min(stop, len(self))
        for a in range(start, stop, batch_size):
            yield a, self.read_batch(a, min(a + batch_size, stop))

    def take(self, indices: list[int]) -> dict[str, np.ndarray]:
        """Stack a few (sorted, unique) samples, e.g. a calibration subset."""
        if self.random_access:
            parts = [self.read_batch(i, i + 1) for i in indices]
        else:
            wanted, parts = set(indices), []
            for a, batch in self.batches(256):
                for i in range(a, a + len(next(iter(batch.values())))):
                    if i in wanted:
                        parts.append({k: v[i - a : i - a + 1] for k, v in batch.items()})
                if len(parts) == len(indices):
                    break
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

    def close(self) -> None:
        pass


class ChannelsLast(Source):
    """Wraps a source: 3-D per-sample arrays (H, W, C) -> (C, H, W)."""

    def __init__(self, inner: Source) -> None:
        self.inner = inner
        self.description = inner.description
        self.random_access = inner.random_access
        self.default_kinds = inner.default_kinds
        self.info = inner.info

    def __len__(self) -> int:
        return len(self.inner)

    def where(self, index: int) -> str:
        return self.inner.where(index)

    @staticmethod
    def _fix(batch):
        return {k: np.moveaxis(v, -1, 1) if v.ndim == 4 else v for k, v in batch.items()}

    def read_batch(self, start, stop):
        return self._fix(self.inner.read_batch(start, stop))

    def batches(self, batch_size, start=0, stop=None):
        for a, b in self.inner.batches(batch_size, start, stop):
            yield a, self._fix(b)

    def take(self, indices):
        return self._fix(self.inner.take(indices))

    def close(self):
        self.inner.close()


# .npy ----------------------------------------------------------------------------------------------
def _npy_header(fh, where: str) -> tuple[tuple[int, ...], bool, np.dtype]:
    try:
        version = np.lib.format.read_magic(fh)
        reader = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = reader(fh)
    except (ValueError, OSError, EOFError) as exc:
        raise DctDataError(f"{where}: expected a .npy array. Got an unreadable header ({exc})") from exc
    if dtype.hasobject or dtype.kind in "OUSVMm":
        raise DctDataError(
            f"{where}: expected a numeric array. Got dtype {dtype} (object/pickle, string or structured arrays are never loaded)"
        )
    return tuple(shape), fortran, dtype


def load_npy(path: str, mmap: bool = True) -> np.ndarray:
    """Validated, pickle-free .npy load (memory-mapped by default); truncation named, not mis-read."""
    with open(path, "rb") as fh:
        shape, _, dtype = _npy_header(fh, path)
        offset = fh.tell()
    need = offset + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    size = os.path.getsize(path)
    if size < need:
        raise DctDataError(f"{path}: expected {need} bytes for a {dtype} array of shape {shape}. Got {size} (truncated file)")
    try:
        return np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except (ValueError, OSError) as exc:
        raise DctDataError(f"{path}: cannot read .npy: {exc}") from exc


class ArraySource(Source):
    """Fields backed by sliceable arrays with samples on axis 0 (mmap'd .npy, HDF5 datasets)."""

    def __init__(self, description: str, arrays: dict[str, Any], owner: Any = None) -> None:
        self.description = description
        self.arrays = arrays
        self.owner = owner
        lengths = {k: a.shape[0] if a.ndim else None for k, a in arrays.items()}
        for k, n in lengths.items():
            if n is None:
                raise DctDataError(f"{description}: field {k!r}: expected samples on the first axis. Got a 0-d array")
        if len(set(lengths.values())) > 1:
            raise DctDataError(f"{description}: expected every field to have the same sample count. Got {lengths}")
        self.n = next(iter(lengths.values())) if lengths else 0

    def __len__(self) -> int:
        return self.n

    def probe(self):
        if self.n == 0:
            raise DctDataError(f"{self.description}: expected at least one sample. Got 0")
        return {k: (tuple(a.shape[1:]), np.dtype(a.dtype)) for k, a in self.arrays.items()}

    def read_batch(self, start, stop):
        return {k: np.asarray(a[start:stop]) for k, a in self.arrays.items()}

    def sample(self, index):
        return {k: v[0] for k, v in self.read_batch(index, index + 1).items()}

    def close(self):
        if self.owner is not None:
            self.owner.close()


def npy_source(path: str) -> ArraySource:
    arr = load_npy(path)
    if arr.ndim == 0:
        raise DctDataError(f"{path}: expected an array with samples on the first axis. Got a 0-d array")
    return ArraySource(path, {"image": arr})


# .npz (streamed row by row from the zip members) -------------------------------------------------
class NpzSource(Source):
    random_access = False

    def __init__(self, path: str) -> None:
        self.description = path
        self.path = path
        try:
            with zipfile.ZipFile(path) as zf:
                members = [m for m in zf.namelist() if m.endswith(".npy")]
                self.headers = {}
                for m in members:
                    with zf.open(m) as fh:
                        shape, fortran, dtype = _npy_header(fh, f"{path}[{m[:-4]}]")
                    if fortran and len(shape) > 1:
                        raise DctDataError(f"{path}[{m[:-4]}]: expected a C-order array (streamed by rows). Got Fortran order")
                    if not shape:
                        raise DctDataError(f"{path}[{m[:-4]}]: expected samples on the first axis. Got a 0-d array")
                    self.headers[m] = (shape, dtype)
        except (zipfile.BadZipFile, OSError, EOFError) as exc:
            raise DctDataError(f"{path}: expected a readable .npz (zip) file. Got {exc}") from exc
        if not members:
            raise DctDataError(f"{path}: expected at least one array in the .npz. Got none")
        self.names = {m: field_name(m[:-4]) for m in members}
        lengths = {self.names[m]: h[0][0] for m, h in self.headers.items()}
        if len(set(lengths.values())) > 1:
            raise DctDataError(f"{path}: expected every array to have the same sample count. Got {lengths}")
        self.n = next(iter(lengths.values()))

    def __len__(self):
        return self.n

    def probe(self):
        if self.n == 0:
            raise DctDataError(f"{self.path}: expected at least one sample. Got 0")
        return {self.names[m]: (tuple(s[1:]), d) for m, (s, d) in self.headers.items()}

    def batches(self, batch_size, start=0, stop=None):
        stop = self.n if stop is None else min(stop, self.n)
        try:
            with zipfile.ZipFile(self.path) as zf:
                handles = {}
                for m in self.headers:
                    fh = zf.open(m)
                    _npy_header(fh, self.path)
                    handles[m] = fh
                row = {m: int(np.prod(s[1:], dtype=np.int64)) * d.itemsize for m, (s, d) in self.headers.items()}
                for m, fh in handles.items():
                    _read_exact(fh, row[m] * start, f"{self.path}[{m[:-4]}]", start)
                for a in range(start, stop, batch_size):
                    b = min(a + batch_size, stop)
                    out = {}
                    for m, fh in handles.items():
                        shape, dtype = self.headers[m]
                        raw = _read_exact(fh, row[m] * (b - a), f"{self.path}[{m[:-4]}]", a)
                        out[self.names[m]] = np.frombuffer(raw, dtype=dtype).reshape((b - a, *shape[1:]))
                    yield a, out
        except (zipfile.BadZipFile, OSError, EOFError) as exc:
            raise DctDataError(f"{self.path}: expected a readable .npz (zip) file. Got {exc}") from exc

    def read_batch(self, start, stop):
        return next(self.batches(stop - start, start, stop))[1]


def _read_exact(fh, n: int, where: str, sample: int) -> bytes:
    raw = fh.read(n)
    if len(raw) != n:
        raise DctDataError(f"{where}: expected {n} more bytes at sample {sample}. Got {len(raw)} (truncated file)")
    return raw


# Directory of per-sample files -------------------------------------------------------------------
class FileDirSource(Source):
    def __init__(self, path: str, files: list[str]) -> None:
        self.description = path
        self.files = files

    def __len__(self):
        return len(self.files)

    def where(self, index):
        return self.files[index]

    def sample(self, index):
        f = self.files[index]
        if f.endswith(".npy"):
            return {"image": np.asarray(load_npy(f, mmap=False))}
        out = {}
        try:
            with np.load(f, allow_pickle=False) as npz:
                for k in npz.files:
                    arr = npz[k]
                    if arr.dtype.kind in "OUSVMm":
                        raise DctDataError(f"{f}[{k}]: expected a numeric array. Got dtype {arr.dtype}")
                    out[field_name(k)] = arr
        except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
            if isinstance(exc, DctDataError):
                raise
            raise DctDataError(f"{f}: expected a readable pickle-free .npz file. Got {exc}") from exc
        return out


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
            raise DctDataError(f"{path}[{name}]: expected a numeric dataset. Got dtype {ds.dtype} (use --key to pick datasets)")
        arrays[field_name(name)] = ds
    return ArraySource(path, arrays, owner=fh)


# Image folders -----------------------------------------------------------------------------------
def read_image(path: str) -> np.ndarray:
    """One image file -> (C, H, W) array in its native depth (uint8, uint16, int32 or float32)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            im.load()
            if im.mode == "P":
                im = im.convert("RGBA" if "transparency" in im.info else "RGB")
            elif im.mode in ("1", "CMYK", "YCbCr", "LAB", "HSV"):
                im = im.convert("L" if im.mode == "1" else "RGB")
            arr = np.asarray(im)
            if im.mode.startswith("I;16"):
                arr = arr.astype(np.uint16)
            elif im.mode == "I" and arr.size and arr.min() >= 0 and arr.max() <= 65535:
                arr = arr.astype(np.uint16)  # 16-bit PNGs open as 32-bit "I"
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        raise DctDataError(f"{path}: expected a readable PNG/JPEG/TIFF image. Got {exc}") from exc
    return arr[None] if arr.ndim == 2 else np.ascontiguousarray(np.moveaxis(arr, -1, 0))


class ImageFolderSource(Source):
    default_kinds = {"image": "dct"}

    def __init__(self, path: str, files: list[str], labels: list[int] | None, classes: list[str] | None) -> None:
        self.description = path
        self.files = files
        self.labels = labels
        self.info = {"classes": classes} if classes else {}

    def __len__(self):
        return len(self.files)

    def where(self, index):
        return self.files[index]

    def sample(self, index):
        out = {"image": read_image(self.files[index])}
        if self.labels is not None:
            out["label"] = np.asarray(self.labels[index], dtype=np.int64)
        return out


def _is_image(name: str) -> bool:
    return name.lower().endswith(IMAGE_SUFFIXES)


def directory_source(path: str) -> Source:
    entries = sorted(os.listdir(path))
    files = [os.path.join(path, e) for e in entries if os.path.isfile(os.path.join(path, e))]
    arrays = [f for f in files if f.endswith((".npy", ".npz"))]
    if arrays:
        kinds = {os.path.splitext(f)[1] for f in arrays}
        if len(kinds) > 1:
            raise DctDataError(f"{path}: expected per-sample files of one kind (.npy or .npz). Got both")
        return FileDirSource(path, arrays)
    images = [f for f in files if _is_image(f)]
    subdirs = [e for e in entries if os.path.isdir(os.path.join(path, e)) and not e.startswith(".")]
    if images and subdirs:
        raise DctDataError(f"{path}: expected images either at the top level or in class subfolders. Got both")
    if images:
        return ImageFolderSource(path, images, None, None)
    files, labels = [], []
    for label, cls in enumerate(subdirs):
        for root, dirs, names in os.walk(os.path.join(path, cls)):
            dirs.sort()
            for n in sorted(names):
                if _is_image(n):
                    files.append(os.path.join(root, n))
                    labels.append(label)
    if not files:
        raise DctDataError(
            f"{path}: expected per-sample .npy/.npz files or PNG/JPEG/TIFF images (optionally in class subfolders). Got none"
        )
    return ImageFolderSource(path, files, labels, subdirs)


# module:callable ---------------------------------------------------------------------------------
def _to_array(value: Any, where: str) -> tuple[np.ndarray, bool]:
    """(array, is_decoded_image)."""
    try:
        from PIL import Image

        if isinstance(value, Image.Image):
            arr = np.asarray(value if value.mode not in ("P", "1") else value.convert("RGB"))
            return (arr[None] if arr.ndim == 2 else np.ascontiguousarray(np.moveaxis(arr, -1, 0))), True
    except ImportError:  # pragma: no cover
        pass
    if hasattr(value, "detach") and hasattr(value, "numpy"):
        value = value.detach().cpu()
        if str(value.dtype) == "torch.bfloat16":
            value = value.float()
        value = value.numpy()
    arr = np.asarray(value)
    if arr.dtype.hasobject or arr.dtype.kind in "OUSVMm":
        raise DctDataError(f"{where}: expected numeric arrays, tensors, numbers or PIL images. Got {type(value).__name__} ({arr.dtype})")
    return arr, False


class DatasetSource(Source):
    def __init__(self, target: str) -> None:
        self.description = target
        module_name, _, attr = target.partition(":")
        try:
            try:
                module = importlib.import_module(module_name)
            except ModuleNotFoundError:
                if os.getcwd() in sys.path:
                    raise
                sys.path.insert(0, os.getcwd())  # like `python -m`: modules next to the caller
                module = importlib.import_module(module_name)
        except ImportError as exc:
            raise DctDataError(f"{target}: expected an importable module:callable. Got {exc}") from exc
        obj = module
        for part in attr.split("."):
            if not hasattr(obj, part):
                raise DctDataError(f"{target}: expected {module_name} to define {attr}. Got no attribute {part!r}")
            obj = getattr(obj, part)
        if not callable(obj):
            raise DctDataError(f"{target}: expected a callable returning a map-style dataset. Got {type(obj).__name__}")
        try:
            dataset = obj()
        except Exception as exc:  # noqa: BLE001 - user code: one line naming it (--debug shows the traceback)
            raise DctDataError(f"{target}: expected the callable to return a dataset. Got {type(exc).__name__}: {exc}") from exc
        if not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
            raise DctDataError(
                f"{target}: expected a map-style dataset (__len__ and __getitem__). Got {type(dataset).__name__}"
            )
        self.dataset = dataset
        self.default_kinds = {}
        classes = getattr(dataset, "classes", None)
        self.info = {"classes": [str(c) for c in classes]} if isinstance(classes, (list, tuple)) else {}

    def __len__(self):
        try:
            n = len(self.dataset)
        except Exception as exc:  # noqa: BLE001 - user code
            raise DctDataError(f"{self.description}: expected len(dataset) to work. Got {type(exc).__name__}: {exc}") from exc
        return n

    def sample(self, index):
        where = self.where(index)
        try:
            item = self.dataset[index]
        except Exception as exc:  # noqa: BLE001 - user code: name the sample instead of a traceback
            raise DctDataError(f"{where}: expected dataset[{index}] to return a sample. Got {type(exc).__name__}: {exc}") from exc
        if isinstance(item, dict):
            named = [(field_name(str(k)), v) for k, v in item.items()]
        elif isinstance(item, (tuple, list)):
            named = []
            for i, v in enumerate(item):
                scalar = np.ndim(v) == 0 and not hasattr(v, "mode")
                named.append(("image" if i == 0 else ("label" if scalar else "target") if i == 1 else f"field{i}", v))
        else:
            named = [("image", item)]
        out = {}
        for name, v in named:
            arr, image = _to_array(v, f"{where}: field {name!r}")
            if image:
                self.default_kinds.setdefault(name, "dct")
            out[name] = arr
        return out


# Dispatch ----------------------------------------------------------------------------------------
def open_source(source: str | os.PathLike, *, key: str | list[str] | None = None, channels_last: bool = False) -> Source:
    """Open any supported source (see the module docstring); errors name the path."""
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(f"source: expected a path or module:callable string. Got {type(source).__name__}")
    s = os.fspath(source)
    if not os.path.exists(s) and _CALLABLE_RE.match(s):
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
