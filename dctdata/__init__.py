"""dctdata: block-DCT compressed training sets for scientific ML.

Core (this package): transform kernels, CodecSpec, quantization, the `Decompress` first layer and
the on-disk format (`dctdata.format`). `dctdata.preprocess` packs datasets offline; `dctdata.loaders`
streams them; `dctdata.api` joins the two behind `pack` and `open_dataset`.
"""

from dctdata import api as _api
from dctdata._version import __version__
from dctdata.api import open_dataset, pack
from dctdata.errors import DctDataError, FormatError, IntegrityError, OverflowCountError
from dctdata.layer import Decompress
from dctdata.quantize import dequantize, encode, quantize
from dctdata.spec import CodecSpec
from dctdata.transform import basis, compress, dct_matrix, decompress, kept_frequencies, num_kept

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
    """`dctdata.Writer` (the incremental writer) is imported on first use, through `dctdata.api`."""
    if name == "Writer":
        return _api.Writer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
