"""Windows over a webdataset pack of trajectories (`dctdata.loaders.wds_windows`) are the zarr pack's windows
(`WindowDataset`) of the same source: same count, order, keys and values, served exactly once per epoch across
ranks and DataLoader workers, resumed mid-epoch; and windows with `decode="device"` (either storage): stored
frames cross, each distinct frame of a batch once, and `ds.decompressor()` gives the `decode="cpu"` batch
bit for bit (on the CPU here, as CI runs the device path)."""

from __future__ import annotations

import pytest
import torch

import dctdata
from dctdata.datasets.well import write_well_file
from dctdata.errors import DctDataError
from dctdata.format import read_manifest
from dctdata.loaders.distributed import make_loader, set_epoch
from dctdata.loaders.wds_windows import WebWindowDataset
from dctdata.loaders.window_decode import WindowDecompress, collate_frames


@pytest.fixture(scope="module")
def packs(tmp_path_factory):
    """Two Well files (3 and 2 trajectories of 20 steps, 24x24) packed at a fixed setting three ways: zarr,
    webdataset with shards of one trajectory (20 frames) and with shards of 16 frames (trajectories cross
    shards)."""
    d = tmp_path_factory.mktemp("well-wds")
    raw = d / "train"
    raw.mkdir()
    write_well_file(raw / "a.h5", n_traj=3, n_steps=20, size=24, seed=0)
    write_well_file(raw / "b.h5", n_traj=2, n_steps=20, size=24, seed=1)
    dctdata.pack(str(raw), d / "z", cf=4, quiet=True)
    for name, per in (("w20", 20), ("w16", 16)):
        dctdata.pack(
            str(raw), d / name, cf=4, format="webdataset", writer_options={"samples_per_shard": per}, quiet=True
        )
    return d


def _key(window: dict) -> bytes:
    return window["input_fields"].numpy().tobytes() + window["output_fields"].numpy().tobytes()


def _windows(batches) -> list[bytes]:
    """Every window of a list of collated batches, as bytes."""
    out = []
    for b in batches:
        out += [x.numpy().tobytes() + y.numpy().tobytes() for x, y in zip(b["input_fields"], b["output_fields"])]
    return out


OPTIONS = [
    dict(n_steps_input=4, n_steps_output=1),
    dict(n_steps_input=2, n_steps_output=3, dt_stride=2),
    dict(n_steps_input=1, n_steps_output=1, dt_stride=(1, 4)),
    dict(n_steps_input=1, full_trajectory_mode=True),
    dict(n_steps_input=2, full_trajectory_mode=True, start_output_steps_at_t=6, max_rollout_steps=5),
    dict(n_steps_input=2, n_steps_output=1, normalization="zscore"),
]
IDS = ["4in1out", "stride2", "stride1to4", "rollout", "rollout_at6", "zscore"]


@pytest.mark.parametrize("shards", ["w20", "w16"])
@pytest.mark.parametrize(
    "options", OPTIONS, ids=["4in1out", "stride2", "stride1to4", "rollout", "rollout_at6", "zscore"]
)
def test_webdataset_windows_are_the_zarr_windows(packs, shards, options):
    zarr = dctdata.open_dataset(packs / "z", **options)
    wds = dctdata.open_dataset(packs / shards, shuffle=False, **options)
    assert isinstance(wds, WebWindowDataset)
    assert len(wds) == len(zarr) == wds.windows > 0
    got = list(wds)  # one rank, no workers, unshuffled: window order
    assert len(got) == len(zarr)
    for i, item in enumerate(got):
        ref = zarr[i]
        assert list(item) == list(ref)
        for key in ref:
            assert torch.equal(item[key], ref[key]), (i, key)
    assert wds.field_names == zarr.field_names and wds.stats == zarr.stats


def test_aligned_shards_are_read_once_an_epoch(packs):
    """Shards of whole trajectories: no window crosses shards, each shard is read once; shards of 16 frames:
    a worker reads the next shard for the windows that reach into it."""
    aligned = dctdata.open_dataset(packs / "w20", n_steps_input=4, n_steps_output=1, shuffle=False)
    assert len(list(aligned)) == len(aligned)
    assert aligned.read_stats["shards_read"] == 5 and aligned.read_stats["samples"] == len(aligned)
    crossing = dctdata.open_dataset(packs / "w16", n_steps_input=4, n_steps_output=1, shuffle=False)
    list(crossing)
    assert crossing.read_stats["shards_read"] == len(crossing.shards) == 7  # one pass, in order: each once


@pytest.mark.parametrize("shards", ["w20", "w16"])
def test_every_window_once_across_ranks_and_workers(packs, shards):
    zarr = dctdata.open_dataset(packs / "z", n_steps_input=3, n_steps_output=2)
    everything = sorted(_key(zarr[i]) for i in range(len(zarr)))
    for epoch in (0, 1):
        seen, per_rank = [], []
        for rank in range(2):
            ds = dctdata.open_dataset(packs / shards, n_steps_input=3, n_steps_output=2, seed=7)
            loader = make_loader(ds, batch_size=4, num_workers=2, rank=rank, world_size=2)
            set_epoch(loader, epoch)
            batches = list(loader)
            assert len(batches) == len(loader)
            per_rank.append(len(batches))
            seen += _windows(batches)
        assert per_rank[0] == per_rank[1]  # DDP: the ranks step together
        assert sorted(seen) == everything, epoch  # exactly once (80 windows split evenly: nothing repeated)


def test_shuffled_order_depends_on_the_epoch(packs):
    ds = dctdata.open_dataset(packs / "w16", n_steps_input=2, n_steps_output=1, seed=1, buffer_size=8)
    first = [_key(w) for w in ds]
    assert [_key(w) for w in ds] == first
    ds.set_epoch(1)
    again = [_key(w) for w in ds]
    assert again != first and sorted(again) == sorted(first)


def test_loader_resumes_mid_epoch(packs):
    def loader():
        ds = dctdata.open_dataset(packs / "w16", n_steps_input=2, n_steps_output=1, seed=2)
        return make_loader(ds, batch_size=5, num_workers=2)

    a = loader()
    it = iter(a)
    head = [next(it) for _ in range(3)]
    state = a.state_dict()
    rest = list(it)
    b = loader()
    b.load_state_dict(state)
    resumed = list(b)
    assert _windows(resumed) == _windows(rest) and len(rest) > 0
    zarr = dctdata.open_dataset(packs / "z", n_steps_input=2, n_steps_output=1)
    assert sorted(_windows(head) + _windows(rest)) == sorted(_key(zarr[i]) for i in range(len(zarr)))


def test_webdataset_window_errors(packs):
    with pytest.raises(DctDataError, match=r"expected the whole pack .* Got a list of 2 shard files"):
        dctdata.open_dataset(
            [str(packs / "w20" / "shard-000000.tar"), str(packs / "w20" / "shard-000001.tar")], n_steps_input=2
        )
    with pytest.raises(DctDataError, match="on_error='skip': expected 'raise' for windows"):
        dctdata.open_dataset(packs / "w20", n_steps_input=2, on_error="skip")
    with pytest.raises(TypeError, match="expected iteration"):
        dctdata.open_dataset(packs / "w20", n_steps_input=2)[0]


def test_windows_over_a_pipe_url(packs):
    """A shell `pipe:` URL (each shard fetched by its own command) serves the windows of the pack's directory,
    behind the same opt-in as samples."""
    url = f"pipe:cat {packs / 'w16'}/{{}}"
    with pytest.raises(DctDataError, match="Got a shell 'pipe:' URL"):
        dctdata.open_dataset(url, n_steps_input=2, n_steps_output=1)
    options = dict(n_steps_input=2, n_steps_output=1, dt_stride=2, shuffle=False)
    piped = dctdata.open_dataset(url, allow_pipe=True, **options)
    ref = dctdata.open_dataset(packs / "w16", **options)
    assert isinstance(piped, WebWindowDataset) and len(piped) == len(ref) > 0
    assert [_key(w) for w in piped] == [_key(w) for w in ref]
    with pytest.raises(DctDataError, match=r"sha256: expected a local path or URL pack\. Got a pipe: stream"):
        dctdata.open_dataset(url, allow_pipe=True, sha256="0" * 64, **options)


# decode="device" ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["z", "w16"])
@pytest.mark.parametrize("normalization", [None, "rms"])
def test_device_decode_is_the_cpu_windows_bit_for_bit(packs, name, normalization):
    opts = dict(n_steps_input=3, n_steps_output=2, normalization=normalization)
    extra = {} if name == "z" else {"shuffle": False}
    cpu = dctdata.open_dataset(packs / name, **opts, **extra)
    dev = dctdata.open_dataset(packs / name, decode="device", **opts, **extra)
    decode = dev.decompressor()
    assert isinstance(decode, WindowDecompress)
    want = list(make_loader(cpu, batch_size=6, shuffle=False))
    got = list(make_loader(dev, batch_size=6, shuffle=False, num_workers=2))
    assert len(got) == len(want)
    for a, b in zip(want, got):
        frames = b["frames"]
        # the batch's distinct frames cross once: 6 consecutive windows of 5 frames share all but 1 frame each
        assert frames["rows"].shape == (len(a["input_fields"]), 5)
        assert len(frames["ids"]) == len(torch.unique(frames["ids"])) == int(frames["rows"].max()) + 1
        assert len(frames["ids"]) < frames["rows"].numel()
        out = decode(b)
        assert list(out) == list(a)
        for key in a:
            assert torch.equal(out[key], a[key]), key


def test_device_frames_decoded_once_per_batch(packs):
    ds = dctdata.open_dataset(packs / "z", n_steps_input=4, n_steps_output=1, decode="device")
    items = ds.__getitems__([0, 1, 2, 3])  # windows 0..3 of trajectory 0 share frames 0..7
    batch = collate_frames([it["frames"] for it in items])
    assert batch["ids"].tolist() == list(range(8)) and batch["rows"][1].tolist() == [1, 2, 3, 4, 5]
    calls = []
    decode = ds.decompressor()
    for layer in decode.layers.values():
        layer.register_forward_hook(lambda m, args, out: calls.append(len(out)))
    inputs, outputs = decode(batch)
    assert calls == [8] * len(decode.layers)  # each distinct frame decoded once, in one call per field
    assert inputs.shape == (4, 4, 24, 24, 3) and outputs.shape == (4, 1, 24, 24, 3)
    plain = dctdata.open_dataset(packs / "z", n_steps_input=4, n_steps_output=1)
    assert torch.equal(inputs[2], plain[2]["input_fields"])
    with pytest.raises(DctDataError, match="expected a batch of decode='device' windows"):
        decode({"input_fields": inputs})


@pytest.mark.slow
def test_target_pack_windows_with_side_values(packs, tmp_path):
    """A 40 dB pack (its dct fields carry per-frame side values, a partner field each): the webdataset windows,
    decoded in the workers or on the device, are the zarr pack's windows bit for bit."""
    raw = str(packs / "train")
    dctdata.pack(raw, tmp_path / "z", target_psnr=40, quiet=True)
    dctdata.pack(raw, tmp_path / "w", target_psnr=40, format="webdataset", quiet=True,
                 writer_options={"samples_per_shard": 16})  # fmt: skip
    assert any(f.name == "height__side" for f in read_manifest(tmp_path / "w").fields)
    opts = dict(n_steps_input=3, n_steps_output=2)
    zarr = list(make_loader(dctdata.open_dataset(tmp_path / "z", **opts), batch_size=8, shuffle=False))
    cpu = dctdata.open_dataset(tmp_path / "w", shuffle=False, **opts)
    dev = dctdata.open_dataset(tmp_path / "w", shuffle=False, decode="device", **opts)
    decode = dev.decompressor()
    for got in (list(make_loader(cpu, batch_size=8)), [decode(b) for b in make_loader(dev, batch_size=8)]):
        assert len(got) == len(zarr)
        for a, b in zip(zarr, got):
            for key in a:
                assert torch.equal(a[key], b[key]), key
