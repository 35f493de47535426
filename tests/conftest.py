"""Shared fixtures. pytest puts this folder on sys.path (no tests/__init__.py, so the installed
dctdata is the one imported), which also makes the helper modules beside it importable:
`sample_fields` (test data, pack comparison), `decode_checks` (the decode invariant), `servers`
(a loopback HTTP server), `ctx_streams` (entropy-coded streams, LEB128 fields, fuzz mutations),
`torchrun_checks` (a script body run on two ranks), `shipped_images` (arrays and photos shipped inside
installed packages), `sci_fields` (the SciML stand-ins as stacks), `loopback` (the HTTP server itself).
The benchmarks import some of these too; the tests import nothing from benchmarks/ (test_import_graph)."""

from __future__ import annotations

import random
import zlib

import numpy as np
import pytest
import torch
from sample_fields import labelled_npz


@pytest.fixture(scope="module")
def labelled_source(tmp_path_factory) -> str:
    """An .npz of N small noisy fields (`image`) and their index (`label`), made once per test module."""
    return labelled_npz(tmp_path_factory.mktemp("src"))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Each test draws from random states of its own, seeded from its id before its fixtures are set up:
    Python's, NumPy's and torch's global generators, and the NumPy Generators its module keeps at module
    level. Without this, what a test drew depended on which tests had run before it in the same process,
    and `pytest -n auto` shares the tests among its processes in no fixed order."""
    seed = zlib.crc32(item.nodeid.encode())
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    module = getattr(item, "module", None)  # None for items that are not Python functions
    for value in vars(module).values() if module is not None else ():
        if isinstance(value, np.random.Generator):
            value.bit_generator.state = np.random.default_rng(seed).bit_generator.state


def pytest_collection_modifyitems(config, items):
    """Tests marked `cuda` skip, with the reason, where no CUDA device is present."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
