"""Shared fixtures and markers for the whole test suite.

Kept deliberately light: it imports only :mod:`adaptdl_core.context` (which needs
nothing beyond the standard library) and never torch or ray. Every piece of process-wide
state of the library (States, the restore point, the collective group, the stop flag, the
runtime's bookkeeping) lives in the job context, which one call resets.
"""

from __future__ import annotations

import os

import pytest

from adaptdl_core import context


def pytest_configure(config):
    """Register the markers of this suite (``pytest -m "not slow"`` skips the slow tests)."""
    config.addinivalue_line(
        "markers", "slow: takes about 20 s or more on a 2-core machine (processes, whole "
        "trainings or simulations); the quick command leaves it out, CI runs it")


def _adaptdl_vars() -> list[str]:
    return [name for name in os.environ if name.startswith("ADAPTDL_")]


@pytest.fixture(autouse=True)
def adaptdl_clean_process(monkeypatch):
    """Every test starts and ends with no ``ADAPTDL_*`` variables and a fresh registry.

    The variables that were set before the test are restored by ``monkeypatch``; the ones
    a test (or the library, e.g. ``init_process_group``) set are removed.
    """
    for name in _adaptdl_vars():
        monkeypatch.delenv(name)
    context.reset()
    yield
    for name in _adaptdl_vars():
        # Directly, not through monkeypatch (whose undo would put the value back); the
        # values that existed before the test are restored by monkeypatch's undo.
        os.environ.pop(name, None)
    context.reset()


@pytest.fixture
def ckpt_dir(tmp_path, monkeypatch):
    """A fresh checkpoint directory, exported as ``ADAPTDL_CHECKPOINT_PATH``."""
    path = tmp_path / "ckpt"
    path.mkdir()
    monkeypatch.setenv("ADAPTDL_CHECKPOINT_PATH", str(path))
    return path


@pytest.fixture
def restart():
    """Simulate a restart of the job inside this process: forget the job context (every
    State, the restore point, the stop flag), so that States created next reload from
    the newest checkpoint."""
    return context.reset


@pytest.fixture
def subprocess_env():
    """Environment for child Python processes: this one's, without ``ADAPTDL_*`` and with
    a single OpenMP/MKL thread (the test machines have few cores)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ADAPTDL_")}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return env
