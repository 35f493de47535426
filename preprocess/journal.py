"""The progress journal that makes `dctdata pack --resume` possible.

A local pack writes into a fixed temporary sibling of OUT (`.OUT.partial`). Right after the writer
has created its metadata, the journal (`.dctdata-journal.jsonl` inside it) gets a header line: the
pack settings and the field specs *as calibrated*, so a resumed pack reuses the same CodecSpecs (and
skips calibration) and produces the same bytes. Then one line per finished part: its files with
sha256 and size, and its error figures. Lines are appended and fsync'ed as parts finish, in any
order; a line cut short by kill -9 is ignored. On `--resume`, a part counts as done only if every
file it lists still has the recorded size and sha256; anything else is redone.

The source is part of what a resume must match, not only its path: a pack killed, its data regenerated
and the same command resumed would otherwise mix old and new samples (and verify would pass). The header
records what identifies the source (`source_identity`: a file's size and modification time, a
directory's listing), and each part the crc32 of the source values it read (`parts.source_digest`); a
resume whose source differs in either is refused.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import zlib
from typing import Any

from dctdata.errors import DctDataError
from dctdata.format.checksum import sha256_file, with_path
from dctdata.format.fields import FieldSpec
from dctdata.format.manifest import FORMAT_VERSION

log = logging.getLogger(__name__)

JOURNAL_NAME = ".dctdata-journal.jsonl"


def source_identity(source: object) -> dict[str, Any] | None:
    """What identifies a local source's content cheaply: a file's size and modification time (ns); for a
    directory, the count and a crc32 of its sorted listing of (path, size, mtime) under it. None for other
    sources (URLs, module:callable, Python objects): the per-part digests still apply."""
    if not isinstance(source, (str, os.PathLike)):
        return None
    path = os.fspath(source)
    try:
        st = os.stat(path)
    except OSError:
        return None
    if os.path.isfile(path):
        return {"bytes": st.st_size, "mtime_ns": st.st_mtime_ns}
    if not os.path.isdir(path):
        return None
    crc, count = 0, 0
    for top, dirs, files in os.walk(path):
        dirs.sort()
        for name in sorted(files):
            full = os.path.join(top, name)
            try:
                f = os.stat(full)
            except OSError:
                continue
            crc = zlib.crc32(f"{os.path.relpath(full, path)}\0{f.st_size}\0{f.st_mtime_ns}\n".encode(), crc)
            count += 1
    return {"files": count, "listing_crc32": crc}


def _describe_identity(identity: dict[str, Any] | None) -> str:
    if not identity:
        return "unknown"
    if "bytes" in identity:
        return f"{identity['bytes']} bytes, modified at {identity['mtime_ns']} ns"
    return f"{identity['files']} files, listing crc32 {identity['listing_crc32']}"


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
    def start(
        cls,
        root: str,
        settings: dict,
        specs: tuple[FieldSpec, ...],
        derived: tuple[str, ...] = (),
        source: dict[str, Any] | None = None,
    ) -> Journal:
        """A new journal; `source`: the source's `source_identity`, which a resume must match."""
        j = cls(root, specs, {}, derived)
        j._append(
            {
                "kind": "header",
                "settings": settings,
                "fields": [f.to_dict() for f in specs],
                "derived": list(derived),
                "source": source,
                "format_version": FORMAT_VERSION,  # parts another version wrote are redone (their files may differ)
            }
        )
        return j

    @classmethod
    def resume(cls, root: str, settings: dict, source: dict[str, Any] | None = None) -> Journal:
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
        was = header.get("source")
        if was is not None and was != source:
            raise DctDataError(
                f"{root}: --resume: expected the source the interrupted pack read ({settings.get('source')}: "
                f"{_describe_identity(was)}). Got {_describe_identity(source)} (the source changed since: run without "
                "--resume to start over)"
            )
        specs = tuple(FieldSpec.from_dict(d, version=FORMAT_VERSION) for d in header["fields"])
        parts = {int(d["result"]["index"]): d["result"] for d in lines[1:] if d.get("kind") == "part"}
        if header.get("format_version") != FORMAT_VERSION and parts:  # e.g. sharded one-chunk files before 8
            log.warning("resume: the journal's parts were written for another format version; redoing them")
            parts = {}
        return cls(root, specs, parts, tuple(header.get("derived", ())))

    def _append(self, record: dict[str, Any]) -> None:
        try:
            with open(self.path, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(record) + "\n")
                fh.flush()
                os.fsync(fh.fileno())
        except OSError as exc:  # a full disk: say which file
            raise with_path(exc, self.path) from exc

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

    def check_source(self, done: dict[int, dict], digest) -> dict[int, dict]:
        """The parts of `done` whose source values are still what they read: `digest(start, stop)` gives
        {field: crc32} of the source's samples now (`parts.source_digest`). A part journaled without a
        digest (an older dctdata) is redone; one whose source values changed refuses the resume."""
        ok = {}
        for i, res in sorted(done.items()):
            if not isinstance(res.get("source"), dict):
                log.warning("resume: part %d has no record of its source values; redoing the part", i)
                continue
            now = digest(res["start"], res["stop"])
            if now != res["source"]:
                fields = sorted(k for k in set(now) | set(res["source"]) if now.get(k) != res["source"].get(k))
                raise DctDataError(
                    f"{self.root}: --resume: expected the source values the interrupted pack read for samples "
                    f"{res['start']}..{res['stop'] - 1}. Got different values of field(s) {', '.join(fields)} (the "
                    "source changed since: run without --resume to start over)"
                )
            ok[i] = res
        return ok

    def remove(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.remove(self.path)
