"""Docstrings say why, not measured numbers, and name no file that is not there.

A measurement in a docstring goes stale with the machine and the code; it belongs in
docs/benchmarks/design.md (with its commit and machine) or a benchmark, and the docstring points there.
The check is narrow on purpose: it flags claims of speed or measured effect (rates, times, "x faster",
"dB worse", "measured: ..."), not units that describe a parameter ("a cap in bytes or with a unit:
64MiB") or ratios that follow from arithmetic ("16 of 64 frequencies kept, a 4x smaller tensor").
"""

from __future__ import annotations

import ast
import functools
import io
import pathlib
import re
import tokenize

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGES = ("dctdata", "preprocess", "loaders")

NUMBER = r"\d+(?:[.,]\d+)?(?:\s*[-–]\s*\d+(?:\.\d+)?)?\s*"
MEASUREMENT_RE = re.compile(
    "|".join(
        (
            NUMBER + r"(?:[kKMGT]i?B|[kMG]?bit|samples|values|symbols)/s\b",  # a rate
            NUMBER + r"(?:ms|µs|us|ns)\b",  # a time
            NUMBER + r"(?:x|×|%)\s+(?:faster|slower|quicker)\b",  # a speed ratio
            NUMBER + r"dB\s+(?:worse|better)\b",  # a measured quality effect
            r"\bmeasured(?::|\s+on\s+(?!every\b))",  # "measured: ...", "(measured on <data>: ...)"
        )
    ),
    re.I,
)
PATH_RE = re.compile(r"(?<![\w./:-])((?:[\w.-]+/)+[\w.-]+\.(?:py|md))\b")


def sources() -> list[pathlib.Path]:
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


@functools.cache
def docstrings(source: str) -> tuple[tuple[int, str], ...]:
    """(line, text) of the module's, classes' and functions' docstrings (each source parsed once for the
    module's tests: parsing every file again in each test was most of their time)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                found.append((node.body[0].lineno, doc))
    return tuple(found)


def comments(source: str) -> list[tuple[int, str]]:
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return [(t.start[0], t.string) for t in tokens if t.type == tokenize.COMMENT]


def measurements(text: str) -> list[str]:
    return [m.group(0) for m in MEASUREMENT_RE.finditer(text)]


def dead_paths(text: str) -> list[str]:
    """Repository paths in `text` (relative to the root or to docs/) that do not exist. A path whose first
    folder is neither here nor in docs/ names another project's file (zarr-python's `core/common.py`)."""
    dead = []
    for p in PATH_RE.findall(text):
        bases = [base for base in (ROOT, ROOT / "docs") if (base / p.split("/")[0]).is_dir()]
        if bases and not any((base / p).exists() for base in bases):
            dead.append(p)
    return dead


def test_the_scan_reads_the_packages():
    files = sources()
    assert len(files) > 50
    assert sum(len(docstrings(f.read_text(encoding="utf-8"))) for f in files) > 500


@pytest.mark.parametrize(
    "text",
    [
        "decodes at 750-2,000 MB/s per core",
        "building it takes about 20 ms",
        "grid_sample in 3-D ran 20-50x slower on the CPU",
        "a 1.3x faster batch",
        "0.9 made the item 0.16 dB worse",
        "rebuilt every epoch (measured: a fifth of decoding a sample)",
        "the item barely moved (measured on 8-channel MRI tiles)",
    ],
)
def test_a_measurement_is_caught(text):
    assert measurements(text)


@pytest.mark.parametrize(
    "text",
    [
        "max_shard_size: a cap in bytes or with a unit: 64MiB, '1.5 GB' (default 256 MiB)",
        "16 of 64 frequencies kept, a 4x smaller tensor on the device",
        "each item's error is measured against its own range",
        "its recorded largest error (measured on every sample at pack time)",
        "timeout: seconds to wait; the fastest decode, the most bytes",
    ],
)
def test_a_description_is_not_a_measurement(text):
    assert measurements(text) == []


def test_no_docstring_carries_a_measurement():
    found = [
        f"{path.relative_to(ROOT)}:{line}: {hit!r}"
        for path in sources()
        for line, doc in docstrings(path.read_text(encoding="utf-8"))
        for hit in measurements(doc)
    ]
    assert found == [], "move the numbers to docs/benchmarks/design.md and point there"


def test_no_docstring_or_comment_names_a_missing_file():
    assert dead_paths("see examples/entropy_decode_speed.py and docs/gpu-entropy-decoder.md") == [
        "examples/entropy_decode_speed.py",
        "docs/gpu-entropy-decoder.md",
    ]
    assert dead_paths("docs/benchmarks/design.md, benchmarks/design.md, dctdata/api.py, core/common.py") == []
    found = []
    for path in sources():
        source = path.read_text(encoding="utf-8")
        for line, text in [*docstrings(source), *comments(source)]:
            found += [f"{path.relative_to(ROOT)}:{line}: {p}" for p in dead_paths(text)]
    assert found == []
