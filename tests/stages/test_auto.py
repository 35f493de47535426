"""The pack setting "auto": integer coefficients get the smaller of the fitted entropy coder and zstd-19
(the model's bytes counted; a tie to zstd-19), float coefficients zstd-9, both sized per writer chunk as the
pack stores them; calibration asks it as it asks a stage."""

import json

import numpy as np
import pytest

import dctdata
import dctdata.stages.auto as auto
from dctdata.encoder.calibrate import SUB_VALUES
from dctdata.format.zarr import layout
from dctdata.stages import AUTO, DEFAULT_CODEC, ZSTD_MAX, Auto, CtxransStage, ZstdStage, for_setting, get_stage

CF, MASK = 3, "square"


def smooth(n=64, seed=0) -> np.ndarray:
    """Coefficients of smooth fields: mostly small, the entropy coder's home ground."""
    return np.random.default_rng(seed).laplace(0, 0.3, (n, 1, 6, CF * CF, 8)).round().astype(np.int8)


def periodic(n=16) -> np.ndarray:
    """One short pattern repeated: long matches, zstd's home ground."""
    tile = np.random.default_rng(1).integers(-60, 60, (1, 1, 1, CF * CF, 8), dtype=np.int8)
    return np.ascontiguousarray(np.broadcast_to(tile, (n, 1, 6, CF * CF, 8)))


def test_the_setting_names_the_policy_or_a_stage():
    assert isinstance(for_setting(AUTO), Auto) and for_setting(ZSTD_MAX) is get_stage(ZSTD_MAX)
    assert for_setting(None).get_config() == {} and for_setting({}).get_config() == {}


def test_floats_get_zstd9():
    assert Auto().choose(smooth().astype(np.float32), CF, MASK, False, SUB_VALUES) == DEFAULT_CODEC


def test_integers_get_the_smaller_stage_model_included():
    q = smooth()
    chosen = Auto().choose(q, CF, MASK, True, SUB_VALUES)
    coder = CtxransStage.fit(q, CF, MASK)
    assert chosen == coder.get_config()
    zstd = auto.chunked_bytes(get_stage(ZSTD_MAX), q, None)
    assert auto.chunked_bytes(coder, q, None) + coder.model_nbytes() < zstd
    assert Auto().choose(periodic(), CF, MASK, True, SUB_VALUES) == ZSTD_MAX


def test_a_tie_goes_to_zstd19(monkeypatch):
    monkeypatch.setattr(CtxransStage, "model_nbytes", lambda self: 0)
    q = smooth()
    zstd = get_stage(ZSTD_MAX)
    monkeypatch.setattr(CtxransStage, "encode", lambda self, data: b"\0" * len(zstd.encode(data)))
    assert Auto().choose(q, CF, MASK, True, SUB_VALUES) == ZSTD_MAX
    monkeypatch.setattr(CtxransStage, "encode", lambda self, data: b"\0" * (len(zstd.encode(data)) - 1))
    assert Auto().choose(q, CF, MASK, True, SUB_VALUES)["id"] == CtxransStage.codec_id


@pytest.mark.parametrize("integer", [True, False])
def test_calibration_sizes_like_the_entropy_coder(integer):
    q = smooth()
    if not integer:
        q = q.astype(np.float32)
    assert Auto().estimate_size(q, CF, MASK, integer) == CtxransStage.fit(smooth(), CF, MASK).estimate_size(
        q, CF, MASK, integer
    )


def test_the_fit_is_on_evenly_spaced_samples(monkeypatch):
    monkeypatch.setattr(auto, "FIT_VALUES", 2 * smooth()[0].size)
    seen = []
    fit = CtxransStage.fit.__func__
    monkeypatch.setattr(
        CtxransStage, "fit", classmethod(lambda cls, q, cf, mask: seen.append(len(q)) or fit(cls, q, cf, mask))
    )
    Auto().choose(smooth(), CF, MASK, True, SUB_VALUES)
    assert seen == [2]


def repeated(n=12, seed=2) -> np.ndarray:
    """n copies of one sample of 16 KiB coefficients (a chunk each): one zstd stream over them is nearly free,
    one frame per chunk is not."""
    one = np.random.default_rng(seed).laplace(0, 0.8, (1, 1, 32, CF * CF, 57)).round().astype(np.int8)
    return np.ascontiguousarray(np.broadcast_to(one, (n, *one.shape[1:])))


def test_zstd19_is_sized_per_writer_chunk_not_as_one_stream():
    q = repeated()
    assert auto.writer_chunk(q[0].nbytes) == 1
    zstd, coder = get_stage(ZSTD_MAX), CtxransStage.fit(q, CF, MASK)
    assert len(zstd.encode(q)) < len(coder.encode(q))  # one stream: zstd-19 (what "auto" used to compare)
    assert auto.chunked_bytes(coder, q, None) + coder.model_nbytes() < auto.chunked_bytes(zstd, q, None)
    assert Auto().choose(q, CF, MASK, True, SUB_VALUES) == coder.get_config()


def test_the_decision_codes_a_few_chunks(monkeypatch):
    q = repeated(n=40)
    coded = []
    encode = ZstdStage.encode
    counted = lambda self, data: coded.append(np.asarray(data).size) or encode(self, data)  # noqa: E731
    monkeypatch.setattr(ZstdStage, "encode", counted)
    Auto().choose(q, CF, MASK, True, SUB_VALUES)  # zstd-1's bound, then zstd-19 (repeats: zstd's ground)
    assert len(coded) == 2 * auto.SAMPLE_CHUNKS and sum(coded) == 2 * auto.SAMPLE_CHUNKS * q[0].size
    coded.clear()
    Auto().choose(q, CF, MASK, True, q[0].size // 4)  # a chunk over the budget: its first block rows
    assert coded == [q[0].size // 4] * 2


def test_writer_chunks_are_the_zarr_writers():
    assert auto.CHUNK_BYTES == layout.CHUNK_BYTES
    assert [auto.writer_chunk(b) for b in (1, 300, 8192, 8193, 16384, 10**6)] == [16384, 32, 2, 1, 1, 1]


def _fmri_like(n=16, seed=0) -> np.ndarray:
    """int16 slices of a bright blob on a dark, lightly noisy background (an fMRI slice's look)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[:48, :64]
    blob = np.exp(-(((yy - 24) / 14.0) ** 2 + ((xx - 32) / 20.0) ** 2) * 2)
    texture = np.cos(xx / 3.0) * np.sin(yy / 5.0)
    x = [1500 * blob * (1 + 0.2 * texture * (k % 4)) + rng.normal(0, 40, blob.shape) for k in range(n)]
    return np.abs(np.stack(x)).round().astype(np.int16)


def _field(n=16, seed=1) -> np.ndarray:
    """Smooth float fields (the entropy coder's ground)."""
    f = np.fft.irfft2(np.random.default_rng(seed).normal(size=(n, 64, 33)) / (1 + np.arange(33)) ** 1.5, s=(64, 64))
    return f.astype(np.float32)


def _texture(n=8) -> np.ndarray:
    """A periodic texture with small shifts (long matches: zstd-19's ground)."""
    tile = np.random.default_rng(3).normal(size=(8, 8))
    return np.stack([np.roll(np.tile(tile, (4, 8)), k, axis=1) for k in range(n)]).astype(np.float32)


@pytest.mark.parametrize("make", [_fmri_like, _field, _texture])
def test_the_estimate_is_the_packs_stored_bytes(tmp_path, make):
    """Every writer chunk coded: exactly the payload of the pack's shards; a few of them, scaled: within a few
    percent of it."""
    src, out = tmp_path / "x.npy", tmp_path / "pack"
    np.save(src, make())
    manifest = dctdata.pack(str(src), str(out), target_psnr=40, quiet=True)
    field = manifest.field(kind="dct")
    q, _ = dctdata.open_dataset(str(out), fields=[field.name], as_dict=True)[0 : manifest.samples][field.name]
    q = q.numpy()
    doc = json.loads((out / "manifest.json").read_text())
    entry = doc["layout"]["arrays"][field.name]
    chunk, shard = entry["chunk"], entry["shard"]
    assert chunk == auto.writer_chunk(q[0].nbytes)
    files = [k for k in manifest.checksums if k.startswith(f"{field.name}/c.")]
    payload = sum(manifest.checksums[k]["bytes"] for k in files)
    if shard > chunk:  # shard indexes (a one-chunk shard has none, format 8)
        payload -= len(files) * (layout.INDEX_ENTRY_BYTES * (shard // chunk) + layout.CRC_BYTES)
    payload -= -(-len(q) // chunk) * layout.CRC_BYTES  # each chunk's checksum
    stage = get_stage(field.lossless)
    assert auto.chunked_bytes(stage, q, None) == payload
    assert auto.chunked_bytes(stage, q, 3) == pytest.approx(payload, rel=0.05)


def test_calibration_reports_every_chunk_but_zstd19s_few(monkeypatch):
    q = repeated(n=20)
    coded = []
    for cls in (ZstdStage, CtxransStage):
        encode = cls.encode
        monkeypatch.setattr(
            cls, "encode", lambda self, data, encode=encode: coded.append(len(data)) or encode(self, data)
        )
    coder = CtxransStage.fit(q, CF, MASK)
    assert auto.stored_bytes(coder, q, SUB_VALUES) == auto.chunked_bytes(coder, q, None) and len(coded) == 2 * len(q)
    coded.clear()
    assert auto.stored_bytes(get_stage(ZSTD_MAX), q, SUB_VALUES) > 0 and len(coded) == auto.SAMPLE_CHUNKS
    coded.clear()
    assert auto.stored_bytes(get_stage(DEFAULT_CODEC), q, SUB_VALUES) > 0 and len(coded) == len(q)


def test_zstd19_runs_only_where_it_could_win(monkeypatch):
    """Where the entropy coder stores at most SURE x zstd-1's bytes, zstd-19 (slow) is not tried: its bytes are
    never below that share of zstd-1's (the module docstring), and the choice is the one sizing it gives.
    Elsewhere it is sized as before."""
    calls = []
    encode = ZstdStage.encode
    counted = lambda self, data: calls.append(self.get_config()["level"]) or encode(self, data)  # noqa: E731
    monkeypatch.setattr(ZstdStage, "encode", counted)
    rng = np.random.default_rng(0)  # larger planes than smooth()'s: the model is a small share of the bytes
    q = rng.laplace(0, 0.3, (32, 1, 16, CF * CF, 32)).round().astype(np.int8)
    coder = CtxransStage.fit(q, CF, MASK)
    coded = auto.chunked_bytes(coder, q, auto.SAMPLE_CHUNKS, SUB_VALUES) + coder.model_nbytes()
    fast = auto.chunked_bytes(auto.fast_stage(), q, auto.SAMPLE_CHUNKS, SUB_VALUES)
    slow = auto.chunked_bytes(get_stage(ZSTD_MAX), q, auto.SAMPLE_CHUNKS, SUB_VALUES)
    assert coded <= auto.SURE * fast and auto.SURE * fast < slow  # the bound holds here, with room
    calls.clear()
    assert Auto().choose(q, CF, MASK, True, SUB_VALUES) == coder.get_config()
    assert calls and set(calls) == {auto.FAST_LEVEL}  # zstd-1 only
    calls.clear()
    assert Auto().choose(periodic(), CF, MASK, True, SUB_VALUES) == ZSTD_MAX
    assert 19 in calls  # the coder is not far enough ahead: zstd-19 is sized and wins
