"""Map-style datasets: one passed from Python (`dctdata.pack(dataset, ...)`) or returned by a
`module:callable` factory (torchvision included). Items may be a dict (its keys name the fields), a
tuple/list (named `image`, then `label` if a scalar else `target`, then `field2`, ...) or a single
value (`image`). PIL images become (C, H, W) arrays. `sample_dict` is that rule, shared with the
iterable sources and the incremental `Writer`.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from dctdata.errors import DctDataError
from dctdata.preprocess.sources.base import Source, field_name
from dctdata.preprocess.sources.images import check_single_frame

CALLABLE_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


# module:callable ---------------------------------------------------------------------------------
def _to_array(value: Any, where: str) -> tuple[np.ndarray, bool]:
    """(array, is_decoded_image)."""
    try:
        from PIL import Image

        if isinstance(value, Image.Image):
            check_single_frame(value, where)
            arr = np.asarray(value if value.mode not in ("P", "1") else value.convert("RGB"))
            return (arr[None] if arr.ndim == 2 else np.ascontiguousarray(np.moveaxis(arr, -1, 0))), True
    except ImportError:  # pragma: no cover
        pass
    arr = np.asarray(tensor_to_numpy(value))
    if arr.dtype.hasobject or arr.dtype.kind in "OUSVMm":
        raise DctDataError(
            f"{where}: expected numeric arrays, tensors, numbers or PIL images. Got {type(value).__name__} "
            f"({arr.dtype})"
        )
    return arr, False


def sample_dict(item: Any, where: str) -> tuple[dict[str, np.ndarray], list[str]]:
    """One sample (dict, tuple/list or single value) -> ({field: array}, names of decoded images)."""
    if isinstance(item, Mapping):
        named = [(field_name(str(k)), v) for k, v in item.items()]
    elif isinstance(item, (tuple, list)):
        named = []
        for i, v in enumerate(item):
            scalar = np.ndim(v) == 0 and not hasattr(v, "mode")
            named.append(("image" if i == 0 else ("label" if scalar else "target") if i == 1 else f"field{i}", v))
    else:
        named = [("image", item)]
    out, images = {}, []
    for name, v in named:
        arr, image = _to_array(v, f"{where}: field {name!r}")
        if image:
            images.append(name)
        out[name] = arr
    return out, images


def tensor_to_numpy(value: Any) -> Any:
    """A torch tensor as a NumPy array (on the CPU; bfloat16 as float32), a masked array with NaN at its
    masked entries; anything else unchanged."""
    if isinstance(value, np.ma.MaskedArray):
        return masked_to_nan(value)
    if hasattr(value, "detach") and hasattr(value, "numpy"):
        t = value.detach().cpu()
        return (t.float() if str(t.dtype) == "torch.bfloat16" else t).numpy()
    return value


def masked_to_nan(value: np.ma.MaskedArray) -> np.ndarray:
    """A numpy masked array as floats with NaN at masked entries (then `nan="mask"` stores the mask)."""
    if not np.ma.is_masked(value):
        return np.asarray(value.data)
    dtype = value.dtype if value.dtype.kind == "f" else np.float32 if value.dtype.itemsize <= 2 else np.float64
    return value.astype(dtype).filled(np.nan)


class DatasetSource(Source):
    """A map-style dataset (`__len__` + `__getitem__`)."""

    def __init__(self, dataset: Any, description: str | None = None) -> None:
        if not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
            raise DctDataError(
                f"{description or 'source'}: expected a map-style dataset (__len__ and __getitem__). Got "
                f"{type(dataset).__name__}"
            )
        self.dataset = dataset
        self.description = description or f"<{type(dataset).__name__}>"
        self.default_kinds = {}
        classes = getattr(dataset, "classes", None)
        self.info = {"classes": [str(c) for c in classes]} if isinstance(classes, (list, tuple)) else {}

    @classmethod
    def from_target(cls, target: str) -> DatasetSource:
        """Call `module:callable` (no arguments) and wrap the dataset it returns."""
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
        except Exception as exc:  # --debug shows the traceback
            raise DctDataError(
                f"{target}: expected the callable to return a dataset. Got {type(exc).__name__}: {exc}"
            ) from exc
        return cls(dataset, target)

    def __len__(self):
        try:
            n = len(self.dataset)
        except Exception as exc:  # user code
            raise DctDataError(
                f"{self.description}: expected len(dataset) to work. Got {type(exc).__name__}: {exc}"
            ) from exc
        return n

    def sample(self, index):
        where = self.where(index)
        try:
            item = self.dataset[index]
        except Exception as exc:  # user code: name the sample instead of a traceback
            raise DctDataError(
                f"{where}: expected dataset[{index}] to return a sample. Got {type(exc).__name__}: {exc}"
            ) from exc
        out, images = sample_dict(item, where)
        for name in images:
            self.default_kinds.setdefault(name, "dct")
        return out
