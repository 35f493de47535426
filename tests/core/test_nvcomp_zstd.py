"""The nvCOMP zstd device decoder (dctdata.stages.nvcomp_zstd) and the group-ahead driver
(dctdata.loaders.decode_ahead).

Without a GPU: the missing-extra error, and every piece of logic around nvCOMP against a stand-in of its Python
API (`FakeNvcomp`: the calls and arguments dctdata makes, as nvidia-nvcomp-cu13 6.0's docstrings describe them,
decoding with python-zstandard on CPU tensors and refusing buffers that are not 8-byte aligned, as nvCOMP's
zstd does): realignment, padded outputs, several frames per sample, config reuse, the status check naming
samples, the fallback without decode(out=), merging batches, and DecodeAhead's order of calls. With a GPU and
nvCOMP (`-m cuda`): bit-exact decodes of zstd-19 frames against the CPU decoder.
"""

import sys

import numpy as np
import pytest
import torch
from gpu_fakes import install_fake_nvcomp

import dctdata.stages.nvcomp_zstd as nz
from dctdata.errors import DctDataError, IntegrityError, MissingExtraError
from dctdata.loaders.decode_ahead import DecodeAhead
from dctdata.stages.zstd_frames import FrameTable, encode_frames, frame_table

zstandard = pytest.importorskip("zstandard")


@pytest.fixture
def nv(monkeypatch):
    return install_fake_nvcomp(monkeypatch)


def coefficients(n, seed=0):
    return np.random.default_rng(seed).laplace(0, 6, n).clip(-127, 127).astype(np.int8).tobytes()


def collated(streams, align=1):
    """One uint8 tensor of the streams back to back and its (N+1) offsets; with `align` > 1 each stream starts at
    a multiple of it (zero padding between), and the third value is the FrameTable that says where they end."""
    parts, starts, ends, at = [], [], [], 0
    for s in streams:
        pad = -at % align
        parts.append(bytes(pad) + s)
        starts.append(at + pad)
        at += pad + len(s)
        ends.append(at)
    data = torch.frombuffer(bytearray(b"".join(parts)), dtype=torch.uint8)
    offsets = np.array([*starts, at])
    return data, offsets, (starts, ends)


def padded_table(bounds, sample_bytes):
    starts, ends = bounds
    n = len(starts)
    return FrameTable(np.array(starts), np.array(ends), np.full(n, sample_bytes), np.arange(n))


def test_without_nvcomp_every_entry_point_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "nvidia.nvcomp", None)
    assert not nz.available()
    for call in (
        lambda: nz.nvcomp(),
        lambda: nz.decode_batch(torch.zeros(8, dtype=torch.uint8), [0, 8], (8,), torch.uint8),
        lambda: nz.use_torch_allocator(),
    ):
        with pytest.raises(MissingExtraError, match=r"needs nvCOMP: pip install 'dctdata\[gpu\]' \(installs nvi"):
            call()
    assert issubclass(MissingExtraError, ImportError) and issubclass(MissingExtraError, DctDataError)


@pytest.mark.parametrize("align", [8, 1])  # 1: streams at odd offsets are realigned on the device first
def test_decode_batch_of_one_frame_per_sample(nv, align):
    raws = [coefficients(4 * 7 * 9, s) for s in range(5)]
    data, offsets, bounds = collated([zstandard.ZstdCompressor(level=19).compress(r) for r in raws], align)
    frames = padded_table(bounds, 252) if align > 1 else None
    values, status = nz.decode_batch(data, offsets, (4, 7, 9), torch.int8, frames)
    assert values.shape == (5, 4, 7, 9) and values.dtype == torch.int8
    assert values.numpy().tobytes() == b"".join(raws)
    status.check()
    assert status.failed() == [] and status.sizes.tolist() == [252] * 5
    (codec,) = nv.codecs
    assert codec.kwargs == dict(algorithm="Zstd", device_id=0, cuda_stream=0, bitstream_kind="RAW")
    in_offsets = nv.arrays[0][0]
    assert all(o % 8 == 0 for o in in_offsets)
    if align == 8:
        assert in_offsets == offsets[:-1].tolist()  # no copy
    else:
        assert in_offsets != offsets[:-1].tolist()  # realigned


def test_outputs_that_would_start_unaligned_are_decoded_padded_then_packed(nv):
    raws = [coefficients(13, s) for s in range(4)]  # 13-byte samples: outputs at 0, 13, 26, 39
    data, offsets, _ = collated([zstandard.ZstdCompressor(level=3).compress(r) for r in raws])
    values, status = nz.decode_batch(data, offsets, (13,), torch.int8)
    assert values.numpy().tobytes() == b"".join(raws)
    assert nv.arrays[1][0] == [0, 16, 32, 48]  # the decoder's output offsets
    status.check()


def test_several_frames_per_sample(nv):
    raws = [coefficients(5000, s) for s in range(3)]
    streams = [encode_frames(raws[0], 19, 1024), encode_frames(raws[1], 19), encode_frames(raws[2], 19, 4096)]
    data, offsets, _ = collated(streams)
    frames = frame_table(data.numpy(), offsets, 5000)
    values, status = nz.decode_batch(data, offsets, (2, 2500), torch.int8, frames)
    assert values.numpy().tobytes() == b"".join(raws) and len(nv.arrays[0][0]) == 5 + 1 + 2
    status.check()


def test_configs_are_built_once_per_list_of_frame_sizes(nv):
    data, offsets, _ = collated([zstandard.ZstdCompressor(level=3).compress(coefficients(64, s)) for s in range(4)])
    for _ in range(3):
        nz.decode_batch(data, offsets, (64,), torch.int8)
    assert nv.configs == 1 and nv.decodes == 3
    nz.decode_batch(data, offsets[:3], (64,), torch.int8)
    assert nv.configs == 2 and len(nv.codecs) == 1


def test_a_frame_decoded_short_is_an_integrity_error_naming_the_sample(nv):
    data, offsets, _ = collated([zstandard.ZstdCompressor(level=3).compress(coefficients(64, s)) for s in range(3)])
    nv.short_frames = {1}
    _values, status = nz.decode_batch(data, offsets, (64,), torch.int8)
    assert status.failed() == [1]
    with pytest.raises(IntegrityError, match=r"batch: expected nvCOMP to decode .* in sample 1 \(63 of 64 bytes\)"):
        status.check()


def test_without_decode_into_out_the_decoder_copies_from_nvcomps_outputs(nv, caplog):
    raws = [coefficients(40, s) for s in range(3)]
    data, offsets, _ = collated([zstandard.ZstdCompressor(level=3).compress(r) for r in raws])
    nv.refuse_out = True
    with caplog.at_level("WARNING", logger="dctdata.stages.nvcomp_zstd"):
        values, status = nz.decode_batch(data, offsets, (40,), torch.int8)
    assert values.numpy().tobytes() == b"".join(raws) and "copying from nvCOMP's own outputs" in caplog.text
    status.check()
    nz.decode_batch(data, offsets, (40,), torch.int8)  # the decoder remembers
    assert caplog.text.count("refused") == 1


def test_argument_errors(nv, monkeypatch):
    data, offsets, _ = collated([zstandard.ZstdCompressor(level=3).compress(coefficients(64))])
    with pytest.raises(TypeError, match=r"buffer: expected a contiguous 1-D uint8 torch.Tensor. Got torch.int8"):
        nz.decode_batch(data.view(torch.int8), offsets, (64,), torch.int8)
    with pytest.raises(TypeError, match=r"dtype: expected a torch.dtype"):
        nz.decode_batch(data, offsets, (64,), "int8")
    with pytest.raises(DctDataError, match=r"sample_shape: expected positive sizes. Got \(0, 64\)"):
        nz.decode_batch(data, offsets, (0, 64), torch.int8)
    with pytest.raises(DctDataError, match=r"frames: sample 0: expected frames declaring 128 bytes. Got 64"):
        nz.decode_batch(data, offsets, (128,), torch.int8, frame_table(data.numpy(), offsets, 64))
    with pytest.raises(DctDataError, match="frames: expected byte ranges within the buffer's"):
        nz.decode_batch(data, [0, data.numel() + 8], (64,), torch.int8)
    monkeypatch.setattr(nz, "DEVICE_TYPES", ("cuda",))
    with pytest.raises(DctDataError, match=r"buffer: expected a CUDA tensor .* Got one on cpu"):
        nz.decode_batch(data, offsets, (64,), torch.int8)


def test_a_codec_that_cannot_start_is_a_clear_error(nv, monkeypatch):
    def broken(**kwargs):
        raise RuntimeError("CUDA driver version is insufficient for CUDA runtime version")

    monkeypatch.setattr(nv, "Codec", broken)
    data, offsets, _ = collated([zstandard.ZstdCompressor(level=3).compress(coefficients(64))])
    with pytest.raises(DctDataError, match="nvCOMP: could not create a zstd codec on cpu: RuntimeError: CUDA driver"):
        nz.decode_batch(data, offsets, (64,), torch.int8)


def test_use_torch_allocator_sets_and_resets_nvcomps_allocator(nv):
    nz.use_torch_allocator()
    assert nv.allocator is nz._TorchBlock
    nz.use_torch_allocator(False)
    assert nv.allocator is None


def batches_of(counts, size=48, frames=False):
    """Loader batches of Streams (some with frame tables), and the raw bytes each should decode to."""
    out, raws, seed = [], [], 0
    for n in counts:
        raw = [coefficients(size, seed + i) for i in range(n)]
        seed += n
        streams = [encode_frames(r, 3, 16) if frames else zstandard.ZstdCompressor(level=3).compress(r) for r in raw]
        data, offsets, _ = collated(streams)  # unaligned streams: the decoder realigns them
        table = frame_table(data.numpy(), offsets, size) if frames else None
        out.append(nz.Streams(data, offsets, table))
        raws.append(b"".join(raw))
    return out, raws


@pytest.mark.parametrize("frames", [False, True])
def test_zstd_batches_decode_several_batches_in_one_call(nv, frames):
    batches, raws = batches_of([3, 1, 4], frames=frames)
    decoder = nz.ZstdBatches((48,), torch.int8)
    results = decoder.finish(decoder.start(batches, first=0))
    assert [r.numpy().tobytes() for r in results] == raws and nv.decodes == 1


def test_zstd_batches_name_the_batch_and_sample_of_a_failed_frame(nv):
    batches, _ = batches_of([3, 2, 2])
    nv.short_frames = {4}  # merged frame 4 = batch 1, sample 1 -> numbered from first=10: batch 11
    decoder = nz.ZstdBatches((48,), torch.int8)
    with pytest.raises(IntegrityError, match=r"zstd device decode: .* in batch 11 sample 1 \(47 of 48 bytes\)"):
        decoder.finish(decoder.start(batches, first=10))
    with pytest.raises(TypeError, match=r"batches: expected dctdata.stages.nvcomp_zstd.Streams"):
        decoder.start([(batches[0].data, batches[0].offsets)])
    with pytest.raises(DctDataError, match="batches: expected at least one batch"):
        decoder.start([])


class Recorder:
    """A group decoder that logs its calls; results are the batches themselves."""

    def __init__(self):
        self.log = []

    def start(self, batches, first):
        self.log.append(("start", first, list(batches)))
        return (first, list(batches))

    def finish(self, pending):
        self.log.append(("finish", pending[0]))
        return pending[1]


def test_decode_ahead_queues_the_next_group_before_handing_this_one_out():
    rec = Recorder()
    ahead = DecodeAhead(range(7), rec, group=3)
    seen = []
    for b in ahead:
        seen.append(b)
        rec.log.append(("yield", b))
    assert seen == list(range(7)) and len(ahead) == 7
    assert rec.log == [
        ("start", 0, [0, 1, 2]), ("start", 3, [3, 4, 5]), ("finish", 0), ("yield", 0), ("yield", 1), ("yield", 2),
        ("start", 6, [6]), ("finish", 3), ("yield", 3), ("yield", 4), ("yield", 5),
        ("finish", 6), ("yield", 6),
    ]  # fmt: skip
    assert list(ahead) == list(range(7))  # a new pass


def test_decode_ahead_errors():
    with pytest.raises(
        TypeError, match=r"decoder: expected a Decompress layer .*, or an object with start\(batches, f"
    ):
        DecodeAhead([1], object())
    with pytest.raises(DctDataError, match=r"group: expected a positive int .* Got 0"):
        DecodeAhead([1], Recorder(), group=0)
    with pytest.raises(TypeError, match="batches: expected an iterable"):
        DecodeAhead(3, Recorder())
    with pytest.raises(TypeError, match="len\\(DecodeAhead\\): expected batches with a length"):
        len(DecodeAhead(iter([1]), Recorder()))

    class Lossy(Recorder):
        def finish(self, pending):
            return pending[1][:-1]

    with pytest.raises(DctDataError, match=r"decoder: expected one result per batch \(2 for batches 0..1\). Got 1"):
        list(DecodeAhead([1, 2], Lossy(), group=2))


def test_decode_ahead_with_zstd_batches_end_to_end(nv):
    batches, raws = batches_of([4, 4, 4, 4, 3])
    decoded = list(DecodeAhead(batches, nz.ZstdBatches((48,), torch.int8), group=2))
    assert [d.numpy().tobytes() for d in decoded] == raws and nv.decodes == 3


# --- with a GPU and nvCOMP (`pytest -m cuda`; skipped where nvidia-nvcomp is not installed) ---------------------


@pytest.fixture
def real_nvcomp():
    if not nz.available():
        pytest.skip("nvidia-nvcomp is not installed (pip install 'dctdata[gpu]')")
    nz._DECODERS.clear()
    yield nz.nvcomp()
    torch.cuda.synchronize()


@pytest.mark.cuda
@pytest.mark.parametrize("align", [8, 1])
@pytest.mark.parametrize("sample", [(1, 256, 256), (3, 7, 13)])  # 64 KiB samples; 273-byte ones (padded outputs)
def test_cuda_nvcomp_decodes_zstd19_frames_bit_exactly(real_nvcomp, align, sample):
    n = int(np.prod(sample))
    raws = [coefficients(n, s) for s in range(33)]
    data, offsets, bounds = collated([zstandard.ZstdCompressor(level=19).compress(r) for r in raws], align)
    if align == 1:
        frames = frame_table(data.numpy(), offsets, n)  # the host check the readers run in the workers
    else:
        frames = padded_table(bounds, n)
    values, status = nz.decode_batch(data.cuda(), offsets, sample, torch.int8, frames)
    status.check()
    assert values.is_cuda and values.shape == (33, *sample)
    assert values.cpu().numpy().tobytes() == b"".join(raws)


@pytest.mark.cuda
def test_cuda_nvcomp_several_frames_per_sample_and_the_torch_allocator(real_nvcomp):
    n = 1 << 20
    raws = [coefficients(n, s) for s in range(4)]
    streams = [encode_frames(r, 19, 64 << 10) for r in raws]
    data, offsets, _ = collated(streams)
    frames = frame_table(data.numpy(), offsets, n)
    assert len(frames) == 4 * 16
    for torch_alloc in (False, True):
        nz.use_torch_allocator(torch_alloc)
        values, status = nz.decode_batch(data.cuda(), offsets, (n,), torch.int8, frames)
        status.check()
        assert values.cpu().numpy().tobytes() == b"".join(raws)
    nz.use_torch_allocator(False)


@pytest.mark.cuda
def test_cuda_decode_ahead_over_device_batches(real_nvcomp):
    batches, raws = batches_of([32] * 5 + [7], size=4096)
    on_device = [nz.Streams(b.data.cuda(), b.offsets, b.frames) for b in batches]
    decoded = list(DecodeAhead(on_device, nz.ZstdBatches((4096,), torch.int8), group=4))
    assert [d.cpu().numpy().tobytes() for d in decoded] == raws


def test_device_decoder_is_the_stage_hook(nv, monkeypatch):
    """The function the readers' decode_stored calls: numpy dtype in, checked tensor out, streams named."""
    monkeypatch.setattr(nz, "DEVICE_TYPES", ("cuda",))
    assert nz.device_decoder("cpu") is None  # the CPU decoder runs there
    monkeypatch.setattr(nz, "DEVICE_TYPES", ("cuda", "cpu"))
    decode = nz.device_decoder(torch.device("cpu"))
    raws = [coefficients(2 * 30, s) for s in range(3)]
    data, offsets, _ = collated([zstandard.ZstdCompressor(level=19).compress(r) for r in raws])
    out = decode(data, torch.from_numpy(offsets), (2, 15), np.dtype("<i2"))
    assert out.dtype == torch.int16 and out.shape == (3, 2, 15) and out.numpy().tobytes() == b"".join(raws)
    nv.short_frames = {2}
    with pytest.raises(IntegrityError, match=r"zstd device decode \(nvCOMP\): .* in stream 2 \(59 of 60 bytes\)"):
        decode(data, offsets, (60,), np.uint8)
    with pytest.raises(IntegrityError, match=r"in field 'x' sample 7 \(59 of 60 bytes\)"):
        decode(data, offsets, (60,), np.uint8, where=lambda k: f"field 'x' sample {5 + k}")
    monkeypatch.setitem(sys.modules, "nvidia.nvcomp", None)
    with pytest.raises(MissingExtraError, match=r"pip install 'dctdata\[gpu\]'"):
        nz.device_decoder("cpu")


def zstd_pack(tmp_path, fmt):
    """A small zstd-19 pack of two-channel fields, side values in its streams (the readers' test packs' kind)."""
    for needed in ("zarr", "numcodecs", "webdataset", "torchdata"):  # packing and loading (a bare GPU image lacks them)
        pytest.importorskip(needed)
    from sample_fields import smooth_fields

    import dctdata

    src = tmp_path / "src.npz"
    np.savez(src, image=smooth_fields(12, 2, 24, 40, seed=3), label=np.arange(12, dtype=np.int64))
    out = tmp_path / fmt
    kw = {"writer_options": {"samples_per_shard": 4}} if fmt == "webdataset" else {}
    dctdata.pack(str(src), str(out), format=fmt, target_psnr=35, lossless={"id": "zstd", "level": 19}, quiet=True, **kw)
    return out


@pytest.mark.parametrize("fmt", ["zarr", "webdataset"])
def test_device_decoder_on_the_readers_stored_batches(nv, tmp_path, fmt, monkeypatch):
    """The streams `open_dataset(decode="device")` yields (zarr chunks, webdataset members with their .npy
    headers) decode through the hook to the bytes the CPU decoder gives."""
    import dctdata
    from dctdata.decoder.stored import decode_stored
    from dctdata.loaders.distributed import make_loader

    path = zstd_pack(tmp_path, fmt)
    ds = dctdata.open_dataset(str(path), decode="device", as_dict=True, **({"shuffle": False} if fmt != "zarr" else {}))
    lossless = ds.decompressor("image").lossless
    decode = nz.device_decoder("cpu")
    batches = list(make_loader(ds, batch_size=5, shuffle=False))
    assert batches
    for b in batches:
        stored = b["image"]
        form = stored.form
        shape, dtype = ((form.rows, *form.shape), np.dtype(form.dtype)) if form.raw else ((form.decoded,), np.uint8)
        cpu = decode_stored(lossless, stored.data, stored.offsets, shape, dtype)
        dev = decode(stored.data, stored.offsets, shape, np.dtype(dtype).newbyteorder("<"))
        assert torch.equal(dev, cpu)


@pytest.mark.cuda
@pytest.mark.parametrize("fmt", ["zarr", "webdataset"])
def test_cuda_decode_device_through_nvcomp_is_cpu_decode_bit_for_bit(real_nvcomp, tmp_path, fmt, monkeypatch):
    """`open_dataset(decode="device")` on CUDA: the zstd stage's hook (`ZstdStage.device_decoder`) decodes the
    batches with nvCOMP, and the layer's arrays are those of decode="cpu", bit for bit."""
    import dctdata
    from dctdata.loaders.distributed import make_loader

    path = zstd_pack(tmp_path, fmt)
    calls = []
    decode_batch = nz.decode_batch

    def spy(*a, **k):
        calls.append(1)
        return decode_batch(*a, **k)

    monkeypatch.setattr(nz, "decode_batch", spy)
    kw = {"shuffle": False} if fmt != "zarr" else {}
    cpu = dctdata.open_dataset(str(path), as_dict=True, **kw)
    dev = dctdata.open_dataset(str(path), decode="device", as_dict=True, **kw)
    layer = dev.decompressor("image").to("cuda")
    pairs = zip(make_loader(cpu, batch_size=5, shuffle=False), make_loader(dev, batch_size=5, shuffle=False))
    for a, b in pairs:
        want = a["image"]
        want = tuple(t.cuda() for t in want) if isinstance(want, (tuple, list)) else want.cuda()
        assert torch.equal(layer(b["image"].to("cuda")), layer(want))
    assert calls
