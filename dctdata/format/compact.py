"""Version 8 of the manifest: its fixed bytes (issue 46). A small pack stores a manifest and zarr.json files
whatever its size, and on a single small volume they were a large share of it. Version 8 writes in the manifest
only what a reader cannot derive, and checksums in fewer characters; a `Manifest` in memory keeps the full
form, so nothing past the reader changes (`Manifest.to_dict` compacts, `Manifest.from_dict` fills back).

- checksums: each entry `"<sha256 as unpadded base64url>:<bytes>"` (`pack_checksum`; 43 characters for the
  digest's 64 hex digits, no keys). An entry in the object form of versions 1-7 is read too (tools that edit
  a manifest may write it). zarr.json files are not listed: a reader rebuilds each from the manifest and
  requires those exact bytes (`dctdata.format.zarr.reader`), which the sha256 checked before.
- the seal: the digest as unpadded base64url, no "sha256:" prefix (`dctdata.format.manifest.manifest_seal`).
- a dct field's codec: `channels`, `depth`, `height`, `width` left out where the field's shape says them
  (`[C, H, W]` or `[C, D, H, W]`), `pad` where it is "extend".
- a dct field's `dctdata_ctxrans` stage config: `cf`, `mask`, `channels` left out where the codec says them,
  `channel_groups` where it is one group, and each entry of `LOSSLESS_DEFAULTS` where it has that value (an
  entry the config leaves out is written null, so leaving out keeps meaning "the default").
- the entropy model's `params` (base64 of zlib of its parameter bytes, `dctdata.entropy.ctxrans`): written as
  one digit p and the base85 (RFC 1924 alphabet, `base64.b85encode`) of the raw deflate stream of the bytes
  shifted right by p, every byte a multiple of 2^p (`pack_params`): `CtxCodec.fit` picks coarse parameter
  grids for small sets, whose low zero bits, zlib's header and checksum, and base64's 6 bits a character
  (base85: 6.4) cost bytes. A reader restores the config's own form.
- stats: `overflow` left out at 0, `psnr_median` and `psnr_dataset` where they equal `psnr_min` (one sample,
  one channel: the same figure three times); a `psnr_dataset` the pack has none of is written null.

Filling back is lenient about shapes it does not expect (left as written, for the strict checks after it to
name), and strict about the new forms: a checksum entry that is neither form is a FormatError naming it.
"""

from __future__ import annotations

import base64
import binascii
import re
import zlib
from collections.abc import Mapping
from typing import Any

from dctdata.errors import FormatError
from dctdata.format.kinds import CODED

COMPACT_VERSION = 8
CTXRANS_ID = "dctdata_ctxrans"  # `dctdata.entropy.ctxrans.CODEC_ID` (the format does not import the entropy coder)
# The stage config entries a version 8 manifest leaves out at these values (what `CtxCodec.fit` writes most).
LOSSLESS_DEFAULTS: Mapping[str, Mapping[str, Any]] = {
    CTXRANS_ID: {
        "version": 3,
        "freq_classes": "uv",
        "lt_mode": "top",
        "wide": False,
        "sign_flip": [],
        "edges_lt": [1, 3, 7],
        "edges_ch": [],
        "edges_dc": [1, 2, 4, 8, 16, 32, 64],
        "segment": 8192,
        "segment_bytes": 6000,
    }
}
_FROM_CODEC = ("cf", "mask", "channels")  # a ctxrans config's entries its field's codec says too
_CHECKSUM_RE = re.compile(r"^([A-Za-z0-9_-]{43}):(0|[1-9][0-9]{0,17})$")
_PSNR_SAME = ("psnr_median", "psnr_dataset")
MAX_PARAMS = 2 << 16  # parameter bytes a ctxrans model has at most (two per context, `ctxrans.MAX_CONTEXTS`)


def pack_params(text: object) -> object:
    """A ctxrans config's `params` (base64 of zlib) in version 8's form (see the module docstring); anything
    that is not such a value as it is."""
    if not isinstance(text, str):
        return text
    try:
        raw = zlib.decompress(base64.b64decode(text, validate=True))
    except (binascii.Error, ValueError, zlib.error):
        return text
    if not raw or len(raw) > MAX_PARAMS:
        return text
    p = min(7, min(((b & -b).bit_length() - 1 for b in raw if b), default=7))
    deflate = zlib.compressobj(9, zlib.DEFLATED, -15)
    body = deflate.compress(bytes(b >> p for b in raw)) + deflate.flush()
    return f"{p}{base64.b85encode(body).decode('ascii')}"


def unpack_params(text: object, where: str) -> object:
    """Inverse of `pack_params`: the config's base64 of zlib (level 9) of the parameter bytes. A value that
    does not start with a digit is the config's own form, left for the stage to check."""
    if not isinstance(text, str) or not text[:1] or text[0] not in "0123456789":
        return text
    p = int(text[0])
    try:
        inflate = zlib.decompressobj(-15)
        raw = inflate.decompress(base64.b85decode(text[1:]), MAX_PARAMS + 1)
        complete = inflate.eof and not inflate.unconsumed_tail and not inflate.unused_data
    except (ValueError, zlib.error):
        complete, raw = False, b""
    if p > 7 or not complete or not raw or len(raw) > MAX_PARAMS or max(raw) >= 256 >> p:
        raise FormatError(
            f"{where}: params: expected a digit 0..7 and base85 of one raw deflate stream of at most {MAX_PARAMS} "
            f"parameter bytes below 2^(8 - digit), or base64 of zlib. Got {text[:40]!r}"
        )
    return base64.b64encode(zlib.compress(bytes(b << p for b in raw), 9)).decode("ascii")


def b64_digest(digest: bytes) -> str:
    """A sha256 digest as version 8 writes it: unpadded base64url (43 characters)."""
    return base64.urlsafe_b64encode(digest).decode("ascii").rstrip("=")


def pack_checksum(entry: Mapping[str, Any]) -> object:
    """A checksum entry {"sha256": hex, "bytes": n} as version 8 writes it; anything else as it is."""
    sha, n = entry.get("sha256"), entry.get("bytes")
    if set(entry) != {"sha256", "bytes"} or not isinstance(sha, str) or not isinstance(n, int) or isinstance(n, bool):
        return dict(entry)
    try:
        digest = bytes.fromhex(sha)
    except ValueError:
        return dict(entry)
    return f"{b64_digest(digest)}:{n}" if len(digest) == 32 and digest.hex() == sha else dict(entry)


def unpack_checksum(entry: object, where: str) -> object:
    """A version 8 checksum entry back to {"sha256": hex, "bytes": n}; the object form as it is."""
    if isinstance(entry, Mapping):
        return entry
    m = _CHECKSUM_RE.match(entry) if isinstance(entry, str) else None
    digest = None
    if m:
        try:
            digest = base64.urlsafe_b64decode(m.group(1) + "=")
        except (binascii.Error, ValueError):
            digest = None
    if m is None or digest is None or b64_digest(digest) != m.group(1):
        raise FormatError(
            f'{where}: expected "<sha256 as 43 base64url characters>:<bytes>" or '
            f'{{"sha256": hex, "bytes": int}}. Got {str(entry)[:80]!r}'
        )
    return {"sha256": digest.hex(), "bytes": int(m.group(2))}


def _stage_id(lossless: Mapping[str, Any]) -> str | None:
    """A stage config's id where it is a string (a hostile one may be anything JSON holds)."""
    sid = lossless.get("id")
    return sid if isinstance(sid, str) else None


def _dims(shape: object) -> dict[str, int] | None:
    """The codec entries a dct field's shape says: [C, H, W] or [C, D, H, W]."""
    if not isinstance(shape, list) or len(shape) not in (3, 4):
        return None
    if not all(isinstance(n, int) and not isinstance(n, bool) for n in shape):
        return None
    out = {"channels": shape[0], "height": shape[-2], "width": shape[-1]}
    if len(shape) == 4:
        out["depth"] = shape[1]
    return out


def _compact_field(f: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(f)
    codec, lossless = f.get("codec"), f.get("lossless")
    if f.get("kind") != CODED.value or not isinstance(codec, Mapping):
        return out
    dims = _dims(f.get("shape")) or {}
    written = {k: v for k, v in codec.items() if not (k in dims and v == dims[k]) and (k, v) != ("pad", "extend")}
    if "depth" in dims and "depth" not in codec:  # a 2-D codec on a [C, D, H, W] shape: no depth, said so
        written["depth"] = None
    out["codec"] = written
    if isinstance(lossless, Mapping) and _stage_id(lossless) in LOSSLESS_DEFAULTS:
        defaults = LOSSLESS_DEFAULTS[lossless["id"]]  # a known id: a string
        said = {k: codec.get(k) for k in _FROM_CODEC}
        ch = codec.get("channels")
        groups = [0] * ch if isinstance(ch, int) and not isinstance(ch, bool) and 0 < ch <= 4096 else None
        kept = {
            k: v
            for k, v in lossless.items()
            if not (k in said and v == said[k])
            and not (k == "channel_groups" and v == groups)
            and not (k in defaults and v == defaults[k])
        }
        out["lossless"] = {**kept, **{k: None for k in defaults if k not in lossless}}
        if "params" in kept:
            out["lossless"]["params"] = pack_params(kept["params"])
    return out


def _full_field(f: object, where: str) -> object:
    """Any field with a codec object is filled back (a field of another kind then fails on its kind, not on the
    entries left out)."""
    if not isinstance(f, Mapping) or not isinstance(f.get("codec"), Mapping):
        return f
    out = dict(f)
    codec = {"pad": "extend", **(_dims(f.get("shape")) or {}), **f["codec"]}
    out["codec"] = {k: v for k, v in codec.items() if not (k == "depth" and v is None)}
    lossless = f.get("lossless")
    if isinstance(lossless, Mapping) and _stage_id(lossless) in LOSSLESS_DEFAULTS:
        said = {k: out["codec"].get(k) for k in _FROM_CODEC}
        ch = said["channels"]
        filled = {**LOSSLESS_DEFAULTS[lossless["id"]], **said, **lossless}  # a known id: a string
        if "channel_groups" not in lossless and isinstance(ch, int) and not isinstance(ch, bool) and 0 < ch <= 4096:
            filled["channel_groups"] = [0] * ch
        out["lossless"] = {k: v for k, v in filled.items() if v is not None}
        if "params" in lossless:
            out["lossless"]["params"] = unpack_params(lossless["params"], f"{where}: field {f.get('name')!r}: lossless")
    return out


def _compact_stats(s: object) -> object:
    if not isinstance(s, Mapping):
        return s
    out = {k: v for k, v in s.items() if not (k == "overflow" and v == 0)}
    for k in _PSNR_SAME:
        if k in out and out[k] == s.get("psnr_min"):
            del out[k]
        elif k not in s:
            out[k] = None
    return out


def _full_stats(s: object) -> object:
    if not isinstance(s, Mapping):
        return s
    out = {"overflow": 0, **{k: s.get("psnr_min") for k in _PSNR_SAME}, **s}
    return {k: v for k, v in out.items() if not (k == "psnr_dataset" and v is None)}


def compact_v8(d: dict[str, Any]) -> dict[str, Any]:
    """A manifest dict as versions 3-7 write it, in version 8's form (see the module docstring)."""
    out = dict(d)
    if isinstance(d.get("checksums"), Mapping):
        out["checksums"] = {k: pack_checksum(v) if isinstance(v, Mapping) else v for k, v in d["checksums"].items()}
    if isinstance(d.get("fields"), list):
        out["fields"] = [_compact_field(f) if isinstance(f, Mapping) else f for f in d["fields"]]
    if isinstance(d.get("stats"), Mapping):
        out["stats"] = {k: _compact_stats(v) for k, v in d["stats"].items()}
    return out


def full_v8(d: Mapping[str, Any], where: str) -> dict[str, Any]:
    """Inverse of `compact_v8` on a version 8 manifest dict as read; a malformed checksum entry is a
    FormatError naming it, other shapes are left for the strict checks that follow."""
    out = dict(d)
    if isinstance(d.get("checksums"), Mapping):
        out["checksums"] = {k: unpack_checksum(v, f"{where}: checksums[{k!r}]") for k, v in d["checksums"].items()}
    if isinstance(d.get("fields"), list):
        out["fields"] = [_full_field(f, where) for f in d["fields"]]
    if isinstance(d.get("stats"), Mapping):
        out["stats"] = {k: _full_stats(v) for k, v in d["stats"].items()}
    return out
