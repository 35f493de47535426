"""webdataset (tar shard) storage: layout, reader and writer in one place."""

from dctdata.format.webdataset.layout import entry_name, sample_key, shard_list
from dctdata.format.webdataset.reader import Files, ShardReader
from dctdata.format.webdataset.writer import WebDatasetWriter

__all__ = ["Files", "ShardReader", "WebDatasetWriter", "entry_name", "sample_key", "shard_list"]
