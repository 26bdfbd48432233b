import os

import pytest
import torch

import gproj_cuda

# Outputs of the ops start as NaN: an element a kernel forgets to write cannot pass a test.
os.environ.setdefault("GPROJ_DEBUG_POISON", "1")
torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))


def pytest_collection_modifyitems(config, items):
    reason = gproj_cuda.unavailable_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"GPU test: {reason}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def rng():
    """A fresh generator per test, seeded from the test's name so failures reproduce."""
    g = torch.Generator()
    g.manual_seed(abs(hash(os.environ.get("PYTEST_CURRENT_TEST", ""))) % (2**31))
    return g
