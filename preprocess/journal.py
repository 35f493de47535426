"""The progress journal that makes `dctdata pack --resume` possible.

A local pack writes into a fixed temporary sibling of OUT (`.OUT.partial`). Right after the writer
has created its metadata, the journal (`.dctdata-journal.jsonl` inside it) gets a header line: the
pack settings and the field specs *as calibrated*, so a resumed pack reuses the same CodecSpecs (and
skips calibration) and produces the same bytes. Then one line per finished part: its files with
sha256 and size, and its error figures. Lines are appended and fsync'ed as parts finish, in any
order; a line cut short by kill -9 is ignored. On `--resume`, a part counts as done only if every
file it lists still has the recorded size and sha256; anything else is redone.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from dctdata.errors import DctDataError
from dctdata.format.checksum import sha256_file
from dctdata.format.fields import FieldSpec
from dctdata.format.manifest import FORMAT_VERSION

log = logging.getLogger(__name__)

JOURNAL_NAME = ".dctdata-journal.jsonl"


class Journal:
    def __init__(
        self, root: str, specs: tuple[FieldSpec, ...], parts: dict[int, dict], derived: tuple[str, ...] = ()
    ) -> None:
        self.root = root
        self.path = os.path.join(root, JOURNAL_NAME)
        self.specs = specs
        self.parts = parts
        self.derived = tuple(derived)  # mask fields the pack makes (nan="mask")

    @classmethod
    def start(cls, root: str, settings: dict, specs: tuple[FieldSpec, ...], derived: tuple[str, ...] = ()) -> "Journal":
        j = cls(root, specs, {}, derived)
        j._append(
            {"kind": "header", "settings": settings, "fields": [f.to_dict() for f in specs], "derived": list(derived)}
        )
        return j

    @classmethod
    def resume(cls, root: str, settings: dict) -> "Journal":
        path = os.path.join(root, JOURNAL_NAME)
        lines = []
        try:
            with open(path, encoding="utf-8") as fh:
                for raw in fh:
                    try:
                        lines.append(json.loads(raw))
                    except json.JSONDecodeError:
                        break  # the line being written when the pack was killed
        except FileNotFoundError:
            pass
        if not lines or lines[0].get("kind") != "header":
            raise DctDataError(
                f"{root}: --resume: expected a progress journal {JOURNAL_NAME}. Got none (remove {root} to start over)"
            )
        header = lines[0]
        old = json.loads(json.dumps(header["settings"]))
        new = json.loads(json.dumps(settings))
        if old != new:
            diff = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
            raise DctDataError(
                f"{root}: --resume: expected the settings of the interrupted pack. Got different {', '.join(diff)} "
                f"(was {', '.join(f'{k}={old.get(k)!r}' for k in diff)}; run without --resume to start over)"
            )
        specs = tuple(FieldSpec.from_dict(d, version=FORMAT_VERSION) for d in header["fields"])
        parts = {int(d["result"]["index"]): d["result"] for d in lines[1:] if d.get("kind") == "part"}
        return cls(root, specs, parts, tuple(header.get("derived", ())))

    def _append(self, record: dict[str, Any]) -> None:
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def record(self, result: dict) -> None:
        self.parts[result["index"]] = result
        self._append({"kind": "part", "result": result})

    def verified(self, plan: list[tuple[int, int]]) -> dict[int, dict]:
        """Journaled parts that match the plan and whose files still have their recorded sha256."""
        ok = {}
        for i, res in sorted(self.parts.items()):
            if i >= len(plan) or (res.get("start"), res.get("stop")) != tuple(plan[i]):
                continue
            good = True
            for rel, entry in res["files"].items():
                path = os.path.join(self.root, *rel.split("/"))
                try:
                    got = sha256_file(path)
                except OSError:
                    got = None
                if got != (entry["sha256"], entry["bytes"]):
                    log.warning("resume: part %d: %s does not match its journaled sha256; redoing the part", i, rel)
                    good = False
                    break
            if good:
                ok[i] = res
        return ok

    def remove(self) -> None:
        try:
            os.remove(self.path)
        except FileNotFoundError:
            pass
