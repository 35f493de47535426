"""The lossless stage: a numcodecs codec described by a JSON config (numcodecs style), shared by the
zarr writer (as a zarr v3 compressor) and the webdataset writer (on raw .npy bytes).

One config format in the manifest, so any reader rebuilds exactly the codec the writer used.
"""

from __future__ import annotations

from typing import Any, Mapping

import numcodecs

from dctdata.errors import DctDataError

# Measured default; see `dctdata bench rd` for the comparison that chose it.
DEFAULT_CODEC: dict[str, Any] = {"id": "zstd", "level": 3}


def parse_codec_config(config: object) -> dict[str, Any]:
    """Validate a numcodecs config (a mapping with an "id" numcodecs knows); None means no stage."""
    if config is None:
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


def zarr_compressors(config: Mapping[str, Any] | None) -> tuple:
    """The same codec as zarr v3 `compressors=` (numcodecs-backed codecs registered by zarr)."""
    config = parse_codec_config(config)
    if not config:
        return ()
    import zarr.codecs.numcodecs as zn

    name = config["id"]
    cls = {c.lower(): getattr(zn, c) for c in dir(zn) if not c.startswith("_")}.get(name.replace("_", ""))
    if cls is None:
        raise DctDataError(f"codec: no zarr v3 wrapper for numcodecs id {name!r}")
    return (cls(**{k: v for k, v in config.items() if k != "id"}),)
