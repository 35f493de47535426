"""The lossless stage: what a field's stored arrays go through, described by a JSON config in the
manifest (numcodecs style), so any reader rebuilds exactly the codec the writer used.

Two kinds of stage:
- a bytes codec from numcodecs (zstd, gzip, blosc, ...) over an array's raw bytes: every field kind;
- the context-modelled entropy coder of `dctdata.entropy` (id "dctdata_ctxrans"), whose fitted model is
  part of its config: integer DCT coefficients only. It needs the array's shape to decode, which the
  readers know from the manifest.

Only codecs on an allow-list may be named: a manifest comes with the data, and numcodecs can build
codecs whose decoder runs code (`pickle`). Decoding is bounded by the size the reader expects, so a
small hostile stream cannot make it allocate more (a zstd "bomb" stops at the expected size).

Choice of the defaults (measured on quantized coefficients of package-shipped images and SciML fields;
the figures are in docs/benchmarks/entropy.md): the entropy coder stores the fewest bytes and decodes
several times slower than zstd; zstd-19 stores fewer bytes than zstd-9 and decodes as fast or faster, but
encodes much slower, once, offline. So: integer dct fields get the smaller of the fitted entropy coder and
zstd-19 ("auto": bytes first; zstd-19 wins on periodic textures its long matches catch), everything else
zstd-9 (packing speed; masks and labels are a small share of a pack). `--lossless zstd` (zstd-19 on the dct
fields too) is the read-speed choice: several times the entropy coder's decode speed per core for more
bytes, which reads a zarr batch at about the speed tensorstore reads the same samples as raw float32.
"""

from __future__ import annotations

import json
import math
import threading
from typing import Any, Callable, Mapping

import numcodecs
import numpy as np
import zstandard

from dctdata.errors import DctDataError, IntegrityError

# The default stage of array and label fields and of float coefficients.
DEFAULT_CODEC: dict[str, Any] = {"id": "zstd", "level": 9}
ZSTD_MAX: dict[str, Any] = {"id": "zstd", "level": 19}
AUTO = "auto"  # pack setting: per dct field, the smaller of the entropy coder and zstd-19
CTX_ID = "dctdata_ctxrans"
# Bytes codecs a manifest may name: compressors whose decoders only produce bytes.
# (zstd and blosc frames state their size, so a bounded decode refuses a bomb before it inflates)
ALLOWED_IDS = ("zstd", "blosc", CTX_ID)


ZSTD_LEVELS = (1, 22)


def parse_lossless_option(text: object, where: str = "--lossless") -> dict[str, Any] | str:
    """The pack's lossless stage from its CLI spelling: "auto" (the default: per dct field the smaller of the
    entropy coder and zstd-19: bytes first), "zstd" (zstd-19 everywhere, the read-speed choice: more bytes
    than "auto", decoded several times faster per core) or "zstd:LEVEL" (1..22)."""
    if not isinstance(text, str):
        raise TypeError(f"{where}: expected a string such as 'auto' or 'zstd:9'. Got {type(text).__name__}")
    name, colon, level = text.strip().partition(":")
    if name == AUTO and not colon:
        return AUTO
    if name == "zstd":
        if not colon:
            return dict(ZSTD_MAX)
        if level.isdigit() and ZSTD_LEVELS[0] <= int(level) <= ZSTD_LEVELS[1]:
            return {"id": "zstd", "level": int(level)}
    raise DctDataError(f"{where}: expected auto, zstd or zstd:LEVEL with LEVEL in 1..22. Got {text!r}")


def parse_codec_config(config: object, where: str = "codec") -> dict[str, Any]:
    """Validate a stage config (a mapping with an allowed "id"); None or {} means no stage. `where` names
    it in errors (a manifest field's stage: "field 'x': lossless")."""
    if config is None or (isinstance(config, Mapping) and not config):
        return {}
    if not isinstance(config, Mapping) or not isinstance(config.get("id"), str):
        raise DctDataError(f"{where}: expected a numcodecs config such as {DEFAULT_CODEC}. Got {config!r}")
    if config["id"] not in ALLOWED_IDS:
        raise DctDataError(
            f"{where}: expected one of {ALLOWED_IDS}. Got {config['id']!r} (a manifest may not name other codecs: "
            "some decoders run code)"
        )
    _build(dict(config))
    return dict(config)


_BUILT: dict[str, Any] = {}  # canonical JSON of a config -> its codec
_BUILT_MAX = 64


def _build(config: dict[str, Any]):
    """The codec of a config, built once per process (a DataLoader worker forked after a manifest was
    read inherits it). Why: building a ctx-rANS codec (its frequency and search tables) takes
    milliseconds, and the webdataset loader rebuilt it in every worker every epoch, a large share of
    decoding a small epoch's samples (docs/benchmarks/design.md). Codecs keep no per-call state, so one
    instance serves every caller; a config that fails to build is never cached."""
    try:
        key = json.dumps(config, sort_keys=True)
    except (TypeError, ValueError):  # not JSON: build it, uncached
        return _construct(config)
    codec = _BUILT.get(key)
    if codec is None:
        codec = _construct(config)
        if len(_BUILT) >= _BUILT_MAX:
            _BUILT.clear()
        _BUILT[key] = codec
    return codec


def _construct(config: dict[str, Any]):
    if config["id"] == CTX_ID:
        from dctdata.entropy import CtxCodec  # the C kernel loads only where a pack uses it

        return CtxCodec.from_config(config)
    try:
        return numcodecs.get_codec(config)
    except (ValueError, TypeError, KeyError) as exc:
        raise DctDataError(f"codec: numcodecs cannot build {config!r}: {exc}") from exc


def get_codec(config: Mapping[str, Any] | None):
    """The codec instance for a config, or None for an empty config."""
    config = parse_codec_config(config)
    return _build(config) if config else None


def is_entropy(config: Mapping[str, Any] | None) -> bool:
    return bool(config) and config.get("id") == CTX_ID


def encode_array(codec, arr: np.ndarray) -> bytes:
    """An array's stored bytes: the entropy coder's stream, or a bytes codec over its raw C-order bytes
    (no codec: the raw bytes)."""
    arr = np.ascontiguousarray(arr)
    if codec is None:
        return arr.tobytes()
    if getattr(codec, "codec_id", None) == CTX_ID:
        return codec.encode(arr)
    return bytes(codec.encode(arr))


class _Refused(Exception):
    """A check of `decode_array` failed: its message, which `decode_array` prefixes with `where`."""


def decode_array(
    codec, buf, shape: tuple[int, ...], dtype, where: str | Callable[[], str], writeable: bool = True
) -> np.ndarray:
    """The array of `shape` and `dtype` stored in `buf`; anything else (a stream that decodes to another
    size, truncated or mutated bytes) is an IntegrityError naming `where`, or `where()`: a reader of many
    small chunks passes a function, so the description is built only for an error. Never allocates more
    than the expected array. `writeable=False` lets a zstd frame come back read-only, without a copy (for
    a parser that copies what it keeps)."""
    dtype = np.dtype(dtype)
    size = math.prod(int(s) for s in shape) * dtype.itemsize
    try:
        if codec is None:
            raw = memoryview(buf).cast("B")
            if len(raw) != size:
                raise _Refused(f"expected {size} bytes of {dtype} {tuple(shape)}. Got {len(raw)}")
            return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()
        if getattr(codec, "codec_id", None) == CTX_ID:
            return codec.decode(buf, tuple(shape), dtype)
        declared = declared_size(codec, buf)
        if declared != size:
            said = "a damaged or truncated header" if declared is None else f"one declaring {declared}"
            raise _Refused(f"expected a stream of {size} decoded bytes. Got {said}")
        if getattr(codec, "codec_id", None) == "zstd":
            return _zstd_frame(buf, size, writeable).view(dtype).reshape(shape)
        out = np.empty(size, np.uint8)
        codec.decode(buf, out=out)  # more than `size` bytes is an error; fewer cannot pass the check above
        return out.view(dtype).reshape(shape)
    except _Refused as exc:
        raise IntegrityError(f"{_described(where)}: {exc}") from None
    except IntegrityError as exc:
        raise IntegrityError(
            f"{_described(where)}: expected {_name(codec)} bytes of {dtype} {tuple(shape)}. Got {exc}"
        ) from exc
    except Exception as exc:  # noqa: BLE001 - any decoder failure is a data error naming the sample or chunk
        raise IntegrityError(
            f"{_described(where)}: expected {_name(codec)} bytes of {dtype} {tuple(shape)}. Got undecodable bytes "
            f"({type(exc).__name__}: {exc})"
        ) from exc


def _described(where: str | Callable[[], str]) -> str:
    return where() if callable(where) else where


_ZSTD = threading.local()


def _zstd_frame(buf, size: int, writeable: bool = True) -> np.ndarray:
    """The `size` bytes of one zstd frame that declares them (checked by the caller), as a writeable array
    (a copy of the bytes python-zstandard returns) or, `writeable=False`, a read-only view of them.

    Why not numcodecs here: its decode makes a new decompression context per call, a cost comparable to
    decoding a small chunk; zstandard (python-zstandard) reuses one per thread. The frame's
    declared size is the output buffer's (one-shot decode: it cannot write past it); anything after the
    frame (a second frame, trailing bytes) is refused: the writer makes exactly one."""
    dctx = getattr(_ZSTD, "dctx", None)
    if dctx is None:
        dctx = _ZSTD.dctx = zstandard.ZstdDecompressor()
    data = dctx.decompress(buf, max_output_size=size, allow_extra_data=False)
    if len(data) != size:
        raise IntegrityError(f"expected one zstd frame of {size} decoded bytes. Got {len(data)}")
    arr = np.frombuffer(data, np.uint8)
    return arr.copy() if writeable else arr


def decode_bounded(codec, buf, limit: int, where: str) -> memoryview:
    """The bytes of a stream declaring at most `limit` decoded bytes (a member whose contents say their
    own shape, like .npy, is checked by its parser afterwards); more is an IntegrityError, never decoded.
    They may be read-only: the parser copies what it keeps."""
    declared = declared_size(codec, buf) if codec is not None else len(memoryview(buf).cast("B"))
    if declared is None or declared > limit:
        said = "a damaged or truncated header" if declared is None else f"one declaring {declared}"
        raise IntegrityError(f"{where}: expected a stream of at most {limit} decoded bytes. Got {said}")
    if codec is None:
        return memoryview(buf).cast("B")
    return memoryview(decode_array(codec, buf, (declared,), np.uint8, where, writeable=False))


def declared_size(codec, buf) -> int | None:
    """The decoded size a zstd or blosc stream declares in its header (None when it declares none).

    Why by hand: numcodecs decodes a stream shorter than the output buffer without complaint, so the
    reader checks the header first. zstd (RFC 8878, section 3.1.1): the first frame's Frame_Content_Size;
    the writer makes one frame, and a second frame would overflow the exact-size output buffer. blosc:
    the header's nbytes (numcodecs' own parser), when its compressed size is the buffer's."""
    data = memoryview(buf).cast("B")
    name = getattr(codec, "codec_id", None)
    if name == "blosc":
        from numcodecs.blosc import _cbuffer_sizes

        if len(data) < 16:
            return None
        nbytes, cbytes, _ = _cbuffer_sizes(data)
        return int(nbytes) if cbytes == len(data) else None  # blosc reads `cbytes` whatever the buffer holds
    if name != "zstd" or len(data) < 5 or int.from_bytes(data[:4], "little") != 0xFD2FB528:
        return None
    fhd = data[4]
    fcs_flag, single, did_flag = fhd >> 6, (fhd >> 5) & 1, fhd & 3
    at = 5 + (0 if single else 1) + (0, 1, 2, 4)[did_flag]
    width = (1 if single else 0, 2, 4, 8)[fcs_flag]
    if width == 0 or len(data) < at + width:
        return None
    value = int.from_bytes(data[at : at + width], "little")
    return value + 256 if width == 2 else value


def _name(codec) -> str:
    return "raw" if codec is None else f"{getattr(codec, 'codec_id', type(codec).__name__)}-coded"
