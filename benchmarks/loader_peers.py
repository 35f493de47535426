"""The peers the loader benchmarks compare against, each holding the same samples as raw float32:
plain webdataset `.npy` shards, zarr read through tensorstore and through zarr-python, and, where they
are installed, LitData and MosaicML Streaming. Each peer is written once (`write`) and opened as a
torch dataset for a local directory or, where the peer can, an HTTP URL (`open`; None when it
cannot). Datasets yield (or, map-style, batch through `__getitems__`) float32 samples (1, H, W).

Everything that holds threads or connections (tensorstore, zarr, fsspec) is opened lazily in the
process that reads, so forked DataLoader workers never inherit it (tensorstore does not survive a
fork: google/tensorstore#206).
"""

from __future__ import annotations

import importlib.util
import io
import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class Peer:
    name: str
    write: Callable[[np.ndarray, str, int], None]  # (samples, directory, samples per shard)
    open: Callable[[str, int], object]  # (local directory or URL, batch size) -> dataset
    http: bool  # reads an http:// URL
    map_style: bool  # needs a shuffling sampler (True) or shuffles itself (False)


# webdataset .npy shards -----------------------------------------------------------------------------
def _write_wds(x: np.ndarray, out: str, per_shard: int) -> None:
    from webdataset import TarWriter

    os.makedirs(out)
    for s, a in enumerate(range(0, len(x), per_shard)):
        with TarWriter(os.path.join(out, f"raw-{s:06d}.tar"), encoder=False, mtime=0) as tw:
            for i in range(a, min(a + per_shard, len(x))):
                buf = io.BytesIO()
                np.save(buf, x[i], allow_pickle=False)
                tw.write({"__key__": f"{i:09d}", "x.npy": buf.getvalue()})
    with open(os.path.join(out, "shards.txt"), "w") as fh:
        fh.write("\n".join(sorted(f for f in os.listdir(out) if f.endswith(".tar"))))


def _open_stream(sample: dict) -> dict:
    """webdataset stage: an fsspec stream for each shard URL (http(s) bodies read sequentially)."""
    from dctdata.format.location import open_file

    return {**sample, "stream": open_file(sample["url"], streaming=True)}


def _load_npy(sample: dict) -> torch.Tensor:
    return torch.from_numpy(np.load(io.BytesIO(sample["x.npy"]), allow_pickle=False))


def _open_wds(root: str, batch: int):
    import webdataset as wds
    from webdataset.tariterators import group_by_keys, tar_file_expander

    from dctdata.format.location import join, open_file

    with open_file(join(root, "shards.txt")) as fh:
        names = fh.read().decode().split()
    return wds.DataPipeline(
        wds.SimpleShardList([join(root, n) for n in names], seed=0),
        wds.split_by_worker,
        wds.map(_open_stream),
        lambda src: group_by_keys(tar_file_expander(src)),
        wds.shuffle(256, 64),
        wds.map(_load_npy),
    )


# zarr (one sample per chunk, uncompressed) ----------------------------------------------------------
def _write_zarr(x: np.ndarray, out: str, per_shard: int) -> None:
    import zarr

    arr = zarr.create_array(out, shape=x.shape, chunks=(1, *x.shape[1:]), dtype="float32", compressors=None)
    arr[:] = x


class _ZarrRows(torch.utils.data.Dataset):
    """Raw float32 zarr rows; `__getitems__` reads a batch with one call of the library."""

    def __init__(self, root: str, library: str) -> None:
        import zarr

        self.root, self.library, self._arr, self._pid = root, library, None, None
        self.n = zarr.open_array(root, mode="r").shape[0]  # zarr and fsspec are fork-safe; tensorstore is not

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_arr": None, "_pid": None}

    def __len__(self) -> int:
        return self.n

    def _array(self):
        if self._pid != os.getpid():
            import zarr

            self._arr = zarr.open_array(self.root, mode="r") if self.library == "zarr" else _ts_open(self.root)
            self._pid = os.getpid()
        return self._arr

    def __getitems__(self, idx: list[int]) -> list[torch.Tensor]:
        order = np.asarray(sorted(idx))
        if self.library == "zarr":
            rows = self._array().get_orthogonal_selection((order,))
        else:
            rows = self._array().oindex[order].read().result()
        at = {int(i): k for k, i in enumerate(order)}
        return [torch.from_numpy(rows[at[int(i)]]) for i in idx]

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.__getitems__([i])[0]


def _zarr_rows(root: str, batch: int) -> _ZarrRows:
    return _ZarrRows(root, "zarr")


def _tensorstore_rows(root: str, batch: int) -> _ZarrRows:
    return _ZarrRows(root, "tensorstore")


def _ts_open(root: str):
    """A tensorstore handle on a zarr v3 array (file or http kvstore), only ever in the reading process."""
    import tensorstore as ts

    kv = {"driver": "http", "base_url": root} if "://" in root else {"driver": "file", "path": root}
    return ts.open({"driver": "zarr3", "kvstore": kv}, read=True).result()


# LitData and MosaicML Streaming ---------------------------------------------------------------------
def _litdata_item(i_and_path):
    i, path = i_and_path
    return np.load(path, mmap_mode="r", allow_pickle=False)[i].copy()


def _write_litdata(x: np.ndarray, out: str, per_shard: int) -> None:
    import litdata

    src = out + ".src.npy"
    np.save(src, x)
    litdata.optimize(
        fn=_litdata_item,
        inputs=[(i, src) for i in range(len(x))],
        output_dir=out,
        chunk_size=per_shard,
        num_workers=1,
        verbose=False,
        start_method="fork",
    )
    os.remove(src)


def _open_litdata(root: str, batch: int):
    import litdata

    return litdata.StreamingDataset(root, shuffle=True, transform=_as_tensor)


def _as_tensor(x) -> torch.Tensor:
    return torch.as_tensor(np.asarray(x))


def _write_mosaic(x: np.ndarray, out: str, per_shard: int) -> None:
    from streaming import MDSWriter

    with MDSWriter(out=out, columns={"x": "ndarray:float32"}, size_limit=per_shard * x[0].nbytes + (1 << 16)) as w:
        for s in x:
            w.write({"x": s})


def _open_mosaic(root: str, batch: int):
    from streaming import StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    return StreamingDataset(local=root, shuffle=True, batch_size=batch, shuffle_seed=0)


def peers() -> list[Peer]:
    """The peers that can run here (LitData and MosaicML Streaming only when installed)."""
    out = [
        Peer("raw float32 .npy shards (webdataset)", _write_wds, _open_wds, http=True, map_style=False),
        Peer("raw float32 zarr (tensorstore)", _write_zarr, _tensorstore_rows, http=True, map_style=True),
        Peer("raw float32 zarr (zarr-python)", _write_zarr, _zarr_rows, http=True, map_style=True),
    ]
    if importlib.util.find_spec("litdata"):
        out.append(Peer("raw float32 LitData", _write_litdata, _open_litdata, http=False, map_style=False))
    if importlib.util.find_spec("streaming"):
        out.append(Peer("raw float32 MosaicML Streaming", _write_mosaic, _open_mosaic, http=False, map_style=False))
    return out
