"""dctdata.loaders: online side. PyTorch datasets over packed zarr groups and webdataset shards, and
device-transfer helpers. Imports only from dctdata core."""
