"""Shared fixtures. pytest puts this folder on sys.path (no tests/__init__.py, so the installed
dctdata is the one imported), which also makes the helper modules beside it importable:
`sample_fields` (test data, pack comparison), `decode_checks` (the decode invariant), `servers`
(a loopback HTTP server), `ctx_streams` (entropy-coded streams, LEB128 fields, fuzz mutations),
`torchrun_checks` (a script body run on two ranks).

The repository root is appended to sys.path (after site-packages, so the installed dctdata still wins
over the source folder) for `benchmarks`: the loopback server and the package-shipped test images live
there, outside the wheel, shared by the tests and the benchmarks."""

from __future__ import annotations

import pathlib
import sys

import pytest
import torch

ROOT = str(pathlib.Path(__file__).resolve().parents[1])
if ROOT not in sys.path:
    sys.path.append(ROOT)

from sample_fields import labelled_npz  # noqa: E402


@pytest.fixture(scope="module")
def labelled_source(tmp_path_factory) -> str:
    """An .npz of N small noisy fields (`image`) and their index (`label`), made once per test module."""
    return labelled_npz(tmp_path_factory.mktemp("src"))


def pytest_collection_modifyitems(config, items):
    """Tests marked `cuda` skip, with the reason, where no CUDA device is present."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
