"""LZ4 (numcodecs' LZ4) over an array's raw bytes: `--lossless lz4`, the stage that decodes fastest in
the loader workers and stores the most. zarr-python reads its chunks ("numcodecs.lz4", outside the zarr v3
specification: tensorstore does not).

numcodecs' LZ4 stream starts with its decoded size (4 bytes, little-endian), so decoding is bounded like
zstd's: the size is checked against the expected array before anything is decoded, and numcodecs
refuses a stream that decodes to any other size.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dctdata.errors import DctDataError
from dctdata.stages.base import BytesStage, Stream, byte_view

CODEC_ID = "lz4"
_HEADER = 4


class LZ4Stage(BytesStage):
    codec_id = CODEC_ID
    member_suffix = "npy.lz4"
    decode_bytes_per_us = 8_000  # zstd's rate times LZ4's decode speed over zstd-9's on the same chunks
    option = CODEC_ID
    option_spellings = (CODEC_ID,)
    option_help = "lz4 (numcodecs' LZ4: the fastest decode, the most bytes)"

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> LZ4Stage:
        acceleration = config.get("acceleration", 1)
        if isinstance(acceleration, bool) or not isinstance(acceleration, int) or acceleration < 1:
            raise DctDataError(f"expected an lz4 acceleration of 1 or more. Got {dict(config)!r}")
        return cls(config, cls._numcodecs(config))

    @classmethod
    def default_config(cls) -> dict[str, Any]:
        return {"id": CODEC_ID, "acceleration": 1}

    @classmethod
    def from_option(cls, arg: str | None) -> dict[str, Any] | None:
        return cls.default_config() if arg is None else None

    def zarr_codec(self, itemsize: int) -> dict[str, Any]:
        return {"name": "numcodecs.lz4", "configuration": {"acceleration": int(self._config.get("acceleration", 1))}}

    def max_encoded_size(self, nbytes: int) -> int:
        """LZ4_COMPRESSBOUND plus the size header."""
        return nbytes + nbytes // 255 + 16 + _HEADER

    def declared_size(self, buf: Stream) -> int | None:
        data = byte_view(buf)
        return int.from_bytes(data[:_HEADER], "little") if len(data) >= _HEADER else None
