"""`python -m benchmarks rd`: the equal-PSNR arithmetic, the items and packs, dctdata's points through the real
product path, peers skipped when their library is missing, and the CLI end to end."""

import itertools
import json
import math
import os
import sys
import types

import numpy as np
import pytest

import dctdata
from benchmarks import curves, items, ours, peers, rd
from benchmarks.__main__ import main
from benchmarks.curves import Point


def _log_linear(b0: float, p0: float, b1: float, p1: float, level: float) -> float:
    """The definition: log(bytes) linear in PSNR between two points."""
    w = (level - p0) / (p1 - p0)
    return math.exp(math.log(b0) + w * (math.log(b1) - math.log(b0)))


# Equal-PSNR arithmetic ----------------------------------------------------------------------------------
def test_bytes_at_interpolates_log_bytes_linearly_in_psnr():
    pts = [Point("a", 1000, 30.0), Point("c", 4000, 50.0), Point("b", 1500, 38.0), Point("fail", None, None)]
    assert curves.bytes_at(pts, 40.0) == pytest.approx(_log_linear(1500, 38.0, 4000, 50.0, 40.0))
    assert curves.bytes_at(pts, 35.0) == pytest.approx(_log_linear(1000, 30.0, 1500, 38.0, 35.0))
    assert curves.bytes_at(pts, 38.0) == pytest.approx(1500)  # on a point
    assert curves.cr_at(pts, 60000, 40.0) == pytest.approx(60000 / _log_linear(1500, 38.0, 4000, 50.0, 40.0))
    for outside in (29.9, 50.1):  # never extrapolated
        assert math.isnan(curves.bytes_at(pts, outside)) and math.isnan(curves.cr_at(pts, 60000, outside))
    assert math.isnan(curves.bytes_at([Point("one", 100, 39.0)], 40.0))
    assert curves.bytes_at([Point("one", 100, 40.0)], 40.0) == 100


def test_settings_beaten_by_another_are_dropped_before_interpolating():
    # "bad" costs more than "b" for less PSNR: no user would pick it, so 40 dB lies between a and b
    pts = [Point("a", 2000, 36.0), Point("bad", 3000, 39.0), Point("b", 2500, 42.0), Point("c", 3000, 44.0)]
    assert curves.pareto(pts) == [(36.0, 2000), (42.0, 2500), (44.0, 3000)]
    assert curves.bytes_at(pts, 40.0) == pytest.approx(_log_linear(2000, 36.0, 2500, 42.0, 40.0))
    tie = [Point("a", 1000, 40.0), Point("same PSNR, more bytes", 1100, 40.0), Point("b", 2000, 45.0)]
    assert curves.pareto(tie) == [(40.0, 1000), (45.0, 2000)]
    assert curves.bytes_at(tie, 40.0) == pytest.approx(1000)


def test_geomean_and_best_of():
    v = [0.5, 2.0, 8.0, math.nan]
    assert curves.geomean(v) == pytest.approx(math.exp((math.log(0.5) + math.log(2.0) + math.log(8.0)) / 3))
    assert math.isnan(curves.geomean([math.nan])) and math.isnan(curves.best_of([math.nan]))
    assert curves.best_of([1.0, math.nan, 3.0]) == 3.0


def _result(name: str, channels: int, raw: int, slopes: dict[str, float]) -> rd.PackResult:
    """Curves with bytes = b0 * exp(s * (psnr - 30)), sampled every 4 dB from 30 to 50 (exact in log-linear)."""
    curves_ = {
        codec: [Point(f"{p}", round(1000 * math.exp(s * (p - 30))), float(p)) for p in range(30, 51, 4)]
        for codec, s in slopes.items()
    }
    mode = name.split("/")[1]
    return rd.PackResult(name, mode, "sci", 4, (channels, 60, 76), raw, curves_)


def test_pack_ratios_and_group_geomeans_follow_the_definition():
    a = _result("a/tiles", 1, 10**6, {"dctdata": 0.10, "zfp": 0.12, "sperr": 0.08, "j2k-uint16": 0.11})
    b = _result("b/whole", 3, 4 * 10**6, {"dctdata": 0.09, "zfp": 0.10, "j2k-native": 0.07, "j2k-uint16": 0.06})
    results = [a, b]

    def cr(r: rd.PackResult, curve: str, level: float) -> float:
        pts = [(p.psnr, p.bytes) for p in r.curves[curve]]
        lo = max(p for p in pts if p[0] <= level)
        hi = min(p for p in pts if p[0] >= level and p[0] > lo[0])
        return r.raw_bytes / _log_linear(lo[1], lo[0], hi[1], hi[0], level)

    for level in (35.0, 40.0, 45.0):
        # a codec's best variant counts; the best peer is the best of SPERR, JPEG 2000 and SZ3
        assert b.cr("j2k", level) == pytest.approx(max(cr(b, "j2k-native", level), cr(b, "j2k-uint16", level)))
        assert a.cr(rd.BEST, level) == pytest.approx(max(cr(a, "sperr", level), cr(a, "j2k-uint16", level)))
        assert math.isnan(a.cr("sz3", level))
        ours_zfp = [cr(r, "dctdata", level) / cr(r, "zfp", level) for r in results]
        assert rd.ratios(results, "zfp", level) == pytest.approx(ours_zfp)
        assert curves.geomean(rd.ratios(results, "zfp", level)) == pytest.approx(math.sqrt(ours_zfp[0] * ours_zfp[1]))
        assert rd.ratios(results, "zfp", level, "tiles") == pytest.approx(ours_zfp[:1])
        assert rd.ratios(results, "zfp", level, "multi-channel") == pytest.approx(ours_zfp[1:])
        assert rd.ratios(results, rd.BEST, level, "whole items") == pytest.approx(
            [cr(b, "dctdata", level) / b.cr("j2k", level)]
        )
    assert math.isnan(a.cr("zfp", 52.0))  # beyond the sweep: unknown, and left out of the means
    assert rd.ratios(results, "zfp", 52.0) == []


def test_tables_show_the_geomeans():
    results = [_result("a/tiles", 1, 10**6, {"dctdata": 0.10, "zfp": 0.12, "sperr": 0.08})]
    levels = (40.0,)
    table = rd.codec_table(results, ("zfp", "sperr"), levels)
    zfp = curves.geomean(rd.ratios(results, "zfp", 40.0))
    assert f"| ZFP fixed-accuracy | {zfp:.2f} | 1 |" in table
    assert "| best of SPERR, JPEG 2000, SZ3 |" in table
    groups = rd.group_table(results, ("zfp", "sperr"), levels)
    assert "| tiles | 1 |" in groups and "whole items" not in groups  # empty groups are left out
    per_pack = rd.pack_table(results, ("zfp", "sperr"), 52.0)
    assert "| a/tiles | 4 | 1 | - | - | - | - |" in per_pack


def test_pack_psnr_is_the_dataset_definition():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, 2, 8, 8)).astype(np.float32) * np.array([1.0, 100.0], np.float32)[:, None, None]
    y = x + rng.normal(scale=0.01, size=x.shape).astype(np.float32)
    flat_x, flat_y = x.reshape(6, -1).astype(np.float64), y.reshape(6, -1).astype(np.float64)
    nmse = ((flat_x - flat_y) ** 2).mean(-1) / (flat_x.max(-1) - flat_x.min(-1)) ** 2
    assert curves.pack_psnr(x, y) == pytest.approx(10 * math.log10(1 / nmse.mean()))


# Items and packs ----------------------------------------------------------------------------------------
def test_tile_grid_is_deterministic_and_evenly_thinned():
    x = np.arange(2 * 250 * 400, dtype=np.float32).reshape(2, 250, 400)  # a 4 x 5 grid of 60x76 tiles
    every = items.tile_grid(x, max_tiles=100)
    assert every.shape == (20, 2, 60, 76)
    np.testing.assert_array_equal(every[0], x[:, :60, :76])
    np.testing.assert_array_equal(every[6], x[:, 60:120, 76:152])  # row-major
    kept = items.tile_grid(x, max_tiles=5)
    picks = np.linspace(0, 19, 5).round().astype(int)
    np.testing.assert_array_equal(kept, every[picks])
    with pytest.raises(dctdata.DctDataError, match="expected at least one 60x76 tile"):
        items.tile_grid(np.zeros((1, 50, 500), np.float32))


def test_items_load_as_float32_channels_first():
    loaded, skipped = items.load_items(["em", "coins", "slstr_bts"])
    assert skipped == []
    by = {i.name: i for i in loaded}
    assert by["coins"].u8 and by["coins"].x.shape == (1, 303, 384) and by["coins"].x.max() <= 255
    assert by["slstr_bts"].x.shape == (3, 256, 256) and not by["slstr_bts"].u8
    assert all(i.x.dtype == np.float32 for i in loaded)
    packs = items.packs_of(loaded, ("whole", "tiles"), max_tiles=3)
    assert [p.name for p in packs][:2] == ["em/whole", "em/tiles"]
    assert packs[1].x.shape == (3, 1, 60, 76) and packs[1].raw_bytes == 3 * 60 * 76 * 4


def test_items_whose_package_is_missing_are_skipped(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    loaded, skipped = items.load_items(["mri", "em"])
    assert [i.name for i in loaded] == ["em"]
    assert skipped == ["item mri skipped: matplotlib is not installed (pip install 'dctdata[bench]')"]


# dctdata's points: the real product path -----------------------------------------------------------------
def test_dctdata_points_are_real_packs(tmp_path):
    x = items.tile_grid(items.load_items(["em"])[0][0].x, max_tiles=3)
    points = ours.dctdata_points(x, (36.0, 44.0), str(tmp_path))
    assert [p.setting for p in points] == ["--target-psnr 36", "--target-psnr 44"]
    assert list(tmp_path.iterdir()) == []  # packs and source removed
    # the same pack (same source path: the manifest records it), made and measured by hand: same size and PSNR
    np.save(tmp_path / "source.npy", x)
    manifest = dctdata.pack(str(tmp_path / "source.npy"), str(tmp_path / "p"), target_psnr=44.0, quiet=True)
    on_disk = sum(f.stat().st_size for f in (tmp_path / "p").rglob("*") if f.is_file())
    assert ours.stored_size(str(tmp_path / "p"), manifest) == on_disk == points[1].bytes
    meta = sum(f.stat().st_size for f in (tmp_path / "p").rglob("*") if f.name in ("zarr.json", "manifest.json"))
    assert ours.metadata_size(str(tmp_path / "p"), manifest) == meta and points[1].note.endswith(f"metadata {meta} B")
    ds = dctdata.open_dataset(str(tmp_path / "p"))
    rec = ds.decompressor()(ds[0 : len(ds)][0])
    assert points[1].psnr == pytest.approx(curves.pack_psnr(x, rec.numpy()))
    assert points[0].psnr < points[1].psnr and points[0].bytes < points[1].bytes
    assert points[1].psnr >= 44.0 - 0.5


def test_a_target_the_pack_refuses_is_a_failed_point():
    x = np.ones((2, 1, 16, 16), np.float32)
    x[1, 0, 3, 3] = np.nan  # pack refuses NaN by default
    points = ours.dctdata_points(x, (40.0, 45.0))
    assert [p.bytes for p in points] == [None, None] and all(p.note for p in points)


# Peers ------------------------------------------------------------------------------------------------
def test_peer_curves_count_every_byte():
    x = items.tile_grid(items.load_items(["moon"])[0][0].x, max_tiles=2)
    import imagecodecs
    import zfpy

    zfp = peers.zfp_curves(x, True)["zfp"]
    assert len(zfp) == 16 and all(a.psnr <= b.psnr for a, b in itertools.pairwise(zfp))
    rng = x.reshape(2, -1).max(-1) - x.reshape(2, -1).min(-1)
    blobs = [zfpy.compress_numpy(np.ascontiguousarray(x[i, 0]), tolerance=2.0**-3 * float(rng[i])) for i in range(2)]
    assert zfp[4].bytes == sum(map(len, blobs))  # k = 3, one stream per sample and channel
    j2k = peers.j2k_curves(x, True)
    assert set(j2k) == {"j2k-native", "j2k-uint16"}
    a = x[0, 0].astype(np.float64)
    u = np.round((a - a.min()) / (a.max() - a.min()) * 65535).astype(np.uint16)
    one = len(imagecodecs.jpeg2k_encode(u, level=40.0, codecformat="j2k", mct=False, numthreads=1))
    b = x[1, 0].astype(np.float64)
    u = np.round((b - b.min()) / (b.max() - b.min()) * 65535).astype(np.uint16)
    two = len(imagecodecs.jpeg2k_encode(u, level=40.0, codecformat="j2k", mct=False, numthreads=1))
    level40 = next(p for p in j2k["j2k-uint16"] if p.setting == "uint16 level 40")
    assert level40.bytes == one + two + 16  # min and range: 8 bytes per sample
    assert set(peers.jpeg_curves(x, True)) == {"jpeg-444"} and peers.jpeg_curves(x, False) == {}


def test_peers_skip_cleanly_when_their_library_is_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "imagecodecs", None)
    assert (
        peers.PEERS["sperr"].missing() == "SPERR skipped: imagecodecs is not installed (pip install 'dctdata[bench]')"
    )
    no_sperr = types.SimpleNamespace(SPERR=types.SimpleNamespace(available=False))
    monkeypatch.setitem(sys.modules, "imagecodecs", no_sperr)
    assert peers.PEERS["sperr"].missing() == "SPERR skipped: this imagecodecs build has no SPERR codec"
    monkeypatch.setitem(sys.modules, "zfpy", None)
    assert (
        peers.PEERS["zfp"].missing()
        == "ZFP fixed-accuracy skipped: zfpy is not installed (pip install 'dctdata[bench]')"
    )


# CLI -------------------------------------------------------------------------------------------------
def test_cli_tiny_run_end_to_end(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "imagecodecs", None)  # SZ3 is skipped with one line, ZFP runs
    out = tmp_path / "rd.json"
    argv = "rd --items mri --modes tiles --max-tiles 4 --targets 36 44 --peers zfp sz3 --levels 40 --per-pack"
    assert main([*argv.split(), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "- SZ3 skipped: imagecodecs is not installed" in text
    data = json.loads(out.read_text())
    (pack,) = data["packs"]
    assert pack["name"] == "mri/tiles" and pack["samples"] == 4 and pack["raw_bytes"] == 4 * 60 * 76 * 4
    assert [p["setting"] for p in pack["curves"]["dctdata"]] == ["--target-psnr 36", "--target-psnr 44"]
    assert set(pack["curves"]) == {"dctdata", "zfp"} and len(pack["curves"]["zfp"]) == 16
    ratio = pack["cr"]["dctdata"]["40"] / pack["cr"]["zfp"]["40"]
    assert data["summary"]["all packs"]["zfp"]["40"] == pytest.approx(ratio)
    assert f"| ZFP fixed-accuracy | {ratio:.2f} | 1 |" in text
    assert f"| mri/tiles | 4 | 1 | {pack['cr']['dctdata']['40']:.1f} |" in text
    assert f"points: {out}" in text and not os.path.exists(f"{out}.partial")


@pytest.mark.parametrize(
    "args, message",
    [
        ("--items nope", "--items: expected one of ('mri', 'dem'"),
        ("--modes tiles halves", "--modes: expected one of ('tiles', 'whole'). Got 'halves'"),
        ("--peers zfp webp", "--peers: expected one of ('zfp', 'sz3', 'sperr', 'j2k', 'jpeg'). Got 'webp'"),
        ("--targets 40", "--targets: expected at least two PSNR targets (a curve). Got [40.0]"),
        ("--targets 30 -5", "--targets: expected a finite number > 0. Got -5.0"),
        ("--levels 40 inf", "--levels: expected a finite number > 0. Got inf"),
        ("--max-tiles 0", "--max-tiles: expected an int >= 1. Got 0"),
    ],
)
def test_bad_arguments_get_one_clear_line(args, message, capsys):
    assert main(["rd", *args.split()]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("python -m benchmarks rd: error: ")
    assert message in err


def test_rd_fixed_bytes_example_takes_each_points_metadata_out(tmp_path, capsys, monkeypatch):
    """benchmarks/rd_fixed_bytes.py: the README's fixed-bytes figures from a bench rd JSON and from packs."""
    from benchmarks import rd_fixed_bytes as example

    out = tmp_path / "rd.json"
    argv = "rd --items mri --modes tiles --max-tiles 4 --targets 36 44 --peers zfp --levels 40"
    assert main([*argv.split(), "--json", str(out)]) == 0
    capsys.readouterr()
    data = json.loads(out.read_text())
    example.main(["ratios", str(out)])
    text = capsys.readouterr().out
    measured = data["summary"]["all packs"]["zfp"]["40"]
    rows = [line for line in text.splitlines() if line.startswith("| all packs |")]
    assert len(rows) == 2 and float(rows[0].split("|")[3]) == pytest.approx(measured, abs=5e-4)
    assert float(rows[1].split("|")[3]) > measured  # the same points with fewer bytes each
    example.main(["files", str(tmp_path / "fixed.json"), "--items", "mri", "--target-psnr", "36"])
    fixed = json.loads((tmp_path / "fixed.json").read_text())
    assert set(fixed) == {"mri/tiles", "mri/whole"}
    for entry in fixed.values():
        assert entry["total"] == sum(entry["files"].values()) > entry["fixed"] >= entry["files"]["manifest.json"]
