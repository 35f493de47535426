"""zstd (numcodecs' Zstd) over an array's raw bytes: the default stage of array and label fields and of
float coefficients (level 9: packing speed), and `--lossless zstd` (level 19: the read-speed choice,
bytes traded for decode speed in the loader workers; README "Lossless stage").

Encoding is numcodecs' (the stored frames are what zarr-python and tensorstore read: zarr v3's "zstd"
codec). Decoding is python-zstandard's with one context per thread: numcodecs makes a new decompression
context per call, a large share of the work on the small chunks a loader reads (docs/benchmarks/design.md),
and zstandard decodes exactly the frame's declared size (one-shot into a buffer of that size: it cannot write
past it).

On CUDA (`decode="device"`) a batch's frames are decoded by nvCOMP in one call (`NvcompZstdDecoder`, over
`dctdata.stages.nvcomp_zstd`; the `gpu` extra, `pip install 'dctdata[gpu]'`, and a clear error naming it where it is
missing). nvCOMP is undefined on invalid input, so a stream leaves a reader's worker only after
`check_stream` walked its frame and block headers (`dctdata.stages.zstd_frames.walk`). On the CPU the stage's own
decoder runs.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    import torch

from dctdata.errors import DctDataError, IntegrityError
from dctdata.stages.base import BytesStage, DeviceDecoder, Stream, byte_view, described

CODEC_ID = "zstd"
LEVELS = (1, 22)
DEFAULT_CONFIG: dict[str, Any] = {"id": CODEC_ID, "level": 9}  # arrays, labels, float coefficients
MAX_CONFIG: dict[str, Any] = {"id": CODEC_ID, "level": 19}  # `--lossless zstd`, and "auto"'s alternative
_MAGIC = 0xFD2FB528

_LOCAL = threading.local()


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


class ZstdStage(BytesStage):
    codec_id = CODEC_ID
    member_suffix = "npy.zst"
    decode_bytes_per_us = 1_000
    option = CODEC_ID
    option_spellings = ("zstd", f"zstd:LEVEL (LEVEL in {LEVELS[0]}..{LEVELS[1]})")
    option_help = (
        "zstd (zstd-19, the read-speed choice: more bytes than the entropy coder, decoded faster in the loader "
        "workers), "
        f"zstd:LEVEL ({LEVELS[0]}..{LEVELS[1]})"
    )

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> ZstdStage:
        level, checksum = config.get("level", 0), config.get("checksum", False)
        if set(config) - {"id", "level", "checksum"} or not _is_int(level) or not isinstance(checksum, bool):
            raise DctDataError(f"expected a zstd config {{'id', 'level': int, 'checksum': bool}}. Got {dict(config)!r}")
        return cls(config, cls._numcodecs(config))

    @classmethod
    def default_config(cls) -> dict[str, Any]:
        return dict(DEFAULT_CONFIG)

    @classmethod
    def from_option(cls, arg: str | None) -> dict[str, Any] | None:
        if arg is None:
            return dict(MAX_CONFIG)
        if arg.isdigit() and LEVELS[0] <= int(arg) <= LEVELS[1]:
            return {"id": CODEC_ID, "level": int(arg)}
        return None

    def zarr_codec(self, itemsize: int) -> dict[str, Any]:
        c = self._config
        return {
            "name": "zstd",
            "configuration": {"level": int(c.get("level", 0)), "checksum": bool(c.get("checksum", False))},
        }

    @property
    def display_name(self) -> str:
        return f"zstd-{self._config.get('level', 0)}"

    def max_encoded_size(self, nbytes: int) -> int:
        """ZSTD_COMPRESSBOUND, plus room for the frame header."""
        small = (128 * 1024 - nbytes) >> 11 if nbytes < 128 * 1024 else 0
        return nbytes + (nbytes >> 8) + small + 64

    def declared_size(self, buf: Stream) -> int | None:
        """The first frame's Frame_Content_Size (RFC 8878, section 3.1.1), parsed by hand: numcodecs has no
        call for it. The writer makes one frame; anything after it is refused when decoding."""
        data = byte_view(buf)
        if len(data) < 5 or int.from_bytes(data[:4], "little") != _MAGIC:
            return None
        fhd = data[4]
        fcs_flag, single, did_flag = fhd >> 6, (fhd >> 5) & 1, fhd & 3
        at = 5 + (0 if single else 1) + (0, 1, 2, 4)[did_flag]
        width = (1 if single else 0, 2, 4, 8)[fcs_flag]
        if width == 0 or len(data) < at + width:
            return None
        value = int.from_bytes(data[at : at + width], "little")
        return value + 256 if width == 2 else value

    def _decode_exact(
        self, buf: Stream, size: int, target: npt.NDArray[np.uint8] | None, writeable: bool
    ) -> npt.NDArray[np.uint8]:
        """One frame that declares `size` bytes (checked by the caller), as a writeable array (a copy of the
        bytes python-zstandard returns, or `target`) or, `writeable=False`, a read-only view of them. Anything
        after the frame (a second frame, trailing bytes) is refused: the writer makes exactly one."""
        dctx = getattr(_LOCAL, "dctx", None)
        if dctx is None:
            import zstandard

            dctx = _LOCAL.dctx = zstandard.ZstdDecompressor()
        data = dctx.decompress(byte_view(buf), max_output_size=size, allow_extra_data=False)
        if len(data) != size:
            raise IntegrityError(f"expected one zstd frame of {size} decoded bytes. Got {len(data)}")
        arr = np.frombuffer(data, np.uint8)
        if target is not None:
            target[...] = arr
            return target
        return arr.copy() if writeable else arr

    def check_stream(self, stream: Stream, decoded: int, where: str | Callable[[], str]) -> None:
        """The stream is one zstd frame declaring exactly `decoded` bytes, with well-formed frame and block headers
        whose blocks lie inside it (what a device decoder may be given: nvCOMP is undefined on anything else)."""
        super().check_stream(stream, decoded, where)
        from dctdata.stages.zstd_frames import walk

        frames = walk(stream, described(where))
        if len(frames) != 1:
            said = described(where)
            raise IntegrityError(f"{said}: expected one zstd frame (the writer makes one). Got {len(frames)}")

    def device_decoder(self, device: torch.device) -> NvcompZstdDecoder | None:
        """`NvcompZstdDecoder` on CUDA (MissingExtraError naming the `gpu` extra without nvCOMP); None elsewhere."""
        import torch

        import dctdata.stages.nvcomp_zstd as nvcomp_zstd

        if torch.device(device).type not in nvcomp_zstd.DEVICE_TYPES:
            return None
        nvcomp_zstd.nvcomp()  # MissingExtraError: pip install 'dctdata[gpu]'
        return NvcompZstdDecoder()


class NvcompZstdDecoder(DeviceDecoder):
    """A batch of zstd streams, one frame a sample, decoded by nvCOMP in one call
    (`dctdata.stages.nvcomp_zstd.decode_batch`:
    aligned buffers, cached decompression configs, torch's allocator). A sample whose frame nvCOMP reports at
    another size than it declared gets status 1. The status is read when the stage checks it (a synchronization:
    the loaders' grouped decode, `nvcomp_zstd.ZstdBatches`, amortizes nvCOMP's per-call cost instead)."""

    def decode_batch(
        self, buffer: torch.Tensor, offsets: torch.Tensor, sample_shape: tuple[int, ...], dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        import dctdata.stages.nvcomp_zstd as nvcomp_zstd

        values, report = nvcomp_zstd.decode_batch(buffer, offsets.cpu(), sample_shape, dtype)
        status = torch.zeros(len(values), dtype=torch.int32)
        status[report.failed()] = 1
        return values, status

    def describe(self, status: int) -> str:
        if status == 1:
            return "nvCOMP decoded its frame to another size than the frame declares"
        return super().describe(status)


@functools.lru_cache(maxsize=1)
def max_stage() -> ZstdStage:
    """zstd-19, built once ("auto" compares with it; calibration sizes float planes with it)."""
    return ZstdStage.from_config(MAX_CONFIG)
