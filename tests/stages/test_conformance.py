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
import tracemalloc

import numpy as np
import pytest
import torch
import zarr
from zarr.registry import get_codec_class

import dctdata
from dctdata.errors import DctDataError, IntegrityError
from dctdata.format.webdataset.layout import MEMBER_RE
from dctdata.stages import RawStage, get_stage, parse_config, stage_classes
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


@pytest.mark.parametrize("cls", STAGES)
def test_without_a_device_decoder_a_device_batch_says_what_to_do(cls):
    q = arrays("int8")
    stage = configured(cls, q)
    _, offsets = batch(streams(stage, q))
    on_device = torch.empty(int(offsets[-1]), dtype=torch.uint8, device="meta")  # any buffer not on the CPU
    if stage.device_decoder(on_device.device) is not None:
        pytest.skip(f"{cls.codec_id} has a decoder for this device")
    with pytest.raises(
        DctDataError, match=r"^b: the .* stage has no decoder for meta buffers\. Decode the batch on the"
    ):
        stage.decode_batch(on_device, offsets, q.shape[1:], q.dtype, where="b")


@pytest.mark.parametrize("cls", STAGES)
def test_a_device_decoder_slots_into_the_hook(cls, monkeypatch):
    """What the device work fills in: (buffer, offsets, sample shape, dtype) -> (decoded, status per
    sample); a non-zero status is an IntegrityError naming the sample."""
    q = arrays("int8")
    stage = configured(cls, q)
    _, offsets = batch(streams(stage, q))
    on_device = torch.empty(int(offsets[-1]), dtype=torch.uint8, device="meta")
    calls, status = [], torch.zeros(len(q), dtype=torch.int32)

    def decoder(buffer, offs, shape, dtype):
        calls.append((buffer.device.type, tuple(offs.tolist()), shape, dtype))
        return torch.empty((len(offs) - 1, *shape), dtype=dtype, device=buffer.device), status

    monkeypatch.setattr(cls, "device_decoder", lambda self, device: decoder)
    got = stage.decode_batch(on_device, offsets, q.shape[1:], q.dtype)
    assert got.device.type == "meta" and got.shape == q.shape and got.dtype == torch.int8
    assert calls == [("meta", tuple(offsets.tolist()), q.shape[1:], torch.int8)]
    status[2] = 5
    with pytest.raises(
        IntegrityError, match=r"^batch sample 2: expected .* Got a stream the meta decoder refused \(status 5\)"
    ):
        stage.decode_batch(on_device, offsets, q.shape[1:], q.dtype)


@pytest.mark.cuda
@pytest.mark.parametrize("cls", STAGES)
def test_a_cuda_batch_decodes_like_the_cpu_or_says_it_cannot(cls):
    q = arrays("int8", (8, *SHAPE[1:]))
    stage = configured(cls, q)
    buffer, offsets = batch(streams(stage, q))
    cpu = stage.decode_batch(buffer, offsets, q.shape[1:], q.dtype)
    if stage.device_decoder(torch.device("cuda")) is None:
        with pytest.raises(DctDataError, match=r"has no decoder for cuda buffers"):
            stage.decode_batch(buffer.cuda(), offsets.cuda(), q.shape[1:], q.dtype)
        return
    got = stage.decode_batch(buffer.cuda(), offsets.cuda(), q.shape[1:], q.dtype)
    assert got.device.type == "cuda" and torch.equal(got.cpu(), cpu)


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
    m = dctdata.pack(x, out, codec=stage.get_config(), **settings)
    assert [f.lossless for f in m.fields if f.name in x] == [stage.get_config()] * len(x)
    return out, m


def flat(sample: dict) -> dict[str, torch.Tensor]:
    """A sample's tensors by name (a dct field with side information yields (coefficients, side))."""
    out = {}
    for k, v in sample.items():
        for i, t in enumerate(v if isinstance(v, (tuple, list)) else [v]):
            out[f"{k}[{i}]"] = t
    return out


@pytest.mark.parametrize("cls", STAGES)
def test_packs_round_trip_in_both_storages_and_verify(tmp_path, cls):
    samples = {}
    for storage in ("zarr", "webdataset"):
        out, m = pack(tmp_path, cls, storage)
        problems, summary = verify_dataset(out)
        assert problems == [] and summary["decoded"] == m.samples
        if storage == "zarr":
            ds = dctdata.open_dataset(out, as_dict=True)
            samples[storage] = [flat(ds[i]) for i in range(len(ds))]
        else:
            samples[storage] = [flat(s) for s in dctdata.open_dataset(out, as_dict=True, shuffle=False)]
    assert len(samples["zarr"]) == len(samples["webdataset"]) == 12
    for i, (a, b) in enumerate(zip(samples["zarr"], samples["webdataset"])):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), i
    assert samples["zarr"][0]["image[0]"].dtype == torch.int8


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
