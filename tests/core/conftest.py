"""Fixtures of the in-process torch tests in tests/core."""

import pytest

# A group left initialized by an earlier test would make the checks that need none (or
# their own) meaningless: they fail instead of skipping, naming the cause.
LEAKED = ("a torch process group is already initialized in this process: an earlier test "
          "leaked it (destroy it at the end of the test or fixture that creates it)")


def _assert_no_process_group():
    import torch.distributed as dist

    assert not dist.is_initialized(), LEAKED


@pytest.fixture
def no_process_group():
    """For a test that needs no torch process group to exist; fails if one does."""
    _assert_no_process_group()


@pytest.fixture(scope="module")
def process_group():
    """A one-process gloo group for AdaptiveDataParallel, for the tests of one module
    (torch's own init, not the library's: that would also install signal handlers in the
    test process); fails if a group already exists."""
    import torch.distributed as dist

    _assert_no_process_group()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()
