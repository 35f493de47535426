"""The lossless stage: a numcodecs codec described by a JSON config (numcodecs style), shared by the
zarr writer (as a zarr v3 compressor) and the webdataset writer (on raw .npy bytes).

One config format in the manifest, so any reader rebuilds exactly the codec the writer used.

Measured on quantized coefficients of the bench sets (3 synthetic field kinds + 7 photos, target
40 and 50 dB; `dctdata bench rd` + the notes in the README): size after the stage relative to the
raw coefficients, geometric mean: zstd-1 0.323, zstd-3 0.324, zstd-5 0.320, zstd-7 0.314, zstd-9
0.310, zstd-12 0.304 (encode 105 MB/s); Blosc(zstd, 5) noshuffle 0.320, byte-shuffle 0.322,
bit-shuffle 0.338. Reordering to frequency-planar (K, Hb, Wb) before the codec saved only 1.5%, so
no reorder filter is stored: the stored layout stays (C, Hb, K, Wb). Decode speed is the same for
every zstd level (~3.7 GB/s of float32 output per core, 10x ZFP's), so the default is zstd-9: the
smallest level whose encode (~190 MB/s of float32 input per core) does not slow packing much.
"""

from __future__ import annotations

from typing import Any, Mapping

import numcodecs

from dctdata.errors import DctDataError

# Measured default; see `dctdata bench rd` for the comparison that chose it.
DEFAULT_CODEC: dict[str, Any] = {"id": "zstd", "level": 9}


def parse_codec_config(config: object) -> dict[str, Any]:
    """Validate a numcodecs config (a mapping with an "id" numcodecs knows); None or {} means no stage."""
    if config is None or (isinstance(config, Mapping) and not config):
        return {}
    if not isinstance(config, Mapping) or not isinstance(config.get("id"), str):
        raise DctDataError(f"codec: expected a numcodecs config such as {DEFAULT_CODEC}. Got {config!r}")
    try:
        numcodecs.get_codec(dict(config))
    except (ValueError, TypeError, KeyError) as exc:
        raise DctDataError(f"codec: numcodecs cannot build {dict(config)!r}: {exc}") from exc
    return dict(config)


def get_codec(config: Mapping[str, Any] | None):
    """numcodecs codec instance for a config, or None for an empty config."""
    config = parse_codec_config(config)
    return numcodecs.get_codec(config) if config else None


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
