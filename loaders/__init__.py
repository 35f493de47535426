"""dctdata.loaders: online side. PyTorch datasets over packed zarr groups and webdataset shards, the
DataLoader that reads either (distributed, resumable) and device-transfer helpers. Imports only from
dctdata core.

The public names below import their module on first use (PEP 562), so a DataLoader worker that needs
one module does not import the others:

- `DCTZarrDataset` (map-style, zarr) and `DCTWebDataset` (iterable, webdataset shards), both
  `PackedDataset`s; `dctdata.open_dataset` picks the right one from the manifest.
- `ReadOptions`: how a pack is read (decode, on_error, the shard cache, read threads), checked once.
- `WindowDataset` / `WebWindowDataset`: time windows over a zarr / webdataset pack of trajectories (The
  Well's `WellDataset` items); `dctdata.open_dataset(path, n_steps_input=..., n_steps_output=...)` opens one.
  `WindowDecompress`: their `decode="device"` batches decoded on the device.
- `make_loader`, `set_epoch`, `PackLoader`: the DataLoader for either kind, every sample once per epoch
  across ranks and workers, `state_dict()`/`load_state_dict()` to resume mid-epoch.
- `DevicePrefetcher`, `with_decompress`, `AugmentOnDevice`, `to_device`, `pin`, `resolve_device`: batches to
  the accelerator and through the first layer there.
- `WdsDecoder`: a webdataset pack read with webdataset's own pipeline (its decoder handler and stage).
- `balance_threads`, `worker_init`, `available_cores`, `main_threads`: torch threads against DataLoader
  workers on a shared CPU.
"""

import importlib

# name -> the module that defines it (imported on first use)
_LAZY = {
    "AugmentOnDevice": "dctdata.loaders.device",
    "DCTWebDataset": "dctdata.loaders.wds_dataset",
    "DCTZarrDataset": "dctdata.loaders.zarr_dataset",
    "DevicePrefetcher": "dctdata.loaders.device",
    "PackLoader": "dctdata.loaders.stateful",
    "PackedDataset": "dctdata.loaders.base",
    "ReadOptions": "dctdata.loaders.options",
    "WebWindowDataset": "dctdata.loaders.wds_windows",
    "WindowDataset": "dctdata.loaders.windows",
    "WindowDecompress": "dctdata.loaders.window_decode",
    "available_cores": "dctdata.loaders.threads",
    "balance_threads": "dctdata.loaders.threads",
    "main_threads": "dctdata.loaders.threads",
    "make_loader": "dctdata.loaders.distributed",
    "pin": "dctdata.loaders.device",
    "resolve_device": "dctdata.loaders.device",
    "set_epoch": "dctdata.loaders.distributed",
    "WdsDecoder": "dctdata.loaders.wds_decode",
    "to_device": "dctdata.loaders.device",
    "with_decompress": "dctdata.loaders.device",
    "worker_init": "dctdata.loaders.threads",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
