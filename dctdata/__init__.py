"""dctdata: block-DCT compressed training sets for scientific ML.

The public API is flat; every name imports its module on first use (PEP 562), so `import dctdata`
loads neither torch nor a storage library, and the CLI starts its error handling (one line for
Ctrl-C) before torch is imported:

    import dctdata
    dctdata.pack(source, "em.dct", target_psnr=40)                  # offline: dctdata.preprocess
    ds = dctdata.open_dataset("em.dct")                             # online: dctdata.loaders
    loader = dctdata.make_loader(ds, batch_size=32, num_workers=4)  # any kind, DDP, resumable
    layer = ds.decompressor()                                       # the model's first layer

- Packing: `pack`, `Writer` (incremental), `PackSettings` (every pack setting, typed and documented).
- Loading: `open_dataset`, `ReadOptions` (how a pack is read), `make_loader`, `set_epoch`, `DevicePrefetcher`,
  `balance_threads`.
- The codec: `CodecSpec`, `Decompress` (the first layer), `compress`/`decompress` (no quantization),
  `encode`/`quantize`/`dequantize`, `dct_matrix`, `basis`, `kept_frequencies`, `num_kept`.
- Errors: `DctDataError` (a ValueError) and its `FormatError`, `IntegrityError`, `OverflowCountError`.

Where they live: the core (this package: transform kernels, CodecSpec, quantization, `Decompress`,
the on-disk format `dctdata.format`), `dctdata.preprocess` (packing) and `dctdata.loaders` (loading).
This module and `dctdata.api` are the only core modules that name the two sides, and only lazily.
"""

import importlib
import importlib.abc
import importlib.util
import sys
import types
import warnings

from dctdata._version import __version__
from dctdata.errors import DctDataError, FormatError, IntegrityError, OverflowCountError

# name -> the module that defines it (imported on first use)
_LAZY = {
    "CodecSpec": "dctdata.codec.spec",
    "Decompress": "dctdata.decoder.layer",
    "DevicePrefetcher": "dctdata.loaders.device",
    "PackSettings": "dctdata.settings",
    "ReadOptions": "dctdata.loaders.options",
    "Writer": "dctdata.api",
    "balance_threads": "dctdata.loaders.threads",
    "basis": "dctdata.codec.transform",
    "compress": "dctdata.codec.transform",
    "dct_matrix": "dctdata.codec.transform",
    "decompress": "dctdata.decoder.functional",
    "dequantize": "dctdata.encoder.quantize",
    "encode": "dctdata.encoder.quantize",
    "kept_frequencies": "dctdata.codec.transform",
    "make_loader": "dctdata.loaders.distributed",
    "num_kept": "dctdata.codec.transform",
    "open_dataset": "dctdata.api",
    "pack": "dctdata.api",
    "quantize": "dctdata.encoder.quantize",
    "set_epoch": "dctdata.loaders.distributed",
}

__all__ = [
    "CodecSpec",
    "DctDataError",
    "Decompress",
    "DevicePrefetcher",
    "FormatError",
    "IntegrityError",
    "OverflowCountError",
    "PackSettings",
    "ReadOptions",
    "Writer",
    "__version__",
    "balance_threads",
    "basis",
    "compress",
    "dct_matrix",
    "decompress",
    "dequantize",
    "encode",
    "kept_frequencies",
    "make_loader",
    "num_kept",
    "open_dataset",
    "pack",
    "quantize",
    "set_epoch",
]


def __getattr__(name: str):
    """The public API, imported on first use."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


# Issue 48 moved the core's flat modules into floors; the old paths still import (the same module object,
# with a DeprecationWarning), so code written against `dctdata.wire` or `dctdata.quantize` keeps working.
_MOVED = {
    **dict.fromkeys(("transform", "transform3d", "spec", "metrics", "lattice"), "codec"),
    **dict.fromkeys(
        ("wire", "stored", "corrections", "layer", "volume", "functional", "fused", "fused_cuda", "decode_check"),
        "decoder",
    ),
    **dict.fromkeys(("quantize", "bounds", "bound_rounding", "calibrate"), "encoder"),
    **dict.fromkeys(("nvcomp_zstd", "zstd_frames"), "stages"),
}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds `dctdata.<old>` for a moved module and hands back `dctdata.<floor>.<old>` itself."""

    def find_spec(self, fullname, path=None, target=None):
        package, _, old = fullname.rpartition(".")
        if package == __name__ and old in _MOVED:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        old = spec.name.rpartition(".")[2]
        new = f"{__name__}.{_MOVED[old]}.{old}"
        warnings.warn(f"{spec.name} moved to {new}: import it from there", DeprecationWarning, stacklevel=2)
        return importlib.import_module(new)

    def exec_module(self, module) -> None:
        pass  # the moved module ran when it was imported under its own name


sys.meta_path.append(_MovedModules())


class _Package(types.ModuleType):
    """`dctdata.quantize` is the function, also after something imports the old module path
    `dctdata.quantize` (the import system then sets the package's attribute of that name to the module)."""

    def __setattr__(self, name: str, value: object) -> None:
        if isinstance(value, types.ModuleType) and _LAZY.get(name) == value.__name__:
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
