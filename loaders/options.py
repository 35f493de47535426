"""`ReadOptions`: how a pack is read, in one frozen object checked once.

`open_dataset(path, options=ReadOptions(...))`, `DCTZarrDataset(..., options=...)` and
`DCTWebDataset(..., options=...)` take it; their keywords of the same names (`decode=`, `on_error=`,
`cache_dir=`, `cache_limit=`, `read_threads=`) build one, so code written with keywords keeps working.
The options say how the bytes are read and decoded, not which samples come out (`fields`, `shuffle`,
`seed`, ... stay keywords of the dataset classes). Environment variables that change reading are on the
environment page (docs/environment.md).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dctdata.decoder.wire import parse_decode
from dctdata.errors import DctDataError
from dctdata.format.cache import DEFAULT_CACHE_LIMIT
from dctdata.parse import is_int, parse_size

__all__ = ["ON_ERROR_CHOICES", "READ_OPTIONS", "ReadOptions"]

ON_ERROR_CHOICES = ("raise", "skip")


@dataclass(frozen=True)
class ReadOptions:
    """How a pack is read: where the lossless stage is decoded, what a bad chunk or shard does, the local
    shard cache and the threads that decode a batch. Checked when built: a wrong type raises TypeError, a
    bad value DctDataError, both naming the option.

    Args:
        decode: "cpu" (the default: the loader's workers decode the lossless stage and coefficients cross to
            the model) or "device" (the workers check the stored bytes, those cross, and `ds.decompressor()`
            decodes them where it runs; `dctdata.decoder.wire`).
        on_error: "raise" (the default: a bad chunk or shard raises `IntegrityError` naming it) or "skip" (bad
            samples or shards are logged, counted and dropped).
        cache_dir: webdataset packs only: keep fetched shards in this local directory (sha256-checked on
            reuse). None (the default): no cache.
        cache_limit: webdataset packs only: the cache's size cap, in bytes or with a unit ("50GiB", "1.5 GB");
            held as bytes. Default 50 GiB.
        read_threads: zarr packs only: the most threads that decode one batch's chunks (1: none). None (the
            default): `DCTDATA_READ_THREADS` when set, else torch's intra-op threads (one in a `make_loader`
            worker); the reader uses fewer when a batch's work would not pay for them.

    Raises:
        TypeError: An option has the wrong type.
        DctDataError: An option has a value outside its choices or range.
    """

    decode: str = "cpu"
    on_error: str = "raise"
    cache_dir: str | os.PathLike | None = None
    cache_limit: int | str = DEFAULT_CACHE_LIMIT
    read_threads: int | None = None

    def __post_init__(self) -> None:
        parse_decode(self.decode)
        if not isinstance(self.on_error, str):
            raise TypeError(f"on_error: expected 'raise' or 'skip'. Got {type(self.on_error).__name__}")
        if self.on_error not in ON_ERROR_CHOICES:
            raise DctDataError(f"on_error: expected 'raise' or 'skip'. Got {self.on_error!r}")
        if self.cache_dir is not None and not isinstance(self.cache_dir, (str, os.PathLike)):
            raise TypeError(f"cache_dir: expected a local directory path or None. Got {type(self.cache_dir).__name__}")
        limit = parse_size(self.cache_limit, "cache_limit", minimum=1)
        object.__setattr__(self, "cache_limit", limit)  # held as bytes: the value the cache checks against
        threads = self.read_threads
        if threads is not None and not is_int(threads):
            raise TypeError(f"read_threads: expected an int >= 1 or None. Got {type(threads).__name__}")
        if threads is not None and threads < 1:
            raise DctDataError(f"read_threads: expected an int >= 1 (1: no threads) or None. Got {threads!r}")

    @classmethod
    def resolve(cls, options: ReadOptions | None, given: Mapping[str, Any], where: str) -> ReadOptions:
        """The options of a call that takes them as keywords (`given`: name -> value, defaults included or
        not) or as `options=`; both at once (a keyword other than its default beside `options=`) is refused.

        Args:
            options: The `options=` argument, or None.
            given: The keywords of the call that name options.
            where: The call, for messages ("open_dataset", "DCTZarrDataset").

        Returns:
            `options`, or the options the keywords build.

        Raises:
            TypeError: `options` is not a ReadOptions, or an option has the wrong type.
            DctDataError: Options given both ways, or an option's value is invalid.
        """
        if options is None:
            return cls(**given)
        if not isinstance(options, cls):
            raise TypeError(f"{where}: options: expected a dctdata.ReadOptions. Got {type(options).__name__}")
        changed = [k for k, v in given.items() if not _is_default(k, v)]
        if changed:
            raise DctDataError(
                f"{where}: expected the read options as keywords or as options=ReadOptions(...). Got both "
                f"(options= and {changed[0]}=)"
            )
        return options

    def changed(self) -> dict[str, Any]:
        """The options that differ from their defaults, as keywords."""
        return {k: v for k, v in dataclasses.asdict(self).items() if not _is_default(k, v)}


# the option names, in declaration order: the keywords `resolve` gathers
READ_OPTIONS = tuple(f.name for f in dataclasses.fields(ReadOptions))
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(ReadOptions)}


def _is_default(name: str, value: object) -> bool:
    default = _DEFAULTS[name]
    if name == "cache_limit" and (is_int(value) or isinstance(value, str)):
        try:
            return parse_size(value, "cache_limit") == default
        except (TypeError, DctDataError):
            return False
    return value is default or (type(value) is type(default) and value == default)
