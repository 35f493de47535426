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

Choice of the defaults (measured on quantized coefficients of package-shipped images and SciML fields,
README "Lossless stage"): the entropy coder stores about 24% less than zstd-19, encodes faster than
zstd-9 and decodes at 300-1400 MB/s of float32-equivalent output per core; zstd-19 stores 8.5% less than
zstd-9 at the same decode speed but encodes about 18x slower. So: integer dct fields get the smaller of
the fitted entropy coder and zstd-19 ("auto"; zstd-19 wins on periodic textures its long matches catch),
everything else zstd-9 (packing speed; masks and labels are a small share of a pack).
"""

from __future__ import annotations

from typing import Any, Mapping

import numcodecs
import numpy as np

from dctdata.errors import DctDataError, IntegrityError

# The default stage of array and label fields and of float coefficients.
DEFAULT_CODEC: dict[str, Any] = {"id": "zstd", "level": 9}
ZSTD_MAX: dict[str, Any] = {"id": "zstd", "level": 19}
AUTO = "auto"  # pack setting: per dct field, the smaller of the entropy coder and zstd-19
CTX_ID = "dctdata_ctxrans"
# Bytes codecs a manifest may name: compressors whose decoders only produce bytes.
# (zstd and blosc frames state their size, so a bounded decode refuses a bomb before it inflates)
ALLOWED_IDS = ("zstd", "blosc", CTX_ID)


def parse_codec_config(config: object) -> dict[str, Any]:
    """Validate a stage config (a mapping with an allowed "id"); None or {} means no stage."""
    if config is None or (isinstance(config, Mapping) and not config):
        return {}
    if not isinstance(config, Mapping) or not isinstance(config.get("id"), str):
        raise DctDataError(f"codec: expected a numcodecs config such as {DEFAULT_CODEC}. Got {config!r}")
    if config["id"] not in ALLOWED_IDS:
        raise DctDataError(
            f"codec: expected one of {ALLOWED_IDS}. Got {config['id']!r} (a manifest may not name other codecs: "
            "some decoders run code)"
        )
    _build(dict(config))
    return dict(config)


def _build(config: dict[str, Any]):
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


def decode_array(codec, buf, shape: tuple[int, ...], dtype, where: str) -> np.ndarray:
    """The array of `shape` and `dtype` stored in `buf`; anything else (a stream that decodes to another
    size, truncated or mutated bytes) is an IntegrityError naming `where`. Never allocates more than the
    expected array."""
    dtype = np.dtype(dtype)
    size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    try:
        if codec is None:
            raw = memoryview(buf).cast("B")
            if len(raw) != size:
                raise IntegrityError(f"{where}: expected {size} bytes of {dtype} {tuple(shape)}. Got {len(raw)}")
            return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()
        if getattr(codec, "codec_id", None) == CTX_ID:
            return codec.decode(buf, tuple(shape), dtype)
        out = np.empty(size, np.uint8)
        got = codec.decode(buf, out=out)
        n = np.asarray(got).nbytes if got is not None else size
        if n != size:
            raise IntegrityError(f"{where}: expected {size} decoded bytes. Got {n}")
        return out.view(dtype).reshape(shape)
    except IntegrityError as exc:
        if str(exc).startswith(where):
            raise
        raise IntegrityError(f"{where}: expected {_name(codec)} bytes of {dtype} {tuple(shape)}. Got {exc}") from exc
    except Exception as exc:  # noqa: BLE001 - any decoder failure is a data error naming the sample or chunk
        raise IntegrityError(
            f"{where}: expected {_name(codec)} bytes of {dtype} {tuple(shape)}. Got undecodable bytes "
            f"({type(exc).__name__}: {exc})"
        ) from exc


def _name(codec) -> str:
    return "raw" if codec is None else f"{getattr(codec, 'codec_id', type(codec).__name__)}-coded"


_BLOSC_SHUFFLE = {-1: None, 0: "noshuffle", 1: "shuffle", 2: "bitshuffle"}


def _zarr_native(config: dict[str, Any]):
    """The zarr v3 spec codec equal to a numcodecs config (same bytes on disk), or None."""
    import zarr.codecs as zc

    name, opts = config["id"], {k: v for k, v in config.items() if k != "id"}
    if name == "zstd" and set(opts) <= {"level", "checksum"}:
        return zc.ZstdCodec(level=int(opts.get("level", 0)), checksum=bool(opts.get("checksum", False)))
    if name == "gzip" and set(opts) <= {"level"}:
        return zc.GzipCodec(level=int(opts.get("level", 1)))
    if name == "blosc" and set(opts) <= {"cname", "clevel", "shuffle", "blocksize", "typesize"}:
        shuffle = _BLOSC_SHUFFLE.get(int(opts.get("shuffle", 1)))
        if shuffle is None:  # AUTOSHUFFLE has no spec equivalent
            return None
        kw = {
            "cname": opts.get("cname", "lz4"),
            "clevel": int(opts.get("clevel", 5)),
            "shuffle": shuffle,
            "blocksize": int(opts.get("blocksize", 0)),
        }
        if "typesize" in opts:
            kw["typesize"] = int(opts["typesize"])
        return zc.BloscCodec(**kw)
    return None


def zarr_compressors(config: Mapping[str, Any] | None) -> tuple:
    """The same codec as zarr v3 `compressors=`: a zarr spec codec (zstd, gzip, blosc) where one
    matches, so other zarr readers need no numcodecs extension; else zarr's numcodecs wrapper."""
    config = parse_codec_config(config)
    if not config:
        return ()
    native = _zarr_native(config)
    if native is not None:
        return (native,)
    import zarr.codecs.numcodecs as zn

    name = config["id"]
    cls = {c.lower(): getattr(zn, c) for c in dir(zn) if not c.startswith("_")}.get(name.replace("_", ""))
    if cls is None:
        raise DctDataError(f"codec: no zarr v3 wrapper for numcodecs id {name!r}")
    return (cls(**{k: v for k, v in config.items() if k != "id"}),)
