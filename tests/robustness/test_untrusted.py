"""Untrusted data: nothing in a dataset or source can run code or write outside OUT.

- a static scan of all library code: no pickle-family imports, every np.load/read_array passes
  allow_pickle=False, no torch.load, no eval/exec/compile;
- pickled payloads (object .npy) as a source, as a webdataset member, and .pyd/.pickle/.pth members
  are refused with clear errors, and the payload never runs (it would create a marker file);
- manifest strings that look like code are data: reading, info, verify and loading never evaluate them;
- `pipe:` URLs only when the caller passes allow_pipe=True.
"""

from __future__ import annotations

import ast
import hashlib
import io
import json
import pathlib
import shutil
import tarfile

import numpy as np
import pytest
from pack_checks import reseal

import dctdata
from dctdata.cli import main
from dctdata.errors import DctDataError, IntegrityError

ROOT = pathlib.Path(__file__).resolve().parents[2]
LIBRARY = [p for d in ("dctdata", "preprocess", "loaders") for p in sorted((ROOT / d).rglob("*.py"))]
BANNED_MODULES = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "joblib", "marshal", "shelve"}


def _calls(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            owner = f.value.id if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) else ""
            yield node, name, owner, isinstance(f, ast.Name)


def scan(path: pathlib.Path) -> list[str]:
    """Problems in one source file (line-numbered)."""
    tree = ast.parse(path.read_text(), str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [
                f"{path}:{node.lineno}: import {a.name}" for a in node.names if a.name.split(".")[0] in BANNED_MODULES
            ]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in BANNED_MODULES:
            out.append(f"{path}:{node.lineno}: from {node.module} import")
    for node, name, owner, bare in _calls(tree):
        kw = {k.arg: k.value for k in node.keywords}
        if (name in ("load", "read_array") and owner in ("np", "numpy", "format")) or name == "read_array":
            v = kw.get("allow_pickle")
            if not (isinstance(v, ast.Constant) and v.value is False):
                out.append(f"{path}:{node.lineno}: {owner}.{name} without allow_pickle=False")
        if name == "load" and owner == "torch":
            out.append(f"{path}:{node.lineno}: torch.load")
        literal_import = name == "__import__" and node.args and isinstance(node.args[0], ast.Constant)
        if bare and name in ("eval", "exec", "compile", "__import__") and not literal_import:
            out.append(f"{path}:{node.lineno}: {name}()")
        if name in ("load", "unsafe_load") and owner == "yaml":
            out.append(f"{path}:{node.lineno}: yaml.{name}")
    return out


def test_library_has_no_pickle_eval_or_torch_load():
    assert len(LIBRARY) > 20
    problems = [p for path in LIBRARY for p in scan(path)]
    assert problems == []


def test_scanner_catches_what_it_should(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import pickle\nimport numpy as np, torch\nfrom joblib import load\n"
        "np.load('x', allow_pickle=True)\nnp.load('y')\ntorch.load('m.pt', weights_only=False)\n"
        "eval(manifest['pack'])\nexec('1')\nmodel.eval()\n__import__(name)\n__import__('sys')\n"
    )
    found = scan(bad)
    assert len(found) == 8 and not any("model" in p for p in found)


class Payload:
    """Unpickling this runs open(marker, 'w'): if the marker ever exists, code ran."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def pickled_npy(marker) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.array([Payload(marker), Payload(marker)], dtype=object), allow_pickle=True)
    return buf.getvalue()


@pytest.mark.parametrize("layout", ["file", "dir"])
def test_pickled_npy_source_is_refused_and_never_runs(tmp_path, capsys, layout):
    marker = tmp_path / "PWNED"
    if layout == "file":
        src = tmp_path / "evil.npy"
        src.write_bytes(pickled_npy(marker))
    else:
        src = tmp_path / "d"
        src.mkdir()
        np.save(src / "0.npy", np.ones((8, 8), np.float32))
        (src / "1.npy").write_bytes(pickled_npy(marker))
    assert main(["pack", str(src), str(tmp_path / "out"), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "expected a numeric array. Got dtype object" in err and len(err.strip().splitlines()) == 1
    assert not marker.exists() and not (tmp_path / "out").exists()


@pytest.fixture
def wds(tmp_path):
    x = (np.random.default_rng(0).standard_normal((8, 1, 8, 8)) + 5).astype(np.float32)
    np.savez(tmp_path / "src.npz", image=x, label=np.arange(8, dtype=np.int64))
    dctdata.pack(
        tmp_path / "src.npz",
        tmp_path / "wds",
        format="webdataset",
        lossless={},
        quiet=True,
        writer_options={"samples_per_shard": 4, "samples_per_member": 1},  # a member per sample and field
    )
    return tmp_path / "wds"


def rewrite_shard(root, name, replace=None, extra=()):
    """Rebuild a shard with members replaced/added and re-seal the manifest (the checksums pass)."""
    path = root / name
    buf = io.BytesIO()
    with tarfile.open(path) as src, tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as dst:
        for m in src.getmembers():
            data = src.extractfile(m).read()
            if replace and m.name in replace:
                data = replace[m.name]
                m.size = len(data)
            dst.addfile(m, io.BytesIO(data))
        for extra_name, payload in extra:
            ti = tarfile.TarInfo(extra_name)
            ti.size = len(payload)
            dst.addfile(ti, io.BytesIO(payload))
    seal(root, name, buf.getvalue())


def seal(root, name, data):
    (root / name).write_bytes(data)
    m = json.loads((root / "manifest.json").read_text())
    digest = hashlib.sha256(data).hexdigest()
    for s in m["layout"]["shards"]:
        if s["name"] == name:
            s["bytes"], s["sha256"] = len(data), digest
    m["checksums"][name] = {"sha256": digest, "bytes": len(data)}
    (root / "manifest.json").write_text(json.dumps(reseal(m)))


def test_pickled_webdataset_member_is_refused_and_never_runs(wds, tmp_path, capsys):
    marker = tmp_path / "PWNED"
    rewrite_shard(wds, "shard-000000.tar", replace={"000000001.label.npy": pickled_npy(marker)})
    with pytest.raises(
        IntegrityError,
        match=r"shard-000000\.tar: sample 1 field 'label': expected a numeric \.npy array\. "
        r"Got an object array, which only pickle could load",
    ):
        list(dctdata.open_dataset(wds, shuffle=False))
    skip = dctdata.open_dataset(wds, shuffle=False, on_error="skip")
    assert [int(s[1]) for s in skip] == [0, 4, 5, 6, 7] and skip.stats["samples_skipped"] == 3
    assert (
        main(["verify", str(wds)]) == 1
        and "Got an object array, which only pickle could load" in capsys.readouterr().out
    )
    assert not marker.exists()


@pytest.mark.parametrize(
    "member",
    [
        *[
            "000000000.model.pth",
            "000000000.state.pickle",
            "000000000.ext.pyd",
            "000000000.image.pyd",
            "000000000.x.pkl",
        ],
        *["../../outside.npy", "/etc/cron.d/x.npy", "000000000.image.npy/../../x"],
    ],
)
def test_code_like_and_escaping_members_are_refused(wds, tmp_path, member):
    marker = tmp_path / "PWNED"
    rewrite_shard(wds, "shard-000000.tar", extra=[(member, pickled_npy(marker))])
    with pytest.raises(IntegrityError, match=r"shard-000000\.tar: tar member .*expected"):
        list(dctdata.open_dataset(wds, shuffle=False))
    assert not marker.exists() and not (tmp_path / "outside.npy").exists()


def test_symlink_and_device_members_are_refused(wds):
    path = wds / "shard-000001.tar"
    buf = io.BytesIO()
    with tarfile.open(path) as src, tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as dst:
        link = tarfile.TarInfo("000000004.label.npy")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        dst.addfile(link)
        for m in src.getmembers():
            dst.addfile(m, src.extractfile(m))
    seal(wds, "shard-000001.tar", buf.getvalue())  # the checksum passes: the member check must catch it
    with pytest.raises(IntegrityError, match=r"tar member '000000004\.label\.npy': expected a regular file"):
        list(dctdata.open_dataset(wds, shuffle=False))


CODE = "__import__('pathlib').Path('{}').touch()"


@pytest.mark.parametrize("fmt", ["zarr", "webdataset"])
def test_manifest_strings_are_never_evaluated(tmp_path, capsys, fmt):
    marker = tmp_path / "PWNED"
    np.save(tmp_path / "x.npy", (np.random.default_rng(1).standard_normal((4, 8, 8)) + 3).astype(np.float32))
    dctdata.pack(tmp_path / "x.npy", tmp_path / "d", format=fmt, quiet=True)
    m = json.loads((tmp_path / "d" / "manifest.json").read_text())
    code = CODE.format(marker)
    m["pack"]["source"] = code
    m["pack"]["source_info"] = {"classes": [code]}
    m["dctdata_version"] = code
    m["layout"]["note"] = code
    (tmp_path / "d" / "manifest.json").write_text(json.dumps(reseal(m)))
    assert main(["info", str(tmp_path / "d")]) == 0
    assert main(["verify", str(tmp_path / "d")]) == 0
    capsys.readouterr()
    ds = dctdata.open_dataset(tmp_path / "d")
    assert len(list(ds) if fmt == "webdataset" else [ds[i] for i in range(len(ds))]) == 4
    assert not marker.exists()
    # a code string where a number belongs is a format error, not something to run
    m["samples"] = code
    (tmp_path / "d" / "manifest.json").write_text(json.dumps(reseal(m)))
    with pytest.raises(DctDataError, match=r"samples: expected an int >= 0\. Got \"__import__"):
        dctdata.open_dataset(tmp_path / "d")
    assert not marker.exists()


def test_pipe_urls_only_when_passed_explicitly(wds, tmp_path):
    marker = tmp_path / "PWNED"
    url = f"pipe:touch {marker}; cat {wds}/{{}}"
    for call in (lambda: dctdata.open_dataset(url), lambda: dctdata.format.read_manifest(url)):
        with pytest.raises(DctDataError):
            call()
    assert main(["verify", url]) == 1 and not marker.exists()
    ds = dctdata.open_dataset(url, allow_pipe=True, shuffle=False)  # the caller's explicit choice
    assert [int(s[1]) for s in ds] == list(range(8)) and marker.exists()


def test_pack_writes_nothing_outside_out(tmp_path):
    (tmp_path / "work").mkdir()
    np.save(tmp_path / "work" / "x.npy", np.ones((2, 8, 8), np.float32))
    before = sorted(p.name for p in tmp_path.iterdir())
    for fmt in ("zarr", "webdataset"):
        dctdata.pack(tmp_path / "work" / "x.npy", tmp_path / f"out_{fmt}", format=fmt, quiet=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*before, "out_webdataset", "out_zarr"])
    assert sorted(p.name for p in (tmp_path / "work").iterdir()) == ["x.npy"]
    shutil.rmtree(tmp_path / "out_zarr")
