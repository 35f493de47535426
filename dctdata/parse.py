"""Validated scalars: the one place for "an int, not a bool, within bounds" and its friends.

zarr-python's `core/common.py` is the model: small `parse_*` functions that return the clean value or
raise with the project's message form `<name>: expected <what>. Got <value>`. A value of the wrong
Python type raises `TypeError` by default; values read from stored data pass `type_error=` (a
manifest field of the wrong type is a format problem, not a programming error).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Any, TypeGuard

import numpy as np

from dctdata.errors import DctDataError


def is_int(value: object) -> TypeGuard[int | np.integer[Any]]:
    """An integer that is not a bool (numpy integers count)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def is_number(value: object) -> TypeGuard[int | float | np.integer[Any] | np.floating[Any]]:
    """An int or float that is not a bool (numpy scalars count)."""
    return is_int(value) or isinstance(value, (float, np.floating))


def _bounds(minimum: float | None, maximum: float | None) -> str:
    if minimum is not None and maximum is not None:
        return f" in {minimum}..{maximum}"
    if minimum is not None:
        return f" >= {minimum}"
    return f" <= {maximum}" if maximum is not None else ""


def _messages(messages: dict[str, Any], what: str) -> tuple[str, type[Exception], type[Exception]]:
    """(wording, exception for a wrong type, exception for a wrong value) from a parser's keywords:
    `expected=` rewords the message, `type_error=`/`range_error=` choose the exceptions."""
    unknown = set(messages) - {"expected", "type_error", "range_error"}
    if unknown:
        raise TypeError(f"unexpected keywords {sorted(unknown)}")
    return (
        messages.get("expected") or what,
        messages.get("type_error", TypeError),
        messages.get("range_error", DctDataError),
    )


# The largest seed and epoch: a loader seeds torch's generator with seed + epoch, an int64.
SEED_MAX = 2**62


def parse_int(
    value: object, name: str, *, minimum: int | None = None, maximum: int | None = None, **messages: Any
) -> int:
    """An int (never a bool) in [minimum, maximum]."""
    what, type_error, range_error = _messages(messages, f"an int{_bounds(minimum, maximum)}")
    if not is_int(value):
        raise type_error(f"{name}: expected {what}. Got {value!r}")
    v = int(value)
    if (minimum is not None and v < minimum) or (maximum is not None and v > maximum):
        raise range_error(f"{name}: expected {what}. Got {v!r}")
    return v


def parse_optional_int(value: object, name: str, **kwargs: Any) -> int | None:
    return None if value is None else parse_int(value, name, **kwargs)


def parse_number(value: object, name: str, *, above: float | None = None, below: float | None = None,
                 minimum: float | None = None, **messages: Any) -> float:  # fmt: skip
    """A finite real number (never a bool), optionally > above, < below, >= minimum."""
    limits = [
        f"> {above}" * (above is not None),
        f"< {below}" * (below is not None),
        f">= {minimum}" * (minimum is not None),
    ]
    limits = [p for p in limits if p]
    what, type_error, range_error = _messages(
        messages, "a finite number" + (" " + " and ".join(limits) if limits else "")
    )
    if not is_number(value):
        raise type_error(f"{name}: expected {what}. Got {value!r}")
    v = float(value)
    low_ok = (above is None or v > above) and (minimum is None or v >= minimum)
    if not math.isfinite(v) or not low_ok or (below is not None and not v < below):
        raise range_error(f"{name}: expected {what}. Got {value!r}")
    return v


_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgtp]?)(i?)b?\s*$", re.IGNORECASE)


def parse_size(value: object, name: str, *, minimum: int | None = None, **messages: Any) -> int:
    """A byte count: an int, or a string with an optional unit, as `--help` shows sizes: "4096",
    "256 MiB", "1MiB", "1.5 GB", "64k" (K/M/G/T/P; "i" or a bare letter is binary, "KB"/"MB"/... decimal).
    Written by hand because the rule is one regular expression; no dependency parses both spellings."""
    what, type_error, range_error = _messages(
        messages, "a size in bytes such as 4096, '256 MiB' or '1.5 GB'" + _bounds(minimum, None)
    )
    if is_int(value):
        v = int(value)
    elif isinstance(value, str) and (match := _SIZE_RE.match(value)):
        number, unit, binary = match.groups()
        explicit_decimal = bool(unit) and not binary and value.strip()[-1:].lower() == "b"
        base = 1000 if explicit_decimal else 1024
        v = int(float(number) * base ** ("kmgtp".index(unit.lower()) + 1) + 0.5) if unit else int(float(number))
    elif isinstance(value, str):
        raise range_error(f"{name}: expected {what}. Got {value!r}")
    else:
        raise type_error(f"{name}: expected {what}. Got {value!r}")
    if (minimum is not None and v < minimum) or v < 0:
        raise range_error(f"{name}: expected {what}. Got {value!r}")
    return v


def parse_choice(value: object, name: str, choices: Iterable[str], *, error: type[Exception] = DctDataError) -> str:
    """One of `choices` (strings)."""
    choices = tuple(choices)
    if not isinstance(value, str) or value not in choices:
        raise error(f"{name}: expected one of {choices}. Got {value!r}")
    return value


def parse_object(
    value: object,
    name: str,
    required: Iterable[str],
    optional: Iterable[str] = (),
    *,
    error: type[Exception] = DctDataError,
) -> dict[str, Any]:
    """A mapping with exactly the `required` keys and any of `optional` (JSON objects read from files)."""
    required, optional = set(required), set(optional)
    if not isinstance(value, Mapping):
        raise error(f"{name}: expected a JSON object. Got {value!r}")
    unknown, missing = sorted(set(value) - required - optional), sorted(required - set(value))
    if unknown:
        raise error(f"{name}: expected keys {sorted(required | optional)}. Got unknown keys {unknown}")
    if missing:
        raise error(f"{name}: expected keys {sorted(required | optional)}. Got missing keys {missing}")
    return dict(value)
