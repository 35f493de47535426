"""The context-modelled rANS entropy coder of `dctdata.entropy` as a lossless stage: integer DCT
coefficients only, with its fitted model in its config (so in the manifest). It codes arrays of a shape
the caller states (B, C, Hb, K, Wb), or one sample's (C, Hb, K, Wb): its stream holds no shape or size,
the readers know both from the manifest. The C kernel loads only where a pack uses this stage.

On a device (`decode="device"`) its batches go through `CtxransDeviceDecoder`: the NVRTC CUDA kernel of
`dctdata.entropy.device` on CUDA, the CPU decoder on the CPU (or the lane emulator, the kernel's own source
compiled as C). The kernel decodes one sample per stream: zarr chunks of several samples are decoded on the
host and copied.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    import torch

from dctdata.entropy.ctxrans import CODEC_ID  # in the manifest and as a zarr codec name
from dctdata.stages.base import DeviceDecoder, Stage, Stream
from dctdata.stages.zstd import max_stage


class CtxransStage(Stage):
    codec_id = CODEC_ID
    member_suffix = "ctx"  # a webdataset member: the side information's raw float32 bytes, then the stream
    needs_shape = True
    integer_only = True
    decode_bytes_per_us = 200
    decodes_runs = True

    def __init__(self, config: Mapping[str, Any], codec: Any) -> None:
        super().__init__(config)
        self.codec = codec  # dctdata.entropy.CtxCodec

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> CtxransStage:
        from dctdata.entropy import CtxCodec

        return cls(config, CtxCodec.from_config(config))

    @classmethod
    def fit(cls, q: npt.NDArray[Any], cf: int, mask: str) -> CtxransStage:
        """The coder with its model fitted on `q` (B, C, Hb, K, Wb) int8/int16."""
        from dctdata.entropy import CtxCodec

        codec = CtxCodec.fit(q, cf, mask)
        return cls(codec.get_config(), codec)

    def model_nbytes(self) -> int:
        return len(json.dumps(self._config))

    def estimate_size(self, q: npt.NDArray[Any], cf: int, mask: str, integer: bool) -> int:
        return estimate(q, cf, mask, integer)

    def zarr_codec(self, itemsize: int) -> dict[str, Any]:
        # no configuration (optional in zarr v3; the model is in manifest.json): packs before format 8 wrote
        # {"model": "manifest.json"}, which `dctdata.format.zarr.metadata.check_chunk_codecs` reads alike
        return {"name": CODEC_ID}

    def encode(self, data: npt.NDArray[Any] | bytes) -> bytes:
        q = np.asarray(data)
        return bytes(self.codec.encode(q[None] if q.ndim == 4 else q))

    def _decode(
        self,
        buf: Stream,
        shape: tuple[int, ...],
        dtype: np.dtype[Any],
        out: npt.NDArray[Any] | None,
        writeable: bool,
    ) -> npt.NDArray[Any]:
        one = len(shape) == 4  # one sample: coded as a batch of one
        if out is not None:
            self.codec.decode(buf, out=out[None] if one else out)
            return out
        got: npt.NDArray[Any] = self.codec.decode(buf, (1, *shape) if one else shape, dtype)
        return got.reshape(shape)

    def decode_many(self, bufs: Sequence[Stream], out: npt.NDArray[Any]) -> int:
        """One kernel call for the run (it releases the GIL once)."""
        return int(self.codec.decode_many(list(bufs), out[:, None] if out.ndim == 5 else out))

    def device_decoder(self, device: torch.device) -> CtxransDeviceDecoder | None:
        """`CtxransDeviceDecoder` on CUDA and on the CPU; None elsewhere."""
        return CtxransDeviceDecoder(self.codec) if _device_type(device) in DEVICE_TYPES else None


DEVICE_TYPES = ("cuda", "cpu")


def _device_type(device: torch.device | str) -> str:
    import torch

    return torch.device(device).type


class CtxransDeviceDecoder(DeviceDecoder):
    """Batches of this stage's streams through `dctdata.entropy.device.decode_batch`, one sample a stream: on CUDA
    its NVRTC kernel (compiled on first use; cuda-python's NVRTC bindings, in torch's CUDA wheels), on the CPU
    the CPU decoder, or the lane emulator with `emulate=True` (the kernel's source compiled as C, which CI runs
    to check the kernel's program against the CPU decoder). Statuses are the CPU decoder's errors."""

    def __init__(self, codec: Any, emulate: bool = False) -> None:
        self.codec = codec  # dctdata.entropy.CtxCodec
        self.emulate = emulate

    def supports(self, sample_shape: tuple[int, ...]) -> bool:
        """One sample a stream: (C, Hb, K, Wb), or (1, C, Hb, K, Wb) (a zarr chunk of one sample)."""
        return len(sample_shape) == 4 or (len(sample_shape) == 5 and sample_shape[0] == 1)

    def decode_batch(
        self, buffer: torch.Tensor, offsets: torch.Tensor, sample_shape: tuple[int, ...], dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        from dctdata.entropy import device

        cpu_decoder = buffer.device.type == "cpu" and not self.emulate
        out, status = device.decode_batch(
            self.codec, buffer, offsets, tuple(sample_shape)[-4:], dtype, cpu_decoder=cpu_decoder
        )
        return out.view(len(status), *sample_shape), status

    def describe(self, status: int) -> str:
        from dctdata.entropy import device

        return device.describe(status)


def estimate(q: npt.NDArray[Any], cf: int, mask: str, integer: bool) -> int:
    """Calibration's size of planes q (R, C, 1, K, Wb) with this coder: its one-pass estimate for integer
    planes (a fresh fit's starting layout, no encoding: each block row a sample of one row, the cheapest
    consistent proxy); zstd-19's bytes for other planes and for volume blocks with more kept frequencies
    than a coded row holds (`dctdata.entropy.ctxrans.supports`), which it cannot code."""
    from dctdata.entropy import CtxCodec
    from dctdata.entropy.ctxrans import supports

    if not integer or not supports(cf, mask):
        return max_stage().estimate_size(q, cf, mask, integer)

    return int(CtxCodec.estimate_bytes(q, cf, mask))
