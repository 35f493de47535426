"""The entropy coder as a stage: one id (the codec's own), streams of one sample or of a batch, runs
decoded in one kernel call, its model weighed by calibration, its zarr entry, and what it refuses to code
(it holds integer dct coefficients only: a field of anything else is refused when the spec is built)."""

import json

import numpy as np
import pytest

import dctdata
from dctdata.entropy import CODEC_ID, CtxCodec
from dctdata.format import FieldSpec
from dctdata.format.webdataset import entry_name
from dctdata.stages import CtxransStage, get_stage
from dctdata.stages.ctxrans import CODEC_ID as STAGE_ID
from dctdata.stages.zstd import max_stage

CF, MASK = 3, "square"


def coefficients(shape=(4, 2, 5, CF * CF, 6), seed=0) -> np.ndarray:
    return np.random.default_rng(seed).laplace(0, 1.5, shape).round().clip(-127, 127).astype(np.int8)


@pytest.fixture(scope="module")
def stage() -> CtxransStage:
    return CtxransStage.fit(coefficients(), CF, MASK)


def test_one_id_the_codecs_own():
    assert STAGE_ID == CODEC_ID == CtxransStage.codec_id == CtxCodec.codec_id


def test_fit_gives_the_codecs_config_and_the_registry_builds_it_back(stage):
    assert stage.get_config() == stage.codec.get_config() and stage.get_config()["id"] == STAGE_ID
    again = get_stage(stage.get_config())
    assert isinstance(again, CtxransStage) and again.codec == stage.codec
    assert stage.model_nbytes() == len(json.dumps(stage.get_config())) > 0


def test_a_sample_codes_as_a_batch_of_one(stage):
    q = coefficients()
    one = stage.encode(q[1])
    assert one == stage.codec.encode(q[1:2])  # the stream the webdataset writer has always stored
    assert np.array_equal(stage.decode(one, q.shape[1:], q.dtype, "s"), q[1])
    assert np.array_equal(stage.decode(one, (1, *q.shape[1:]), q.dtype, "s"), q[1:2])
    out = np.empty(q.shape[1:], q.dtype)
    assert stage.decode(one, q.shape[1:], q.dtype, "s", out=out) is out and np.array_equal(out, q[1])


def test_a_run_is_one_kernel_call(stage, monkeypatch):
    q = coefficients()
    bufs = [stage.encode(s) for s in q]
    calls = []
    many = stage.codec.decode_many
    monkeypatch.setattr(stage.codec, "decode_many", lambda b, out: calls.append(out.shape) or many(b, out))
    out = np.zeros_like(q)
    assert stage.decode_many(bufs, out) == 4 and np.array_equal(out, q)
    assert calls == [(4, 1, *q.shape[1:])] and CtxransStage.decodes_runs


def test_errors_name_the_chunk_and_the_codec(stage):
    q = coefficients()
    with pytest.raises(
        dctdata.IntegrityError, match=r"^c 4: expected dctdata_ctxrans-coded bytes of int8 \(1, 2, 5, 9, 6\)\. Got"
    ):
        stage.decode(stage.encode(q[:1])[:-2], (1, *q.shape[1:]), np.int8, "c 4")
    with pytest.raises(
        dctdata.IntegrityError, match=r"^c 4: expected .*Got dtype: expected int8 or int16\. Got float32"
    ):
        stage.decode(stage.encode(q[:1]), (1, *q.shape[1:]), np.float32, "c 4")


def test_calibration_sizes(stage):
    q = coefficients((8, 2, 5, CF * CF, 6))
    estimate = stage.estimate_size(q, CF, MASK, integer=True)
    assert estimate == int(CtxCodec.estimate_bytes(q, CF, MASK)) and 0 < estimate < q.nbytes
    f = q.astype(np.float32)  # it cannot code these: zstd-19 sizes them
    assert stage.estimate_size(f, CF, MASK, integer=False) == len(max_stage().encode(f))


def test_zarr_and_webdataset_facts(stage):
    assert stage.zarr_codecs(1) == [{"name": STAGE_ID}]  # no configuration (format 8): the model is in the manifest
    assert entry_name("image", stage.get_config()) == "image.ctx"
    assert stage.needs_shape and stage.integer_only and stage.declared_size(b"anything") is None


def test_fields_it_cannot_code_are_refused_when_the_spec_is_built(stage):
    config = stage.get_config()
    with pytest.raises(dctdata.DctDataError, match=r"field 'm': lossless: expected a bytes codec for a array field of "
                       r"uint8 \(the 'dctdata_ctxrans' stage codes integer dct coefficients only\)"):  # fmt: skip
        FieldSpec("m", "array", (4, 4), "uint8", lossless=config)
    spec = dctdata.CodecSpec(cf=CF, height=40, width=48, channels=2, mask=MASK, dtype="float16")
    with pytest.raises(dctdata.DctDataError, match=r"expected a bytes codec for a dct field of float16"):
        FieldSpec("image", "dct", (2, 40, 48), "float32", codec=spec, lossless=config)


def test_its_device_decoder_is_the_entropy_kernels_batch_decoder(stage):
    """On CUDA and the CPU (`dctdata.entropy.device.decode_batch`: the CUDA kernel there, the CPU decoder or the
    lane emulator here), one sample a stream: a zarr chunk of several samples is decoded on the host."""
    import torch

    from dctdata.stages.ctxrans import CtxransDeviceDecoder

    assert isinstance(stage.device_decoder(torch.device("cpu")), CtxransDeviceDecoder)
    assert isinstance(stage.device_decoder("cuda"), CtxransDeviceDecoder)  # built without a GPU
    assert stage.device_decoder(torch.device("meta")) is None
    decoder = stage.device_decoder("cpu")
    assert decoder.supports((2, 5, CF * CF, 6)) and decoder.supports((1, 2, 5, CF * CF, 6))
    assert not decoder.supports((4, 2, 5, CF * CF, 6))
    q = coefficients()
    bufs = [stage.encode(s) for s in q]
    offsets = torch.tensor(np.cumsum([0] + [len(b) for b in bufs]), dtype=torch.int64)
    buffer = torch.frombuffer(bytearray(b"".join(bufs)), dtype=torch.uint8)
    for emulate in (False, True):
        got, status = CtxransDeviceDecoder(stage.codec, emulate=emulate).decode_batch(
            buffer, offsets, (1, *q.shape[1:]), torch.int8
        )
        assert got.shape == (4, 1, *q.shape[1:]) and torch.equal(got[:, 0], torch.from_numpy(q))
        assert status.tolist() == [0] * 4
    bad = offsets.clone()
    bad[2] -= 5  # sample 1 loses its last bytes (and sample 2 gains them)
    _, status = decoder.decode_batch(buffer, bad, q.shape[1:], torch.int8)
    assert status[0] == 0 and status[1] != 0 and decoder.describe(int(status[1])).startswith("ctxrans: ")
