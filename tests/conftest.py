"""Shared fixtures for the whole test suite.

Kept deliberately light: it imports only :mod:`adaptdl_core.checkpoint` (which needs
nothing beyond the standard library) and never torch or ray. Modules that hold
process-wide state (the collective group, the graceful-stop flag) are reset only if a
test already imported them.
"""

from __future__ import annotations

import os
import socket
import sys

import pytest

from adaptdl_core import checkpoint


def _adaptdl_vars() -> list[str]:
    return [name for name in os.environ if name.startswith("ADAPTDL_")]


def _reset_process_state() -> None:
    """Forget States, the restore point and the per-job bookkeeping of the torch API."""
    checkpoint._unregister_all()
    collective = sys.modules.get("adaptdl_core.collective")
    if collective is not None and collective.is_initialized():
        collective.teardown()
    interrupt = sys.modules.get("adaptdl_core.torch._interrupt")
    if interrupt is not None:
        interrupt._clear()


@pytest.fixture(autouse=True)
def adaptdl_clean_process(monkeypatch):
    """Every test starts and ends with no ``ADAPTDL_*`` variables and a fresh registry.

    The variables that were set before the test are restored by ``monkeypatch``; the ones
    a test (or the library, e.g. ``init_process_group``) set are removed.
    """
    for name in _adaptdl_vars():
        monkeypatch.delenv(name)
    _reset_process_state()
    yield
    for name in _adaptdl_vars():
        # Directly, not through monkeypatch (whose undo would put the value back); the
        # values that existed before the test are restored by monkeypatch's undo.
        os.environ.pop(name, None)
    _reset_process_state()


@pytest.fixture
def ckpt_dir(tmp_path, monkeypatch):
    """A fresh checkpoint directory, exported as ``ADAPTDL_CHECKPOINT_PATH``."""
    path = tmp_path / "ckpt"
    path.mkdir()
    monkeypatch.setenv("ADAPTDL_CHECKPOINT_PATH", str(path))
    return path


@pytest.fixture
def restart():
    """Simulate a restart of the job inside this process: forget every State and the
    restore point, so that States created next reload from the newest checkpoint."""
    return checkpoint._unregister_all


@pytest.fixture
def free_port():
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def subprocess_env():
    """Environment for child Python processes: this one's, without ``ADAPTDL_*`` and with
    a single OpenMP/MKL thread (the test machines have few cores)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ADAPTDL_")}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return env
