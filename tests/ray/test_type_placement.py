"""Placement by accelerator type on a real Ray cluster of two fake types (one named by its
``accelerator_type:<T>`` resource, the other only by its label): a submitted
job's and a Tune trial's replicas run on the type their solve chose, before and after a
move between types, every sample trained exactly once (:mod:`tests.ray.typed_placement_run`:
one cluster for both, its start paid once)."""

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


def test_a_job_and_a_trial_run_on_the_chosen_type_and_move_to_another_exactly_once(tmp_path):
    from tests.core.harness import read_events
    from tests.exactly_once import assert_exactly_once
    from tests.ray.interrupt_scenario import records
    from tests.ray.typed_placement_run import EPOCHS, SIZE, TRIAL_EPOCHS, TRIAL_SIZE
    record, trial_record = tmp_path / "record", tmp_path / "trial-record"
    record.mkdir()
    trial_record.mkdir()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p))
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run([sys.executable, "-m", "tests.ray.typed_placement_run",
                           str(tmp_path / "storage"), str(record), str(trial_record)],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = summary_of(proc.stdout)
    type_a, type_b = seen["types"]["typeA"], seen["types"]["typeB"]

    # The job: launch 0's two replicas on the typeA node, every later launch on typeB.
    job = seen["job"]
    assert job["status"] == 0, proc.stderr[-3000:]
    assert job["launches"]["0"] == [type_a, type_a], job
    assert len(job["launches"]) >= 2 and job["moved"], job
    assert all(nodes == [type_b] * len(nodes) for r, nodes in job["launches"].items()
               if r != "0"), job
    # The move was a resize at the same size (2 -> 2), carried out once.
    assert [(r["from"], r["to"]) for r in job["resizes"]] == [(2, 2)], job
    assert_exactly_once(read_events(record), SIZE, EPOCHS)

    # The trial: its first request named typeB (the type its first solve chose), so launch
    # 0 ran there; moved by a pause and a relaunch with a typeA request, once.
    trial = seen["trial"]
    assert trial["status"] == "TERMINATED" and trial["failures"] == 0, trial
    assert trial["launches"]["0"] == [type_b, type_b], trial
    assert len(trial["launches"]) >= 2 and trial["moved"], trial
    assert all(nodes == [type_a] * len(nodes) for r, nodes in trial["launches"].items()
               if r != "0"), trial
    assert [(r["from"], r["to"]) for r in trial["resizes"]] == [(2, 2)], trial
    assert "typeA" in trial["resizes"][0]["reason"], trial
    assert_exactly_once(records(str(trial_record)), TRIAL_SIZE, TRIAL_EPOCHS)
