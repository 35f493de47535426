"""benchmarks/max_error.py on a tiny configuration: dctdata's bytes split into coefficient shards, side
shards and fixed files that add up to the pack, "per sample" leaves the fixed files out, and every peer
that is installed holds the bound."""

import json
import re

import numpy as np
import pytest

from benchmarks import max_error


def test_pack_split_adds_up(tmp_path):
    import dctdata

    x = max_error.spiky(8, 64, seed=1)  # side values of 8 x 66 rows: a shard of their own
    dctdata.pack(x, tmp_path / "p", max_rel_error=1e-3, quiet=True)
    split = max_error.pack_split(tmp_path / "p")
    root = tmp_path / "p"
    files = {p.relative_to(root).as_posix(): p.stat().st_size for p in root.rglob("*") if p.is_file()}
    assert sum(split.values()) == sum(files.values())
    fixed = files["manifest.json"] + sum(v for k, v in files.items() if k.endswith("zarr.json"))
    assert split["fixed"] == fixed and split["coefficients"] > 0 and split["side"] > 0
    small = max_error.spiky(2, 16, seed=1)  # side values of 2 x 18 rows: kept in the manifest, counted as side
    dctdata.pack(small, tmp_path / "s", max_rel_error=1e-3, quiet=True)
    split = max_error.pack_split(tmp_path / "s")
    assert not (tmp_path / "s" / "image__side").exists() and split["side"] > 0
    assert sum(split.values()) == sum(p.stat().st_size for p in (tmp_path / "s").rglob("*") if p.is_file())
    split2: dict = {}
    nbytes, over = max_error.ours(x, 1e-3, split2)
    assert over == 0 and nbytes == sum(split2.values())


@pytest.mark.slow
def test_table_reports_per_sample_and_the_split(capsys):
    max_error.main(["--n", "2", "--size", "32", "--bounds", "1e-3", "--split"])
    out = capsys.readouterr().out
    head = next(line for line in out.splitlines() if line.startswith("field"))
    names = head.split()[2:]
    assert names[:3] == ["dctdata", "per", "sample"]
    for field in ("atoms", "beam", "clouds", "spiky"):
        row = next(line for line in out.splitlines() if line.startswith(field) and "total" not in line)
        ratios = [float(v) for v in row.split()[2:4]]
        assert ratios[1] > ratios[0] > 0  # without the fixed files each pack stores less
        assert "dctdata:" not in row  # no item over its bound
        split = next(line for line in out.splitlines() if line.startswith(field) and "total" in line)
        total, *parts = (int(v) for v in re.findall(r"(?:total|coefficients|side|fixed) (\d+)", split))
        assert total == sum(parts) and len(parts) == 3
    assert re.search(r"geomean +1e-03 .* dctdata vs .* \(per sample: ", out)
    assert np.isfinite([float(v) for v in re.findall(r"geomean +1e-03 +([\d.]+)", out)]).all()


@pytest.mark.parametrize("name", ["SZ3", "ZFP", "SPERR"])
def test_peers_hold_the_bound(name):
    try:
        nbytes, over = max_error.CODECS[name](max_error.spiky(1, 32, seed=2), 1e-3)
    except ImportError as exc:
        pytest.skip(f"{name}: {exc}")
    assert nbytes > 0 and over == 0


@pytest.mark.slow
def test_items_set_packs_tiles_and_whole_with_group_means(capsys, tmp_path):
    pytest.importorskip("skimage")  # the MRI slice ships with scikit-image's data
    data, groups, skipped = max_error.item_packs(["mri"])
    assert not skipped and set(data) == {"mri/tiles", "mri/whole"} and set(groups.values()) == {"sci"}
    assert data["mri/tiles"].shape[1:] == (1, 60, 76) and data["mri/whole"].shape[0] == 1
    max_error.main(["--set", "items", "--items", "mri", "--bounds", "1e-3", "--json", str(tmp_path / "r.json")])
    out = capsys.readouterr().out
    result = json.loads((tmp_path / "r.json").read_text())
    assert [(r["pack"], r["group"], r["bound"]) for r in result["packs"]] == [
        ("mri/tiles", "sci", "1e-3"),
        ("mri/whole", "sci", "1e-3"),
    ]
    assert [m["over"] for m in result["geomeans"]] == ["all", "sci"]
    mean = result["geomeans"][0]
    expect = np.exp(np.mean(np.log([r["dctdata"] for r in result["packs"]])))
    assert mean["dctdata"] == pytest.approx(expect, rel=0.01)
    if "ZFP" in mean:
        assert mean["dctdata / ZFP"] == pytest.approx(mean["dctdata"] / mean["ZFP"], rel=0.02)
    for name in data:
        row = next(line for line in out.splitlines() if line.startswith(name))
        assert float(row.split()[2]) > 1 and "dctdata:" not in row  # compresses, every value within the bound
    overall = re.search(r"^geomean +1e-03 +([\d.]+)", out, re.M)
    group = re.search(r"^  sci +1e-03 +([\d.]+)", out, re.M)
    assert overall and group and overall.group(1) == group.group(1)  # one group: its mean is the overall one


def test_volumes_set_packs_each_real_volume_in_3d_within_its_bound():
    pytest.importorskip("nibabel")
    data = max_error.volume_sets()
    assert {k: (v.shape, v.dtype.name) for k, v in data.items()} == {
        "example4d": ((2, 1, 24, 96, 128), "int16"),
        "anatomical": ((1, 1, 25, 41, 33), "int16"),
        "functional": ((20, 1, 3, 21, 17), "float32"),
    }
    x = data["anatomical"]
    split: dict = {}
    nbytes, over = max_error.ours(x, 1e-2, split)
    assert over == 0 and nbytes == sum(split.values()) and nbytes < x.size * 2  # under the int16 bytes
    loose, _ = max_error.ours(x, 1e-1)
    assert loose < nbytes
