"""The suite's own promise (tests/conftest.py): a test's random draws depend on its id alone, not on the tests
that ran before it in the same process (`pytest -n auto` shares the tests among processes in no fixed order)."""

import random
import zlib

import numpy as np
import pytest
import torch

MODULE_RNG = np.random.default_rng(7)  # reset to the test's seed too


@pytest.mark.parametrize("run", [0, 1])
def test_each_generator_starts_from_the_tests_own_seed(request, run):
    seed = zlib.crc32(request.node.nodeid.encode())
    assert random.random() == random.Random(seed).random()
    assert np.random.random() == np.random.RandomState(seed).random_sample()
    assert torch.equal(torch.rand(3), torch.rand(3, generator=torch.Generator().manual_seed(seed)))
    assert MODULE_RNG.random() == np.random.default_rng(seed).random()
    # draw more, so the other run (another id) would see a moved state without the reseeding
    np.random.random(100), MODULE_RNG.random(100), torch.rand(100)
