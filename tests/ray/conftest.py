"""One local Ray instance for the whole Ray test session (starting Ray costs seconds).

Logical CPUs are faked (8 on a 2-core machine): the tests check scheduling decisions and
data semantics, not speed, and keep every model tiny.
"""

from __future__ import annotations

import os

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NUM_CPUS = 8


@pytest.fixture(scope="session")
def ray_session():
    """Start Ray once; worker processes can import ``tests.ray.trial_jobs``."""
    ray = pytest.importorskip("ray")
    if not ray.is_initialized():
        pythonpath = os.pathsep.join(p for p in (REPO_ROOT, os.environ.get("PYTHONPATH"))
                                     if p)
        ray.init(address="local", num_cpus=NUM_CPUS, include_dashboard=False,
                 log_to_driver=False,
                 object_store_memory=200 * 2**20,
                 runtime_env={"env_vars": {"PYTHONPATH": pythonpath}})
    yield ray
    ray.shutdown()
