"""The entropy stage on volumes (8x8x8 blocks, masks "cube" and "tetra"): the CPU coder's round trips on the
(B, C, Db, Hb, K, Wb) arrays a volume field stores, the rows view a "cube" block row is coded as, and the GPU
decoder (`dctdata.entropy.device.decode_batch`: its lane emulator here, the CUDA kernel where there is one) bit
for bit against the CPU decoder, segments (stream mode 3) included.

    pytest -q tests/core/test_volume_entropy.py
    pytest -q -m cuda tests/core/test_volume_entropy.py      # on a GPU
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from ctx_streams import batch

from dctdata.codec import transform3d
from dctdata.datasets.volumes import power_law_field, velocity_component
from dctdata.entropy import device
from dctdata.entropy.ctxrans import MODE_SEGMENTS, CtxCodec, CtxCodecError, coded_plane, supports


def volume_coefficients(cf: int, mask: str, size=(24, 40, 48), n: int = 3, step: float = 0.25, dtype=np.int8):
    """Quantized 3-D DCT coefficients (N, 1, Db, Hb, K, Wb) of synthetic turbulence-like volumes."""
    x = np.concatenate([power_law_field(n=n - 1, size=size, seed=3), velocity_component(n=1, size=size, seed=4)])
    x = x / x.std()
    c = transform3d.compress(torch.from_numpy(x[:, None]), cf=cf, mask=mask).numpy()
    k = c.shape[-2]
    q = np.rint(c / (step * (1 + np.arange(k) / 32.0))[:, None])
    info = np.iinfo(dtype)
    return np.ascontiguousarray(np.clip(q, info.min, info.max).astype(dtype))


def test_coded_plane_and_supports():
    square, split = coded_plane(8, "cube")
    assert split == 8 and len(square) == 64 and square[9] == (1, 1)
    tetra, split = coded_plane(6, "tetra")
    assert split == 1 and tetra == transform3d.kept_frequencies(6, "tetra") and len(tetra) == 56
    assert supports(8, "cube") and supports(6, "tetra") and supports(8, "square")
    assert not supports(7, "tetra")  # 84 kept (u, v, w) triples: more than a coded row's 64 planes
    q = volume_coefficients(7, "tetra", size=(8, 8, 8), n=2)
    with pytest.raises(CtxCodecError, match=r"cf=7 mask='tetra': expected at most 64 kept frequencies\. Got 84"):
        CtxCodec.fit(q, 7, "tetra")


@pytest.mark.parametrize("cf, mask", [(8, "cube"), (3, "cube"), (6, "tetra"), (4, "tetra")])
@pytest.mark.parametrize("dtype", [np.int8, np.int16])
def test_round_trip_of_volume_arrays(cf, mask, dtype):
    q = volume_coefficients(cf, mask, dtype=dtype, step=0.25 if dtype == np.int8 else 0.02)
    assert q.shape[-2] == transform3d.num_kept(cf, mask) and np.abs(q).max() > 1
    codec = CtxCodec.fit(q, cf, mask)
    again = CtxCodec.from_config(json.loads(json.dumps(codec.get_config())))
    for i in range(len(q)):
        blob = codec.encode(q[i : i + 1])
        assert len(blob) < q[i].nbytes  # the model saves bytes on smooth fields
        out = again.decode(blob, q[i : i + 1].shape, dtype)  # the (B, C, Db, Hb, K, Wb) a field stores
        np.testing.assert_array_equal(out, q[i : i + 1])
        rows = q[i : i + 1].reshape(1, 1, -1, *q.shape[-2:])  # its (B, C, Db * Hb, K, Wb) view decodes the same
        np.testing.assert_array_equal(again.decode(blob, rows.shape, dtype), rows)
        into = np.zeros_like(q[i : i + 1])
        again.decode(blob, out=into)
        np.testing.assert_array_equal(into, q[i : i + 1])
    many = np.zeros((len(q), *q[:1].shape), dtype)
    assert again.decode_many([codec.encode(q[i : i + 1]) for i in range(len(q))], many) == len(q)
    np.testing.assert_array_equal(many[:, 0], q)


def test_the_cube_rows_view_beats_zstd_on_turbulence():
    """Coding a cube block row as cf rows of (v, w) planes gives the "top" context the same frequency one depth
    frequency lower; the stream is smaller than zstd-19 of the same coefficients."""
    import zstandard

    q = volume_coefficients(8, "cube", size=(32, 32, 32))
    codec = CtxCodec.fit(q, 8, "cube")
    ours = sum(len(codec.encode(q[i : i + 1])) for i in range(len(q)))
    zstd = sum(len(zstandard.ZstdCompressor(level=19).compress(q[i].tobytes())) for i in range(len(q)))
    assert ours < zstd


def test_volume_shapes_are_checked():
    q = volume_coefficients(4, "cube", size=(8, 16, 16), n=2)
    codec = CtxCodec.fit(q, 4, "cube")
    blob = codec.encode(q[:1])
    with pytest.raises(CtxCodecError, match=r"shape: expected K=64 and C <= 1\. Got \(1, 1, 1, 2, 63, 2\)"):
        codec.decode(blob, (1, 1, 1, 2, 63, 2), np.int8)
    with pytest.raises(CtxCodecError, match=r"q: expected K=64 and C <= 1\. Got shape \(1, 1, 1, 2, 16, 2\)"):
        codec.encode(np.zeros((1, 1, 1, 2, 16, 2), np.int8))
    with pytest.raises(CtxCodecError, match=r"expected 6 positive ints \(B, C, Db, Hb, K, Wb\)"):
        codec.decode(blob, (1, 1, 0, 2, 64, 2), np.int8)
    with pytest.raises(CtxCodecError, match=r"expected K=64 and C <= 1"):  # a 5-D shape of the wrong K
        codec.decode(blob, (1, 1, 2, 16, 2), np.int8)
    with pytest.raises(CtxCodecError):  # a volume's stream declared as another volume's shape fails, not garbage
        codec.decode(blob, (1, 1, 2, 2, 64, 2), np.int8)


def volume_set(cf=8, mask="cube", size=(40, 64, 64), n=3):
    q = volume_coefficients(cf, mask, size=size, n=n)
    codec = CtxCodec.fit(q, cf, mask)
    return codec, q, [codec.encode(q[i : i + 1]) for i in range(len(q))]


@pytest.mark.parametrize("cf, mask, size", [(8, "cube", (40, 64, 64)), (4, "tetra", (16, 24, 40))])
def test_device_decoder_takes_volume_shapes(cf, mask, size):
    codec, q, bufs = volume_set(cf, mask, size)
    shape = q.shape[1:]  # (C, Db, Hb, K, Wb)
    rows = device.kernel_shape(codec, shape)
    if mask == "cube":
        assert rows == (1, shape[1] * shape[2] * cf, cf * cf, shape[4])
        mode, nseg = codec.stream_mode((1, *rows))
        assert mode == MODE_SEGMENTS and nseg > 1 and device.units_per_sample(codec, shape) == nseg
    else:
        assert rows == (1, shape[1] * shape[2], shape[3], shape[4])
    buffer, offsets = batch(bufs)
    for cpu_decoder in (False, True):  # the lane emulator (the kernel's program) and the CPU decoder
        out, status = device.decode_batch(codec, buffer, offsets, shape, torch.int8, cpu_decoder=cpu_decoder)
        assert out.shape == q.shape and status.tolist() == [0] * len(q)
        np.testing.assert_array_equal(out.numpy(), q)


def test_device_decoder_statuses_on_damaged_volume_streams():
    codec, q, bufs = volume_set(8, "cube", (24, 32, 32), n=2)
    cut = bufs[1][: len(bufs[1]) // 2]
    buffer, offsets = batch([bufs[0], cut])
    out, status = device.decode_batch(codec, buffer, offsets, q.shape[1:], torch.int8)
    assert status[0] == 0 and status[1] != 0
    np.testing.assert_array_equal(out[0].numpy(), q[0])
    assert not out[1].any()  # a failed sample is zeros
    with pytest.raises(CtxCodecError):
        codec.decode(cut, q[1:2].shape, np.int8)
    with pytest.raises(CtxCodecError, match=r"or a volume's \(C, Db, Hb, K, Wb\) with K=512"):
        device.decode_batch(codec, buffer, offsets, (1, 3, 4, 500, 4), torch.int8)


@pytest.mark.cuda
@pytest.mark.parametrize("cf, mask, size", [(8, "cube", (40, 64, 64)), (4, "tetra", (16, 24, 40))])
def test_kernel_decodes_volume_streams_as_the_cpu_does(cf, mask, size):
    codec, q, bufs = volume_set(cf, mask, size)
    buffer, offsets = batch(bufs)
    out, status = device.decode_batch(codec, buffer.cuda(), offsets.cuda(), q.shape[1:], torch.int8)
    assert out.is_cuda and status.tolist() == [0] * len(q)
    np.testing.assert_array_equal(out.cpu().numpy(), q)
