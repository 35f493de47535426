"""Reading a whole pack and running `dctdata verify` on it, as the robustness tests do after damaging
or tampering with one (shared by test_corruption and test_hostile_packs); `difference`, how far a device
pack is from the CPU pack (the device-pack tests and `python -m benchmarks pack-speed`); `quick_pack`, a pack
whose lossless stage is zstd, for tests of what the stage cannot change."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import torch

import dctdata
from dctdata.cli import main
from dctdata.errors import DctDataError
from dctdata.format.compact import COMPACT_VERSION, full_v8
from dctdata.format.fields import EXTEND_VERSION, TABLES_VERSION, unpack_tables

# The lossless stage of `quick_pack`: zstd at level 1.
ZSTD = {"id": "zstd", "level": 1}


def quick_pack(source, out, **kw):
    """`dctdata.pack` with zstd as the lossless stage unless `kw` names one. For tests of the decoded values
    (bounds, lattices, corrections, dtypes), which a bit-exact stage cannot change: the default stage "auto"
    fits the context coder on every pack, most of a small pack's time; the stages' own tests cover it."""
    return dctdata.pack(source, out, **{"lossless": ZSTD, **kw})


def read_all(ds) -> list:
    """Every sample of a map-style or iterable dataset."""
    if isinstance(ds, torch.utils.data.IterableDataset):
        return list(ds)
    return ds.__getitems__(list(range(len(ds))))


def verify(capsys, root) -> tuple[int, str]:
    """(exit code, output) of `dctdata verify root`; never a traceback."""
    rc = main(["verify", str(root)])
    cap = capsys.readouterr()
    assert "Traceback" not in cap.out + cap.err
    return rc, cap.out + cap.err


def rehash(root: Path, rel: str) -> None:
    """Record a file's new sha256 and size in the manifest (a tamperer who recomputes checksums and the
    manifest's seal)."""
    m = json.loads((root / "manifest.json").read_text())
    data = (root / rel).read_bytes()
    m["checksums"][rel] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    (root / "manifest.json").write_text(json.dumps(reseal(m)))


def reseal(m: dict) -> dict:
    """A manifest dict edited on purpose, with its seal (format version 5) recomputed: what a tamperer does,
    and a test that edits a manifest to reach a later check."""
    from dctdata.format.manifest import SEAL_VERSION, manifest_seal

    if isinstance(m.get("version"), int) and m["version"] >= SEAL_VERSION:
        m["seal"] = manifest_seal(m)
    else:
        m.pop("seal", None)  # an older version has none
    return m


def as_version(m: dict, version: int) -> dict:
    """A manifest's JSON edited to claim an older `version`, as that version wrote it: codec tables that the
    writer packed (version >= TABLES_VERSION) back to JSON numbers, pad "extend" (EXTEND_VERSION) as "symmetric"
    (the decoders crop the padding whatever filled it, so the samples read the same), version 8's compact entries
    filled back (`dctdata.format.compact`; its zarr.json files stay unlisted, which older readers allow)."""
    if m["version"] >= COMPACT_VERSION > version:
        m.update(full_v8(m, "manifest"))
    for f in m["fields"] if version < EXTEND_VERSION else ():
        if isinstance(f["codec"], dict) and f["codec"].get("pad") == "extend":
            f["codec"]["pad"] = "symmetric"
    if version < TABLES_VERSION:
        for f in m["fields"]:
            f["codec"] = unpack_tables(f["codec"], m["version"])
    m["version"] = version
    return m


def tree_bytes(root: Path) -> int:
    """Bytes on disk of every file under `root`."""
    return sum(p.stat().st_size for p in Path(root).rglob("*") if p.is_file())


def difference(a: str | os.PathLike, b: str | os.PathLike, batch: int = 64) -> dict[str, Any]:
    """How far pack `b` (a device pack) is from pack `a` (the CPU pack of the same source and settings): the
    stored coefficients of every dct field compared value by value, and each pack's bytes on disk. Returns
    {"coefficients": compared, "differing": how many differ, "largest": the largest |difference| in quantized
    steps, "side_differing": side values that differ, "bytes": (bytes of a, bytes of b)}."""
    da, db = dctdata.open_dataset(a, as_dict=True), dctdata.open_dataset(b, as_dict=True)
    if len(da) != len(db):
        raise DctDataError(f"{b}: expected {len(da)} samples like {a}. Got {len(db)}")
    dct = [f.name for f in da.manifest.fields if f.is_dct]
    compared = differing = side_differing = 0
    largest = 0.0
    for start in range(0, len(da), batch):
        idx = list(range(start, min(len(da), start + batch)))
        for sa, sb in zip(da.__getitems__(idx), db.__getitems__(idx)):
            for name in dct:
                va, vb = sa[name], sb[name]
                qa, qb = (va[0], vb[0]) if isinstance(va, tuple) else (va, vb)
                d = (torch.as_tensor(qa).double() - torch.as_tensor(qb).double()).abs()
                compared += d.numel()
                differing += int((d > 0).sum())
                largest = max(largest, float(d.max()) if d.numel() else 0.0)
                if isinstance(va, tuple):
                    side_differing += int((torch.as_tensor(va[1]) != torch.as_tensor(vb[1])).sum())
    return {
        "coefficients": compared,
        "differing": differing,
        "largest": largest,
        "side_differing": side_differing,
        "bytes": (tree_bytes(a), tree_bytes(b)),
    }
