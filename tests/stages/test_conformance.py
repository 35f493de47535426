"""The shared conformance suite of lossless stages, run over every registered stage (and the raw stage,
the manifest's `{}`): what the readers, writers and calibration rely on when they ask a stage instead of
comparing ids. A new stage registered in `dctdata.stages` runs all of it without a line here.

Config round trip; encode/decode round trip on int8/int16/float32/bool arrays (as the stage takes them),
into a caller's buffer and read-only; runs (`decode_many`) and batches cut from one buffer
(`decode_batch`) equal per-stream decoding; truncated and mutated streams raise an IntegrityError naming
the chunk or sample and nothing else escapes; a stream declaring more than the expected array is refused
without allocating it; the size bound holds on incompressible input; zarr-python opens a pack whose
stage it knows; member suffixes are unique; packs round-trip in both storages and verify clean.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr
from zarr.registry import get_codec_class

import dctdata
from dctdata.errors import DctDataError, IntegrityError, MissingExtraError
from dctdata.format import storages
from dctdata.format.webdataset.layout import MEMBER_RE
from dctdata.stages import CtxransStage, RawStage, ZstdStage, get_stage, parse_config, stage_classes
from dctdata.stages.base import DeviceDecoder
from dctdata.verify import verify_dataset

CF, MASK = 4, "square"
SHAPE = (3, 2, 4, CF * CF, 5)  # (B, C, Hb, K, Wb): three samples of coefficients
DTYPES = ("int8", "int16", "float32", "bool")
STAGES = [pytest.param(cls, id=cls.codec_id) for cls in stage_classes()] + [pytest.param(RawStage, id="raw")]


def arrays(dtype: str, shape=SHAPE, seed: int = 0) -> np.ndarray:
    """Coefficient-like values: mostly small, a few large (int16 beyond int8's range)."""
    rng = np.random.default_rng(seed)
    if dtype == "bool":
        return rng.random(shape) < 0.3
    v = rng.laplace(0, 2, shape) * np.where(rng.random(shape) < 0.05, 40, 1)
    if dtype == "float32":
        return v.astype(np.float32)
    info = np.iinfo(dtype)
    return np.clip(np.round(v), info.min, info.max).astype(dtype)


def configured(cls, q: np.ndarray):
    """The stage configured for arrays like q (a stage with a model fits it on them)."""
    if cls.integer_only and q.dtype not in (np.int8, np.int16):
        pytest.skip(f"{cls.codec_id} codes int8/int16 coefficients only")
    return cls.fit(q, CF, MASK)


def streams(stage, q: np.ndarray) -> list[bytes]:
    """One stream per sample, as the webdataset writer stores them (a one-sample array each)."""
    return [stage.encode(np.ascontiguousarray(s)) for s in q]


def test_every_stage_is_in_the_suite():
    assert [p.values[0] for p in STAGES[:-1]] == list(stage_classes()) and len(STAGES) >= 4


@pytest.mark.parametrize("cls", STAGES)
def test_config_round_trips_through_the_manifest(cls):
    stage = configured(cls, arrays("int8"))
    config = stage.get_config()
    assert json.loads(json.dumps(config)) == config  # JSON, as the manifest stores it
    assert config.get("id") == cls.codec_id or (cls is RawStage and config == {})
    again = cls.from_config(config)
    assert type(again) is cls and again.get_config() == config and list(again.get_config()) == list(config)
    assert parse_config(config) == config and type(get_stage(config)) is cls
    a = arrays("int8")
    assert again.encode(a) == stage.encode(a)  # the config is all a reader needs to rebuild the stage


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cls", STAGES)
def test_arrays_round_trip_exactly(cls, dtype):
    q = arrays(dtype)
    stage = configured(cls, q)
    blob = stage.encode(q)
    assert isinstance(blob, bytes)
    got = stage.decode(blob, q.shape, q.dtype, "x")
    assert got.dtype == q.dtype and got.shape == q.shape and np.array_equal(got, q)
    assert got.flags.writeable and got.flags.c_contiguous
    out = np.full(q.shape, 1, q.dtype)
    assert stage.decode(blob, q.shape, q.dtype, "x", out=out) is out and np.array_equal(out, q)
    assert np.array_equal(stage.decode(memoryview(blob), q.shape, q.dtype, "x", writeable=False), q)
    if not cls.needs_shape:
        declared = stage.declared_size(blob)
        assert declared == q.nbytes  # bytes stages say their size before decoding
        assert stage.decode(blob, (q.nbytes,), np.uint8, "x").tobytes() == q.tobytes()
        assert bytes(stage.decode_bounded(blob, q.nbytes, "x")) == q.tobytes()


@pytest.mark.parametrize("cls", STAGES)
def test_decode_checks_the_callers_buffer(cls):
    q = arrays("int8")
    stage = configured(cls, q)
    blob = stage.encode(q)
    with pytest.raises(DctDataError, match=r"out: expected a writeable C-contiguous int8 array of shape"):
        stage.decode(blob, q.shape, q.dtype, "x", out=np.empty(q.shape, np.int16))
    with pytest.raises(DctDataError, match=r"out: expected a writeable C-contiguous"):
        stage.decode(blob, q.shape, q.dtype, "x", out=np.empty(q.shape[::-1], np.int8).T)
    with pytest.raises(TypeError, match=r"out: expected a numpy array\. Got list"):
        stage.decode(blob, q.shape, q.dtype, "x", out=[])


@pytest.mark.parametrize("dtype", ["int8", "float32"])
@pytest.mark.parametrize("cls", STAGES)
def test_runs_decode_like_single_streams(cls, dtype):
    q = arrays(dtype)
    stage = configured(cls, q)
    bufs = streams(stage, q)
    one = [stage.decode(b, q.shape[1:], q.dtype, f"sample {i}") for i, b in enumerate(bufs)]
    out = np.zeros_like(q)
    assert stage.decode_many(bufs, out) == len(q) and np.array_equal(out, np.stack(one)) and np.array_equal(out, q)
    bufs[1] = bufs[1][: len(bufs[1]) // 2]
    assert stage.decode_many(bufs, np.zeros_like(q)) == 1  # how many decoded before the first that did not


def batch(bufs: list[bytes]) -> tuple[torch.Tensor, torch.Tensor]:
    """The streams back to back in one uint8 tensor, and the offsets that cut it."""
    ends = torch.tensor([0] + [len(b) for b in bufs], dtype=torch.int64).cumsum(0)
    buffer = torch.tensor(list(b"".join(bufs)), dtype=torch.uint8)
    return buffer, ends


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cls", STAGES)
def test_a_batch_on_the_cpu_decodes_like_each_stream(cls, dtype):
    q = arrays(dtype, (5, *SHAPE[1:]))
    stage = configured(cls, q)
    bufs = streams(stage, q)
    buffer, offsets = batch(bufs)
    one = np.stack([stage.decode(b, q.shape[1:], q.dtype, "s") for b in bufs])
    for dt in (torch.from_numpy(q[:0]).dtype, q.dtype, q.dtype.name):
        got = stage.decode_batch(buffer, offsets, q.shape[1:], dt)
        assert isinstance(got, torch.Tensor) and got.device.type == "cpu" and got.shape == q.shape
        assert np.array_equal(got.numpy(), one) and got.numpy().dtype == q.dtype
    empty = stage.decode_batch(buffer[:0], torch.zeros(1, dtype=torch.int64), q.shape[1:], q.dtype)
    assert empty.shape == (0, *q.shape[1:])


@pytest.mark.parametrize("cls", STAGES)
def test_a_bad_stream_in_a_batch_is_named_by_its_index(cls):
    q = arrays("int8", (5, *SHAPE[1:]))
    stage = configured(cls, q)
    bufs = streams(stage, q)
    bufs[3] = bufs[3][:-3]
    buffer, offsets = batch(bufs)
    with pytest.raises(IntegrityError, match=r"^batch 17 sample 3: "):
        stage.decode_batch(buffer, offsets, q.shape[1:], torch.int8, where="batch 17")


@pytest.mark.parametrize("cls", STAGES)
def test_a_batch_checks_its_arguments(cls):
    q = arrays("int8")
    stage = configured(cls, q)
    buffer, offsets = batch(streams(stage, q))
    with pytest.raises(TypeError, match=r"buffer: expected a 1-D uint8 tensor\. Got torch\.int8"):
        stage.decode_batch(buffer.view(torch.int8), offsets, q.shape[1:], q.dtype)
    with pytest.raises(TypeError, match=r"offsets: expected a 1-D int64 tensor of N\+1 entries\. Got torch\.int32"):
        stage.decode_batch(buffer, offsets.int(), q.shape[1:], q.dtype)
    for bad in (offsets.flip(0), offsets + 1, offsets[:0]):
        with pytest.raises(DctDataError, match=r"offsets: expected N\+1 non-decreasing positions in 0\.\.\d+"):
            stage.decode_batch(buffer, bad, q.shape[1:], q.dtype)
    with pytest.raises(DctDataError, match=r"dtype: expected a dtype numpy has .*Got torch\.bfloat16"):
        stage.decode_batch(buffer, offsets, q.shape[1:], torch.bfloat16)


class FakeDecoder(DeviceDecoder):
    """A device decoder that records its calls and decodes with the stage's host decoders."""

    def __init__(self, stage, status: torch.Tensor, shapes=None) -> None:
        self.stage, self.status, self.shapes, self.calls = stage, status, shapes, []

    def supports(self, sample_shape):
        return self.shapes is None or sample_shape in self.shapes

    def decode_batch(self, buffer, offsets, sample_shape, dtype):
        self.calls.append((buffer.device.type, tuple(offsets.tolist()), sample_shape, dtype))
        return self.stage._decode_batch_host(buffer, offsets, sample_shape, dtype, None, str, pin=False), self.status

    def describe(self, status):
        return f"fake status {status}"


@pytest.mark.parametrize("cls", STAGES)
def test_a_device_decoder_slots_into_the_hook(cls, monkeypatch):
    """The hook's contract: (buffer, offsets, sample shape, torch dtype) -> (decoded, status per sample); a
    non-zero status is an IntegrityError naming the sample and saying what the decoder reported."""
    q = arrays("int8")
    stage = configured(cls, q)
    buffer, offsets = batch(streams(stage, q))
    decoder = FakeDecoder(stage, torch.zeros(len(q), dtype=torch.int32))
    monkeypatch.setattr(cls, "device_decoder", lambda self, device: decoder)
    got = stage.decode_batch(buffer, offsets, q.shape[1:], q.dtype)
    assert torch.equal(got, torch.from_numpy(q))
    assert decoder.calls == [("cpu", tuple(offsets.tolist()), q.shape[1:], torch.int8)]
    decoder.status[2] = decoder.status[0] = 5
    with pytest.raises(
        IntegrityError,
        match=r"^batch sample 0: expected .* Got a stream the cpu decoder refused \(fake status 5\) \(1 more sample",
    ):
        stage.decode_batch(buffer, offsets, q.shape[1:], q.dtype)
    decoder.shapes = ()  # a sample shape the decoder does not take: the stage's host decoders
    assert torch.equal(stage.decode_batch(buffer, offsets, q.shape[1:], q.dtype), torch.from_numpy(q))
    assert len(decoder.calls) == 2


@pytest.mark.parametrize("cls", STAGES)
def test_the_stages_device_decoders_give_the_host_decoders_arrays_and_statuses(cls, monkeypatch):
    """Every stage's own hook, on the CPU where it has a decoder there (the entropy coder: its CPU decoder, and the
    lane emulator that runs the CUDA kernel's source), else on a stand-in of its CUDA decoder where one runs on
    the CPU (zstd: nvCOMP's stand-in): the arrays of the host path, and a bad stream is a status, not an error."""
    q = arrays("int8", (6, 1, 3, CF * CF, 5))
    stage = configured(cls, q)
    bufs = streams(stage, q)
    decoders, fake = [], None
    if stage.device_decoder(torch.device("cpu")) is not None:
        decoders = [stage.device_decoder(torch.device("cpu"))]
        if hasattr(decoders[0], "emulate"):
            decoders.append(type(decoders[0])(stage.codec, emulate=True))
    elif cls.codec_id == ZstdStage.codec_id:
        from gpu_fakes import install_fake_nvcomp

        import dctdata.stages.nvcomp_zstd as nz

        fake = install_fake_nvcomp(monkeypatch)
        monkeypatch.setattr(nz, "DEVICE_TYPES", ("cuda", "cpu"))
        decoders = [stage.device_decoder(torch.device("cpu"))]
    if not decoders:
        assert stage.device_decoder(torch.device("cpu")) is None
        pytest.skip(f"{stage.label}: no device decoder (its batches decode on the host)")
    for decoder in decoders:
        assert isinstance(decoder, DeviceDecoder)
        buffer, offsets = batch(bufs)
        got, status = decoder.decode_batch(buffer, offsets, q.shape[1:], torch.int8)
        assert torch.equal(got, torch.from_numpy(q)) and status.tolist() == [0] * len(q)
        assert torch.equal(stage.decode_batch(buffer, offsets, q.shape[1:], q.dtype), torch.from_numpy(q))
        if fake is None:
            cut = list(bufs)
            cut[4] = cut[4][: len(cut[4]) // 2]
            buffer, offsets = batch(cut)
        else:  # nvCOMP is undefined on bad frames (the readers keep them away): its report of a short frame
            fake.short_frames = {4}
        got, status = decoder.decode_batch(buffer, offsets, q.shape[1:], torch.int8)
        assert [bool(s) for s in status.tolist()] == [False] * 4 + [True, False]
        assert torch.equal(got[:4], torch.from_numpy(q[:4])) and torch.equal(got[5], torch.from_numpy(q[5]))
        assert decoder.describe(int(status[4])) != decoder.describe(0)


@pytest.mark.parametrize("cls", STAGES)
def test_which_stages_decode_on_a_cuda_device(cls, monkeypatch):
    """The entropy coder (its NVRTC kernel) and zstd (nvCOMP, the `gpu` extra) decode on CUDA; the others decode
    on the host and copy. Building the hook needs no GPU."""
    stage = configured(cls, arrays("int8"))
    cuda = torch.device("cuda")
    if cls.codec_id == ZstdStage.codec_id:
        monkeypatch.setitem(sys.modules, "nvidia.nvcomp", None)
        with pytest.raises(MissingExtraError, match=r"zstd on the GPU needs nvCOMP: pip install 'dctdata\[gpu\]'"):
            stage.device_decoder(cuda)
        from gpu_fakes import install_fake_nvcomp

        install_fake_nvcomp(monkeypatch)
    decoder = stage.device_decoder(cuda)
    on_device = {c.codec_id for c in stage_classes() if c.codec_id in (ZstdStage.codec_id, CtxransStage.codec_id)}
    assert (decoder is not None) == (cls.codec_id in on_device)
    assert decoder is None or isinstance(decoder, DeviceDecoder)


@pytest.mark.cuda
@pytest.mark.parametrize("cls", STAGES)
def test_a_cuda_batch_decodes_like_the_cpu(cls):
    """On CUDA: through the stage's decoder there, or on the host and copied; the CPU's arrays either way, and a
    bad stream named by its sample."""
    q = arrays("int8", (8, *SHAPE[1:]))
    stage = configured(cls, q)
    bufs = streams(stage, q)
    buffer, offsets = batch(bufs)
    cpu = stage.decode_batch(buffer, offsets, q.shape[1:], q.dtype)
    got = stage.decode_batch(buffer.cuda(), offsets.cuda(), q.shape[1:], q.dtype)
    assert got.device.type == "cuda" and torch.equal(got.cpu(), cpu)
    if cls.codec_id == ZstdStage.codec_id:
        return  # nvCOMP is undefined on bad frames: the readers' checks keep them away from it (check_stream)
    bufs[3] = bufs[3][: len(bufs[3]) // 2]
    buffer, offsets = batch(bufs)
    with pytest.raises(IntegrityError, match=r"^b sample 3: "):
        stage.decode_batch(buffer.cuda(), offsets.cuda(), q.shape[1:], q.dtype, where="b")


@pytest.mark.parametrize("cls", STAGES)
def test_truncated_streams_raise_naming_the_chunk(cls):
    q = arrays("int16")
    stage = configured(cls, q)
    blob = stage.encode(q)
    for cut in sorted({0, 1, 5, len(blob) // 2, len(blob) - 1}):
        with pytest.raises(IntegrityError, match=r"^shard 2: field 'x' chunk 7: "):
            stage.decode(blob[:cut], q.shape, q.dtype, lambda: "shard 2: field 'x' chunk 7")


@pytest.mark.parametrize("cls", STAGES)
def test_mutated_streams_raise_naming_the_chunk_or_decode_to_the_expected_array(cls):
    """Without a checksum a changed byte may decode to other values (the zarr chunks and webdataset shards
    carry crc32c and sha256 for that); it must never decode to another shape or escape as anything but an
    IntegrityError."""
    q = arrays("int8")
    stage = configured(cls, q)
    blob = stage.encode(q)
    rng = np.random.default_rng(1)
    outcomes = {"raised": 0, "decoded": 0}
    for trial in range(300):
        bad = bytearray(blob)
        for _ in range(1 + trial % 3):
            bad[rng.integers(len(bad))] = rng.integers(256)
        try:
            got = stage.decode(bytes(bad), q.shape, q.dtype, f"chunk {trial}")
        except IntegrityError as exc:
            assert str(exc).startswith(f"chunk {trial}: ")
            outcomes["raised"] += 1
        else:
            assert got.shape == q.shape and got.dtype == q.dtype
            outcomes["decoded"] += 1
    assert outcomes["raised"] + outcomes["decoded"] == 300
    assert outcomes["raised"] > 0 or cls is RawStage  # raw bytes carry no structure to check


@pytest.mark.parametrize("cls", STAGES)
def test_a_stream_of_more_than_the_expected_array_is_refused_without_allocating_it(cls):
    big = np.zeros((64, 2, 32, CF * CF, 32), np.int8)  # 2 MiB that code to a few bytes: a "bomb"
    stage = configured(cls, big)
    blob = stage.encode(big)
    small = (1, *big.shape[1:3], CF * CF, 5)
    if stage.declared_size(blob) is not None:
        assert stage.declared_size(blob) == big.nbytes
    tracemalloc.start()
    try:
        with pytest.raises(IntegrityError, match=r"^chunk 0: expected "):
            stage.decode(blob, small, np.int8, "chunk 0")
        if hasattr(stage, "decode_bounded") and not isinstance(stage, RawStage):
            with pytest.raises(IntegrityError, match=r"^m: expected a stream of at most 4096 decoded bytes\. Got one"):
                stage.decode_bounded(blob, 4096, "m")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < big.nbytes // 8


@pytest.mark.parametrize("cls", STAGES)
def test_the_size_bound_holds_on_incompressible_input(cls):
    rng = np.random.default_rng(2)
    for shape in ((1, 1, 1, CF * CF, 1), (1, 2, 3, CF * CF, 7), (4, 2, 16, CF * CF, 40)):
        noise = rng.integers(-128, 128, shape, dtype=np.int8)
        stage = configured(cls, noise)
        assert len(stage.encode(noise)) <= stage.max_encoded_size(noise.nbytes)
        assert stage.max_encoded_size(noise.nbytes) >= noise.nbytes
    assert isinstance(cls.decode_bytes_per_us, int) and cls.decode_bytes_per_us > 0  # the reader's cost estimate


def test_member_suffixes_are_unique():
    """Each stage's webdataset members have a suffix of their own (a stage that shares one does so for
    packs written before stages had their own, and says so), and it makes a plain member name."""
    classes = [*stage_classes(), RawStage]
    own = [c.member_suffix for c in classes if not c.shares_suffix]
    assert len(own) == len(set(own))
    assert all(c.member_suffix in own for c in classes if c.shares_suffix)
    for c in classes:
        assert re.fullmatch(r"[a-z0-9]+(\.[a-z0-9]+)*", c.member_suffix)
        assert MEMBER_RE.match(f"000000001.image.{c.member_suffix}").group(2) == f"image.{c.member_suffix}"


def source(n: int = 12, with_arrays: bool = True) -> dict[str, np.ndarray]:
    g = np.random.default_rng(3)
    image = g.normal(size=(n, 2, 24, 40)).cumsum(-1).cumsum(-2).astype(np.float32)
    out = {"image": image}
    if with_arrays:
        out |= {"mask": g.random((n, 3, 5)) < 0.5, "label": np.arange(n, dtype=np.int64)}
    return out


def pack(tmp_path, cls, storage: str):
    """A pack whose every field goes through the stage (an array stage: its dct field alone)."""
    x = source(with_arrays=not cls.needs_shape)
    settings = dict(cf=CF, mask=MASK, quant="int8", quiet=True, format=storage)
    if not cls.needs_shape:
        settings["fields"] = ["image=dct", "mask=array", "label=label"]
    stage = configured(cls, arrays("int8"))  # a model fitted on coefficients of as many channels codes these too
    out = tmp_path / f"{cls.__name__}-{storage}"
    m = dctdata.pack(x, out, lossless=stage.get_config(), **settings)
    assert [f.lossless for f in m.fields if f.name in x] == [stage.get_config()] * len(x)
    return out, m


def flat(sample: dict) -> dict[str, torch.Tensor]:
    """A sample's tensors by name (a dct field with side information yields (coefficients, side))."""
    out = {}
    for k, v in sample.items():
        for i, t in enumerate(v if isinstance(v, (tuple, list)) else [v]):
            out[f"{k}[{i}]"] = t
    return out


STORAGES = list(storages.names())
_PACKS: dict = {}


@pytest.fixture(scope="module")
def packs_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("stage-packs")


def packed(root, cls, storage: str):
    """The pack of `cls` in `storage`, made once per module."""
    key = (cls, storage)
    if key not in _PACKS:
        _PACKS[key] = pack(root, cls, storage)
    return _PACKS[key]


def opened(out, **kw):
    """The pack at `out` in sample order (a streaming storage unshuffled)."""
    streaming = not storages.get(dctdata.format.read_manifest(out).storage).reader.random_access
    return dctdata.open_dataset(out, as_dict=True, **({"shuffle": False} if streaming else {}), **kw)


def read_samples(out, **kw) -> list[dict[str, torch.Tensor]]:
    ds = opened(out, **kw)
    if isinstance(ds, torch.utils.data.IterableDataset):
        return [flat(s) for s in ds]
    return [flat(ds[i]) for i in range(len(ds))]


def test_every_storage_is_in_the_suite():
    assert list(storages.names()) == STORAGES and {"zarr", "webdataset"} <= set(STORAGES)


@pytest.mark.parametrize("storage", STORAGES)
@pytest.mark.parametrize("cls", STAGES)
def test_every_storage_and_stage_round_trips_and_verifies(packs_dir, cls, storage):
    """A pack of each stage in each storage verifies clean and reads back the raw zarr pack's values (the stage
    is lossless); with decode="device" (on the CPU here) the decompressor gives decode="cpu"'s arrays bit for
    bit."""
    out, m = packed(packs_dir, cls, storage)
    problems, summary = verify_dataset(out)
    assert problems == [] and summary["decoded"] == m.samples
    want = read_samples(packed(packs_dir, RawStage, STORAGES[0])[0])
    got = read_samples(out)
    assert len(got) == len(want) == 12
    for i, (a, b) in enumerate(zip(want, got)):
        assert set(b) <= set(a) and all(torch.equal(a[k], b[k]) for k in b), i
    assert got[0]["image[0]"].dtype == torch.int8
    from dctdata.loaders.distributed import make_loader

    cpu, dev = opened(out), opened(out, decode="device")
    layer = dev.decompressor("image")
    pairs = list(zip(make_loader(cpu, batch_size=5, shuffle=False), make_loader(dev, batch_size=5, shuffle=False)))
    assert len(pairs) == 3
    for a, b in pairs:
        assert torch.equal(layer(b["image"]), layer(a["image"]))


@pytest.mark.parametrize("storage", STORAGES)
@pytest.mark.parametrize("cls", STAGES)
def test_every_storage_and_stage_detects_corruption(packs_dir, tmp_path, cls, storage):
    """A flipped byte in the largest stored file: verify names the file, and reading the pack (decode="cpu" and
    "device") raises an error naming it before any stage decodes the bytes."""
    out = Path(shutil.copytree(packed(packs_dir, cls, storage)[0], tmp_path / "pack"))
    checksums = dctdata.format.read_manifest(out).checksums
    rel = max(checksums, key=lambda r: checksums[r]["bytes"])
    raw = bytearray((out / rel).read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    (out / rel).write_bytes(bytes(raw))
    problems, _ = verify_dataset(out)
    assert problems and any(rel in p for p in problems), problems
    for decode in ("cpu", "device"):
        with pytest.raises(DctDataError, match=re.escape(rel)):
            read_samples(out, decode=decode)


@pytest.mark.filterwarnings("ignore:Numcodecs codecs are not in the Zarr version 3 specification")
@pytest.mark.parametrize("cls", STAGES)
def test_zarr_python_opens_a_pack_of_a_stage_it_knows(tmp_path, cls):
    stage = configured(cls, arrays("int8"))
    names = [c["name"] for c in stage.zarr_codecs(2)]
    assert names[: 1 - cls.needs_shape] == ["bytes"][: 1 - cls.needs_shape]  # a bytes stage takes the bytes codec's
    for name in names:
        try:
            get_codec_class(name)
        except KeyError:
            pytest.skip(f"zarr-python has no codec {name!r}: only dctdata reads this stage")
    out, m = pack(tmp_path, cls, "zarr")
    ds = dctdata.open_dataset(out)
    arrays_ = json.loads((out / "manifest.json").read_text())["layout"]["arrays"]
    stored = ds.reader.read_samples(ds.fields, list(range(m.samples)))
    opened = 0
    for f in ds.fields:
        if "inline" in arrays_[f.name]:
            continue  # a small side partner kept in the manifest
        theirs = zarr.open_array(out / f.name, mode="r")[:]
        assert theirs.dtype == stored[f.name].dtype and theirs.tobytes() == stored[f.name].tobytes(), f.name
        opened += 1
    assert opened == 3
