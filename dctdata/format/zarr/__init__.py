"""zarr v3 storage: layout, reader and writer in one place."""

from dctdata.format.zarr.layout import chunking, shard_key, zarr_layout
from dctdata.format.zarr.reader import ZarrReader
from dctdata.format.zarr.writer import ZarrWriter

__all__ = ["ZarrReader", "ZarrWriter", "chunking", "shard_key", "zarr_layout"]
