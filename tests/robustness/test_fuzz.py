"""Fuzzing, with hypothesis: the manifest parser, the webdataset shard reader and the codec.

Properties:
- manifest: any JSON mutation of a valid manifest (and any byte mutation of its text) either parses
  to a valid Manifest (which round-trips) or raises DctDataError; never another exception type.
- shard reader: any byte mutation/truncation of a small tar shard, with the manifest's size and sha256
  re-sealed around it (so the structural checks, not the hash, must catch it), either raises
  DctDataError or yields arrays of exactly the stored shape and dtype; without re-sealing, any change
  raises IntegrityError.
- zarr shards (zstd in two-sample chunks, and the entropy coder in one-sample chunks): any byte
  mutation/truncation of a shard read through the batched reader raises IntegrityError or gives back
  exactly the stored values; with every crc32c re-sealed around the mutation (so the structural checks
  and the codec must catch it), it raises IntegrityError or gives arrays of exactly the stored shape
  and dtype.
- codec: random shapes, input dtypes, CFs, masks, wire dtypes and steps through encode -> Decompress
  give (B, C, H, W) finite output within the error the DCT's orthonormality allows.

CI runs a few hundred examples in seconds. The long run (reported in docs/robustness.md):
    DCTDATA_FUZZ_EXAMPLES=5000 pytest tests/robustness/test_fuzz.py --hypothesis-show-statistics
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import math
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from pack_checks import reseal
from sample_fields import smooth_fields

import dctdata
from dctdata.codec.spec import INTEGER_DTYPES
from dctdata.codec.transform import compress, kept_frequencies
from dctdata.errors import DctDataError, IntegrityError
from dctdata.format import Manifest, parse_manifest
from dctdata.format.zarr import zarr_layout

EXAMPLES = int(os.environ.get("DCTDATA_FUZZ_EXAMPLES", "0")) or None


def fuzz_settings(ci: int):
    return settings(
        max_examples=EXAMPLES or ci,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


def byte_edits(raw: bytes, min_size: int = 0, max_size: int = 6):
    """Up to `max_size` (offset, new byte) edits of `raw`."""
    return st.lists(st.tuples(st.integers(0, len(raw) - 1), st.integers(0, 255)), min_size=min_size, max_size=max_size)


def edited(raw: bytes, edits) -> bytearray:
    b = bytearray(raw)
    for at, v in edits:
        b[at] = v
    return b


@pytest.fixture(scope="module")
def packs():
    tmp = Path(tempfile.mkdtemp(prefix="dctdata-fuzz-"))
    x = (np.random.default_rng(0).standard_normal((6, 2, 12, 10)) + 4).astype(np.float32)
    np.savez(tmp / "src.npz", image=x, mask=(x[:, :1] > 4).astype(np.uint8), label=np.arange(6, dtype=np.int64))
    common = dict(cf=3, quant="int8", quiet=True, fields={"mask": "array"})
    dctdata.pack(tmp / "src.npz", tmp / "zarr", writer_options={"chunk_samples": 2, "shard_samples": 4}, **common)
    dctdata.pack(tmp / "src.npz", tmp / "wds", format="webdataset", writer_options={"samples_per_shard": 3}, **common)
    # format version 2: a stored validity mask, field attributes, coordinates of every sample
    x[1, :, :3] = np.nan
    times = np.datetime64("2020-01-01", "ns") + np.arange(6) * np.timedelta64(1, "h")
    with dctdata.Writer(tmp / "masked", nan="mask", cf=3, quant="int8", attrs={"image": {"units": "K"}},
                        coords={"time": times}) as w:  # fmt: skip
        for s in x:
            w.write(s)
    # the entropy coder ("auto" picks it here; the pack above gets zstd), one-sample chunks. 8 samples: with 4
    # its model's bytes made the two stages tie within 0.3% and the pick flipped with the landing's steps
    np.savez(tmp / "smooth.npz", image=smooth_fields(8, 1, 64, 64, seed=1))
    one = {"chunk_samples": 1, "shard_samples": 4}
    dctdata.pack(tmp / "smooth.npz", tmp / "zarr-ctx", quant="int8", target_psnr=35, quiet=True, writer_options=one)
    yield tmp
    shutil.rmtree(tmp, ignore_errors=True)


# Manifest parser ---------------------------------------------------------------------------------
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from(
        ["", "inf", "-inf", "nan", "dctdata", "zarr", "webdataset", "dct", "int8", "../x", "0" * 64, "image"]
    )
    | st.text(max_size=8),
    lambda c: (
        st.lists(c, max_size=4)
        | st.dictionaries(st.text(max_size=6) | st.sampled_from(["id", "name", "shape"]), c, max_size=4)
    ),
    max_leaves=6,
)


def _containers(d, path=()):
    yield path, d
    items = d.items() if isinstance(d, dict) else enumerate(d) if isinstance(d, list) else ()
    for k, v in items:
        if isinstance(v, (dict, list)):
            yield from _containers(v, (*path, k))


def _mutate(data, d):
    """One random edit: delete a key/element, replace a value, or add a key/element."""
    targets = list(_containers(d))
    _, node = targets[data.draw(st.integers(0, len(targets) - 1), label="container")]
    keys = list(node) if isinstance(node, dict) else list(range(len(node)))
    op = data.draw(st.sampled_from(["delete", "replace", "add"] if keys else ["add"]), label="op")
    if op == "add":
        value = data.draw(JSON, label="value")
        if isinstance(node, dict):
            node[data.draw(st.text(max_size=6) | st.sampled_from(keys or ["x"]), label="key")] = value
        else:
            node.insert(data.draw(st.integers(0, len(node)), label="at"), value)
        return
    key = keys[data.draw(st.integers(0, len(keys) - 1), label="key")]
    if op == "delete":
        del node[key]
    else:
        old = node[key]
        nudged = st.just(old)
        if isinstance(old, bool):
            nudged = st.booleans()
        elif isinstance(old, int):
            nudged = st.sampled_from([old + 1, old - 1, -old, 0, old * 1000, float(old), str(old)])
        elif isinstance(old, float):
            nudged = st.sampled_from([-old, 0.0, old * 1e30, old * 1e-30, str(old), 1e308])
        node[key] = data.draw(nudged | JSON, label="new")


def _check_parse(raw: bytes) -> Manifest | None:
    try:
        m = parse_manifest(raw, "fuzz")
    except DctDataError:
        return None
    # whatever parses is valid and round-trips
    assert parse_manifest(m.to_json().encode(), "again") == m
    if m.storage == "zarr":
        with contextlib.suppress(DctDataError):
            zarr_layout(m)
    for f in m.fields:
        assert f.stored_sample_bytes >= 0 and (f.kind != "dct" or f.codec.sample_shape == f.shape)
    return m


@pytest.mark.parametrize("fmt", ["zarr", "wds"])
def test_layout_entries_of_the_wrong_shape_round_trip(packs, fmt):
    """The fuzzer's find: the layout is free-form for the manifest, so odd entries parse and must write back
    (version 3 compacts the entries it understands and leaves the others as they are)."""
    base = json.loads((packs / fmt / "manifest.json").read_text())
    if fmt == "zarr":
        odd = [dict(base, layout=dict(base["layout"], arrays={**base["layout"]["arrays"], "image": value}))
               for value in (None, 3, ["image"])]  # fmt: skip
    else:
        odd = [dict(base, layout=dict(base["layout"], shards=[value, *base["layout"]["shards"][1:]]))
               for value in (None, "shard-000000.tar", {"samples": 3})]  # fmt: skip
        odd.append(dict(base, checksums=None))
    parsed = [_check_parse(json.dumps(reseal(d)).encode()) for d in odd]  # what parses must write back equal
    assert any(m is not None for m in parsed)


@pytest.mark.parametrize("fmt", ["zarr", "wds", "masked"])
def test_fuzz_manifest_json_mutations(packs, fmt):
    base = json.loads((packs / fmt / "manifest.json").read_text())

    @fuzz_settings(150)
    @given(data=st.data(), n=st.integers(1, 4))
    def run(data, n):
        d = copy.deepcopy(base)
        for _ in range(n):
            _mutate(data, d)
        _check_parse(json.dumps(d).encode())

    run()


def test_fuzz_manifest_byte_mutations(packs):
    raw = (packs / "zarr" / "manifest.json").read_bytes()

    @fuzz_settings(150)
    @given(
        edits=byte_edits(raw, min_size=1, max_size=4),
        cut=st.integers(0, len(raw)),
    )
    def run(edits, cut):
        b = edited(raw, edits)
        _check_parse(bytes(b[: max(cut, len(raw) // 2)]) if cut < len(raw) // 3 else bytes(b))

    run()


def test_fuzz_manifest_regressions():
    """Inputs the fuzzer and the matrix found that once escaped as non-DctDataError exceptions."""
    for raw in (b"[" * 50000, b'{"version": ' + b"1" * 5000 + b"}", b"\xff"):
        with pytest.raises(DctDataError):
            parse_manifest(raw)


# Shard reader ------------------------------------------------------------------------------------
def _read_shard(root: Path, m: Manifest) -> list:
    from dctdata.loaders.wds_dataset import DCTWebDataset

    ds = DCTWebDataset(root, shuffle=False, manifest=m)
    return list(ds)


@pytest.mark.parametrize("reseal", [True, False])
def test_fuzz_shard_reader(packs, reseal):
    from dctdata.format.webdataset import Files, ShardReader, shard_list

    root = packs / "wds"
    m = dctdata.format.read_manifest(root)
    entry = shard_list(m, "fuzz")[0]
    raw = (root / entry["name"]).read_bytes()
    codecs = {f.name: dctdata.stages.get_stage(f.lossless) for f in m.fields}
    work = Path(tempfile.mkdtemp(prefix="dctdata-fuzz-shard-"))
    files = Files(str(work), None)
    counts = {"rejected": 0, "decoded": 0}

    @fuzz_settings(100)
    @given(
        edits=byte_edits(raw),
        cut=st.integers(0, len(raw)),
        truncate=st.booleans(),
    )
    def run(edits, cut, truncate):
        b = edited(raw, edits)
        data = bytes(b[:cut] if truncate else b)
        assume(data != raw)
        (work / entry["name"]).write_bytes(data)
        e = dict(entry, bytes=len(data), sha256=hashlib.sha256(data).hexdigest()) if reseal else entry
        try:
            shard = ShardReader(files, e, m.fields, codecs)
            values = [shard.sample(j) for j in range(e["samples"])]
        except DctDataError as exc:
            if not reseal:
                assert isinstance(exc, IntegrityError)
            counts["rejected"] += 1
            return
        assert reseal, "a changed shard passed without re-sealing its checksum"
        counts["decoded"] += 1
        for sample in values:  # garbage never leaves: exact stored shapes and dtypes
            for f, t in zip(m.fields, sample):
                assert tuple(t.shape) == f.stored_shape and t.dtype == f.tensor_dtype

    try:
        run()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    assert counts["rejected"] > 0


def _reseal_zarr_shard(b: bytearray, chunks_per_shard: int) -> None:
    """Recompute every chunk's crc32c (where its index entry points inside the file) and the index's."""
    import google_crc32c

    n = 16 * chunks_per_shard
    entries = np.frombuffer(bytes(b[-n - 4 : -4]), "<u8").reshape(-1, 2)
    for off, nbytes in entries.tolist():
        if nbytes >= 4 and off + nbytes <= len(b) - n - 4:
            b[off + nbytes - 4 : off + nbytes] = google_crc32c.value(bytes(b[off : off + nbytes - 4])).to_bytes(
                4, "little"
            )
    b[-4:] = google_crc32c.value(bytes(b[-n - 4 : -4])).to_bytes(4, "little")


@pytest.mark.parametrize("reseal", [True, False])
@pytest.mark.parametrize("pack, chunks_per_shard", [("zarr", 2), ("zarr-ctx", 4)])
def test_fuzz_zarr_shard_reader(packs, reseal, pack, chunks_per_shard):
    from dctdata.format.zarr import ZarrReader

    root = packs / pack
    m = dctdata.format.read_manifest(root)
    f = m.field("image")
    rel = "image/c.0.0.0.0.0"
    raw = (root / rel).read_bytes()
    want = ZarrReader(str(root), m, (f,)).read(f, 0, 4)
    assert f.lossless["id"] == ("dctdata_ctxrans" if pack == "zarr-ctx" else "zstd")  # both stages are fuzzed
    work = Path(tempfile.mkdtemp(prefix="dctdata-fuzz-zarr-"))
    shutil.copytree(root, work / "z")
    counts = {"rejected": 0, "read": 0}

    @fuzz_settings(100)
    @given(
        edits=byte_edits(raw, min_size=1),
        cut=st.integers(0, len(raw)),
        truncate=st.booleans(),
    )
    def run(edits, cut, truncate):
        b = edited(raw, edits)
        if reseal:
            _reseal_zarr_shard(b, chunks_per_shard)
        data = bytes(b[:cut] if truncate and not reseal else b)
        assume(data != raw)
        (work / "z" / rel).write_bytes(data)
        try:
            got = ZarrReader(str(work / "z"), m, (f,)).read(f, 0, 4)
        except DctDataError as exc:
            assert isinstance(exc, IntegrityError), exc
            counts["rejected"] += 1
            return
        counts["read"] += 1
        assert got.shape == want.shape and got.dtype == want.dtype
        if not reseal:
            assert got.tobytes() == want.tobytes()  # what was read was intact (crc32c-checked)

    try:
        run()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    assert counts["rejected"] > 0


# Codec -------------------------------------------------------------------------------------------
_REL_ERR = {"float32": 2**-23, "float16": 2**-11, "bfloat16": 2**-8}


@fuzz_settings(150)
@given(
    b=st.integers(1, 3),
    c=st.integers(1, 3),
    h=st.integers(1, 24),
    w=st.integers(1, 24),
    cf=st.integers(1, 8),
    mask=st.sampled_from(["square", "triangle"]),
    wire=st.sampled_from(["float32", "float16", "bfloat16", "int8", "int16"]),
    in_dtype=st.sampled_from([torch.float16, torch.float32, torch.float64]),
    scale=st.sampled_from([1e-3, 1.0, 100.0, 1e4]),
    offset=st.sampled_from([0.0, 1.0, 300.0]),
    step=st.floats(1e-3, 10.0),
    seed=st.integers(0, 2**16),
)
def test_fuzz_codec(b, c, h, w, cf, mask, wire, in_dtype, scale, offset, step, seed):
    g = torch.Generator().manual_seed(seed)
    x = (offset + scale * torch.randn(b, c, h, w, generator=g, dtype=torch.float64)).to(in_dtype)
    assume(bool(torch.isfinite(x).all()))
    k = len(kept_frequencies(cf, mask))
    steps = None
    offsets = None
    if wire in INTEGER_DTYPES or step > 5:  # float wires sometimes get steps too
        steps = (step * scale * (1 + torch.rand(c, k, generator=g, dtype=torch.float64))).tolist()
        offsets = [[8 * offset] + [0.0] * (k - 1)] * c
    spec = dctdata.CodecSpec(cf=cf, mask=mask, height=h, width=w, channels=c, dtype=wire, steps=steps, offsets=offsets)
    q, overflow = dctdata.encode(x, spec)
    assert q.dtype == spec.torch_dtype and tuple(q.shape) == (b, *spec.coeff_shape)
    x_hat = dctdata.Decompress(spec, dtype=torch.float64)(q)
    assert x_hat.shape == (b, c, h, w) and bool(torch.isfinite(x_hat).all())
    if overflow:
        return
    # orthonormal DCT: ||x - x_hat|| <= ||dropped|| + ||quantization error|| (+ float32 arithmetic)
    x64 = x.to(torch.float64)
    full = compress(x64, 8, "square")  # (b, c, Hb, 64, Wb) of the edge-padded image
    keep = torch.zeros(64, dtype=torch.bool)
    keep[[u * 8 + v for u, v in kept_frequencies(cf, mask)]] = True
    dropped = float(full[:, :, :, ~keep, :].pow(2).sum().sqrt())
    kept = full[:, :, :, keep, :]
    if steps is not None:
        s = torch.tensor(steps, dtype=torch.float64).reshape(1, c, 1, k, 1)
        q_err = float(((s / 2) ** 2 * torch.ones_like(kept)).sum().sqrt())
        if wire in _REL_ERR:  # float wire holding (coef - offset) / step
            q_err += float((kept.abs() * _REL_ERR[wire] * 2).pow(2).sum().sqrt())
    else:
        q_err = float((kept.abs() * _REL_ERR[wire]).pow(2).sum().sqrt())
    slack = 1e-5 * float(x64.abs().max() + 1) * math.sqrt(x.numel()) + 2e-6 * float(kept.abs().max() + 1) * math.sqrt(
        kept.numel()
    )
    err = float((x64 - x_hat).pow(2).sum().sqrt())
    assert err <= dropped + q_err + slack, (err, dropped, q_err, slack)
