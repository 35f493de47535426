"""Reading a whole pack and running `dctdata verify` on it, as the robustness tests do after damaging
or tampering with one (shared by test_corruption and test_hostile_packs)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

from dctdata.cli import main
from dctdata.format.fields import EXTEND_VERSION, TABLES_VERSION, unpack_tables


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
    (the decoders crop the padding whatever filled it, so the samples read the same)."""
    for f in m["fields"] if version < EXTEND_VERSION else ():
        if isinstance(f["codec"], dict) and f["codec"].get("pad") == "extend":
            f["codec"]["pad"] = "symmetric"
    if version < TABLES_VERSION:
        for f in m["fields"]:
            f["codec"] = unpack_tables(f["codec"], m["version"])
    m["version"] = version
    return m
