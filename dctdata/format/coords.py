"""Coordinates in the manifest (format version 2): the 1-D coordinates a source carried, so a pack of a
NetCDF/zarr store still says *when* (and where) each sample is.

    coords = {name: {"dim": "time", "sample": true, "dtype": "datetime64[ns]", "values": [...], "attrs": {...}}}

`sample: true` marks a coordinate along the sample axis (one value per sample, in sample order);
others run along a per-sample axis (latitude, longitude, level) and the field's `attrs["dims"]` name
those axes. Values are JSON: datetimes as ISO-8601 strings at the stored unit, timedeltas as integers
of their unit, numbers as numbers ("nan"/"inf"/"-inf" as strings), anything else as strings (dtype
"str"). `encode_coord` and `decode_coord` are the two directions; `check_coords` validates a
manifest's entry.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from dctdata.errors import DctDataError
from dctdata.format.fields import check_attrs
from dctdata.parse import is_number, parse_object

_TIME_RE = re.compile(r"^(datetime64|timedelta64)\[(Y|M|W|D|h|m|s|ms|us|ns)\]$")
_NUMERIC = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
_FLOATS = ("float16", "float32", "float64")
_NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def _dtype_ok(dtype: object) -> bool:
    return isinstance(dtype, str) and (
        dtype in _NUMERIC or dtype in _FLOATS or dtype == "str" or bool(_TIME_RE.match(dtype))
    )


def _value_ok(dtype: str, v: object) -> bool:
    if dtype == "str" or dtype.startswith("datetime64"):
        return isinstance(v, str)
    if dtype == "bool":
        return isinstance(v, bool)
    if dtype in _FLOATS:
        return is_number(v) or (isinstance(v, str) and v in _NONFINITE)
    return is_number(v) and float(v).is_integer()


def encode_coord(values: Any, dim: str, sample: bool, attrs: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A manifest coordinate entry from a 1-D array (numpy, or anything np.asarray takes)."""
    a = np.asarray(values)
    if a.ndim != 1:
        raise DctDataError(f"coordinate {dim!r}: expected a 1-D array. Got shape {a.shape}")
    out: list[Any]
    if a.dtype.kind == "M":
        unit = np.datetime_data(a.dtype)[0]
        dtype, out = f"datetime64[{unit}]", [str(v) for v in np.datetime_as_string(a)]  # in the array's own unit
    elif a.dtype.kind == "m":
        unit = np.datetime_data(a.dtype)[0]
        dtype, out = f"timedelta64[{unit}]", a.astype(np.int64).tolist()
    elif a.dtype.kind == "f":
        dtype = a.dtype.name
        out = [float(v) if math.isfinite(v) else ("nan" if v != v else "inf" if v > 0 else "-inf") for v in a.tolist()]
    elif a.dtype.kind in "biu":
        dtype, out = a.dtype.name, a.tolist()
    else:  # strings, cftime dates of other calendars, ...: their text
        dtype, out = "str", [str(v) for v in a.tolist()]
    return {"dim": dim, "sample": bool(sample), "dtype": dtype, "values": out, "attrs": check_attrs(attrs or {}, dim)}


def decode_coord(entry: Mapping[str, Any]) -> npt.NDArray[Any]:
    """The numpy array of a (validated) coordinate entry."""
    dtype, values = entry["dtype"], entry["values"]
    if dtype == "str":
        return np.asarray(values, dtype=str)
    if dtype.startswith("datetime64"):
        return np.asarray(values, dtype=dtype)
    if dtype.startswith("timedelta64"):
        return np.asarray(values, dtype=np.int64).astype(dtype)
    return np.asarray([_NONFINITE.get(v, v) if isinstance(v, str) else v for v in values], dtype=dtype)


def check_coords(coords: object, samples: int, where: str = "coords") -> dict[str, dict[str, Any]]:
    """Validate a manifest's coords (see the module docstring); returns a plain copy."""
    if not isinstance(coords, Mapping):
        raise DctDataError(f"{where}: expected a JSON object {{name: coordinate}}. Got {type(coords).__name__}")
    out = {}
    for name, entry in coords.items():
        w = f"{where}[{name!r}]"
        if not isinstance(name, str) or not name:
            raise DctDataError(f"{where}: expected non-empty string names. Got {name!r}")
        e = parse_object(entry, w, {"dim", "sample", "dtype", "values", "attrs"})
        if not isinstance(e["dim"], str) or not e["dim"]:
            raise DctDataError(f"{w}: dim: expected a dimension name. Got {e['dim']!r}")
        if not isinstance(e["sample"], bool):
            raise DctDataError(f"{w}: sample: expected true or false. Got {e['sample']!r}")
        if not _dtype_ok(e["dtype"]):
            raise DctDataError(
                f"{w}: dtype: expected a numeric, datetime64[unit], timedelta64[unit] or 'str'. Got {e['dtype']!r}"
            )
        values = e["values"]
        if not isinstance(values, list):
            raise DctDataError(f"{w}: values: expected a list. Got {type(values).__name__}")
        if e["sample"] and len(values) != samples:
            raise DctDataError(f"{w}: values: expected one per sample ({samples}). Got {len(values)}")
        for i, v in enumerate(values):
            if not _value_ok(e["dtype"], v):
                raise DctDataError(f"{w}: values[{i}]: expected a {e['dtype']} value. Got {v!r}")
        try:
            decode_coord(e)
        except (ValueError, TypeError, OverflowError) as exc:
            raise DctDataError(f"{w}: values: expected {e['dtype']} values. Got {type(exc).__name__}: {exc}") from exc
        out[name] = {
            "dim": e["dim"],
            "sample": e["sample"],
            "dtype": e["dtype"],
            "values": list(values),
            "attrs": check_attrs(e["attrs"], f"{w}: attrs"),
        }
    return out
