"""Top-level Python API mirroring the CLI: `dctdata.pack(...)` and `dctdata.open_dataset(...)`.

Both import their implementation lazily, so `import dctdata` stays light and the core never imports
`dctdata.preprocess`/`dctdata.loaders` at import time.
"""

from __future__ import annotations

import os
from typing import Any

from dctdata.errors import DctDataError
from dctdata.format import Manifest, read_manifest


def pack(source: str | os.PathLike, out: str | os.PathLike, **kwargs: Any) -> Manifest:
    """Pack SOURCE into a dataset at OUT (see `dctdata.preprocess.pack.pack` for the keywords:
    format, cf, mask, quant, target_psnr, fields, key, channels_last, nan, strict, overwrite, quiet).
    Returns the manifest written."""
    from dctdata.preprocess.pack import pack as _pack

    return _pack(source, out, **kwargs)


def open_dataset(path_or_url: str | os.PathLike, **kwargs: Any):
    """Open a packed dataset: a map-style `DCTZarrDataset` for zarr storage, the iterable
    `DCTWebDataset` for webdataset storage. Keywords go to that class (e.g. as_dict, on_error,
    storage_options). A shell `pipe:` URL can only be a webdataset stream and is refused there unless
    the caller passes allow_pipe=True."""
    if str(path_or_url).startswith("pipe:"):
        from dctdata.loaders.wds_dataset import DCTWebDataset

        return DCTWebDataset(path_or_url, **kwargs)
    manifest = read_manifest(path_or_url, storage_options=kwargs.get("storage_options"))
    if manifest.storage == "zarr":
        from dctdata.loaders.zarr_dataset import DCTZarrDataset

        return DCTZarrDataset(path_or_url, manifest=manifest, **kwargs)
    if manifest.storage == "webdataset":
        try:
            from dctdata.loaders.wds_dataset import DCTWebDataset
        except ModuleNotFoundError as exc:
            raise DctDataError(
                f"{path_or_url}: expected a loader for storage 'webdataset'. Got none in this build "
                "(dctdata.loaders.wds_dataset is missing)"
            ) from exc
        return DCTWebDataset(path_or_url, **kwargs)
    raise DctDataError(
        f"{path_or_url}: expected storage 'zarr' or 'webdataset'. Got {manifest.storage!r}"
    )  # pragma: no cover
