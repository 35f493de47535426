"""dctdata: block-DCT compressed training sets for scientific ML.

Core (this package): transform kernels, CodecSpec, quantization, the `Decompress` first layer and
the on-disk format (`dctdata.format`). `dctdata.preprocess` packs datasets offline; `dctdata.loaders`
streams them; `dctdata.api` joins the two behind `pack` and `open_dataset`.

The public names are imported on first use (PEP 562): `import dctdata.cli` stays light, so the CLI
starts its error handling (one line for Ctrl-C) before torch is imported.
"""

import importlib

from dctdata._version import __version__
from dctdata.errors import DctDataError, FormatError, IntegrityError, OverflowCountError

_LAZY = {
    "CodecSpec": "dctdata.spec",
    "Decompress": "dctdata.layer",
    "Writer": "dctdata.api",
    "basis": "dctdata.transform",
    "compress": "dctdata.transform",
    "dct_matrix": "dctdata.transform",
    "decompress": "dctdata.functional",
    "dequantize": "dctdata.quantize",
    "encode": "dctdata.quantize",
    "kept_frequencies": "dctdata.transform",
    "num_kept": "dctdata.transform",
    "open_dataset": "dctdata.api",
    "pack": "dctdata.api",
    "quantize": "dctdata.quantize",
}

__all__ = [
    "CodecSpec",
    "Decompress",
    "DctDataError",
    "FormatError",
    "IntegrityError",
    "OverflowCountError",
    "Writer",
    "__version__",
    "basis",
    "compress",
    "dct_matrix",
    "decompress",
    "dequantize",
    "encode",
    "kept_frequencies",
    "num_kept",
    "open_dataset",
    "pack",
    "quantize",
]


def __getattr__(name: str):
    """The public API, imported on first use."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    if name != "Writer":  # dctdata.api.Writer is itself resolved on each use
        globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
