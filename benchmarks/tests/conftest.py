"""The benchmarks' tests. `benchmarks` is a folder of the repository, not an installed package: the
repository root is appended to sys.path (after site-packages, so the installed dctdata still wins over
the source folder), which makes `import benchmarks.rd` and friends work under plain `pytest`; importing
`benchmarks` appends tests/ too, for the helpers the benchmarks share with the tests (`gpu_fakes`,
`shipped_images`, ...)."""

from __future__ import annotations

import pathlib
import sys

ROOT = str(pathlib.Path(__file__).resolve().parents[2])
if ROOT not in sys.path:
    sys.path.append(ROOT)

import benchmarks  # noqa: E402, F401 - appends tests/ (the shared helpers) to sys.path
