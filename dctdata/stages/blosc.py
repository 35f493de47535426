"""Blosc (numcodecs' Blosc) over an array's raw bytes: readable by any zarr v3 reader (its "blosc" codec).
Not selectable by `--lossless`; a pack names it through the Python API (`lossless={"id": "blosc", ...}`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dctdata.errors import DctDataError
from dctdata.stages.base import BytesStage, Stream, byte_view
from dctdata.stages.zstd import ZstdStage

CODEC_ID = "blosc"
_SHUFFLE = {0: "noshuffle", 1: "shuffle", 2: "bitshuffle"}  # numcodecs' ints -> zarr v3's names
_HEADER = 16  # blosc's frame header
_INTS = ("clevel", "shuffle", "blocksize", "typesize")


class BloscStage(BytesStage):
    codec_id = CODEC_ID
    # Blosc members have always been named like zstd's (`.npy.zst`): kept, so packs stay byte-identical; the
    # reader takes the stage from the manifest
    member_suffix = ZstdStage.member_suffix
    shares_suffix = True
    decode_bytes_per_us = 1_000

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> BloscStage:
        from numcodecs.blosc import list_compressors

        c = {"cname": "lz4", "clevel": 5, "shuffle": 1, "blocksize": 0, "typesize": 1, **config}
        ints = all(isinstance(c[k], int) and not isinstance(c[k], bool) for k in _INTS)
        if (
            set(config) - {"id", "cname", *_INTS}
            or not ints
            or c["cname"] not in list_compressors()
            or not (
                0 <= c["clevel"] <= 9 and c["shuffle"] in (-1, 0, 1, 2) and c["blocksize"] >= 0 and c["typesize"] >= 1
            )
        ):
            raise DctDataError(
                f"expected a blosc config {{'id', 'cname': one of {list_compressors()}, 'clevel': 0..9, "
                f"'shuffle': -1..2, 'blocksize': int >= 0, 'typesize': int >= 1}}. Got {dict(config)!r}"
            )
        return cls(config, cls._numcodecs(config))

    @classmethod
    def default_config(cls) -> dict[str, Any]:
        return {"id": CODEC_ID, "cname": "lz4", "clevel": 5, "shuffle": 1}

    @property
    def display_name(self) -> str:
        return f"blosc {self._config.get('cname', 'lz4')}-{self._config.get('clevel', 5)}"

    def zarr_codec(self, itemsize: int) -> dict[str, Any]:
        c = self._config
        conf = {
            "typesize": int(c.get("typesize", itemsize)),
            "cname": c.get("cname", "lz4"),
            "clevel": int(c.get("clevel", 5)),
            "shuffle": _SHUFFLE.get(int(c.get("shuffle", 1)), "shuffle"),
            "blocksize": int(c.get("blocksize", 0)),
        }
        return {"name": "blosc", "configuration": conf}

    def declared_size(self, buf: Stream) -> int | None:
        """The header's nbytes (numcodecs' own parser), when its compressed size is the buffer's: blosc reads
        `cbytes` whatever the buffer holds."""
        from numcodecs.blosc import _cbuffer_sizes

        data = byte_view(buf)
        if len(data) < _HEADER:
            return None
        nbytes, cbytes, _ = _cbuffer_sizes(data)
        return int(nbytes) if cbytes == len(data) else None
