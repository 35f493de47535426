"""webdataset (tar shard) storage: layout, reader and writer in one place."""

from dctdata.format.webdataset.layout import entry_name, sample_key, shard_list
from dctdata.format.webdataset.reader import Files, ShardReader, WebDatasetReader
from dctdata.format.webdataset.wds_decode import WdsDecoder
from dctdata.format.webdataset.writer import WebDatasetWriter

__all__ = [
    "Files",
    "ShardReader",
    "WebDatasetReader",
    "WdsDecoder",
    "WebDatasetWriter",
    "entry_name",
    "sample_key",
    "shard_list",
]
