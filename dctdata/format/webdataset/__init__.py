"""webdataset (tar shard) storage: layout, reader and writer in one place."""

from dctdata.format.webdataset.layout import entry_name, sample_key, shard_list
from dctdata.format.webdataset.reader import Files, ShardReader, WebDatasetReader
from dctdata.format.webdataset.writer import WebDatasetWriter

__all__ = [
    "Files",
    "ShardReader",
    "WebDatasetReader",
    "WebDatasetWriter",
    "entry_name",
    "sample_key",
    "shard_list",
]
