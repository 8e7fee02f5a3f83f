"""Placement by accelerator type on a real Ray cluster of two fake types: a submitted
job's replicas run on the type its solve chose, before and after a move between types,
every sample trained exactly once (:mod:`tests.ray.typed_job_run`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.ray.two_nodes import summary_of

pytest.importorskip("ray")

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_a_job_runs_on_the_chosen_type_and_moves_to_another_exactly_once(tmp_path):
    from tests.core.harness import read_events
    from tests.exactly_once import assert_exactly_once
    from tests.ray.typed_job_run import EPOCHS, SIZE
    record = tmp_path / "record"
    record.mkdir()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p))
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run([sys.executable, "-m", "tests.ray.typed_job_run",
                           str(tmp_path / "storage"), str(record)], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=480)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = summary_of(proc.stdout)
    assert seen["status"] == 0, proc.stderr[-3000:]
    type_a, type_b = seen["types"]["typeA"], seen["types"]["typeB"]
    launches = seen["launches"]
    # Launch 0: both replicas on the typeA node; every later launch on the typeB node.
    assert launches["0"] == [type_a, type_a], seen
    assert len(launches) >= 2 and seen["moved"], seen
    assert all(nodes == [type_b] * len(nodes) for r, nodes in launches.items() if r != "0"), \
        seen
    # The move was a resize at the same size (2 -> 2), carried out once.
    assert [(r["from"], r["to"]) for r in seen["resizes"]] == [(2, 2)], seen
    assert_exactly_once(read_events(record), SIZE, EPOCHS)
