"""Fixtures of the in-process torch tests in tests/core."""

import pytest


@pytest.fixture(scope="module")
def process_group():
    """A one-process gloo group for AdaptiveDataParallel, for the tests of one module
    (torch's own init, not the library's: that would also install signal handlers in the
    test process)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()
