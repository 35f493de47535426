"""One shard file of a zarr v3 sharded array, as dctdata writes it (the zarr sharding codec's layout):
the inner chunks back to back, each its codec's bytes followed by their crc32c (4 bytes, little
endian), then the index: (offset, nbytes) as little-endian uint64 per chunk slot (2^64 - 1 twice for a
slot with no chunk), followed by the crc32c of the index. `layout.check_shard_index` reads it back."""

from __future__ import annotations

import google_crc32c
import numpy as np

from dctdata.format.zarr.layout import MISSING


def crc32c(data: bytes) -> bytes:
    return int(google_crc32c.value(data)).to_bytes(4, "little")


def shard_bytes(chunks: list[bytes], chunks_per_shard: int) -> bytes:
    """A shard holding `chunks` (already coded) in its first slots; the other slots are empty."""
    entries = np.full((chunks_per_shard, 2), MISSING, dtype="<u8")
    body, offset = [], 0
    for i, data in enumerate(chunks):
        framed = data + crc32c(data)
        entries[i] = (offset, len(framed))
        body.append(framed)
        offset += len(framed)
    index = entries.tobytes()
    return b"".join(body) + index + crc32c(index)
