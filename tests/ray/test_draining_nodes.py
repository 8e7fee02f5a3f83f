"""A node Ray is draining (a spot node given its preemption notice) is seen at once, with
its deadline, and left out of the cluster every decision places work on; a submitted job
training there moves before the deadline, and so does a Tune trial (each on a two-node
cluster of its own, in a subprocess: :mod:`tests.ray.drain_run`,
:mod:`tests.ray.drain_job_run`, :mod:`tests.ray.drain_trial_run`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.ray.two_nodes import summary_of  # noqa: E402

pytest.importorskip("ray")

# Each test here starts Ray or whole trainings (tens of seconds).
pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]


def _env() -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p))
    env.pop("RAY_ADDRESS", None)
    return env


def test_a_draining_node_is_left_out_with_its_deadline():
    proc = subprocess.run([sys.executable, "-m", "tests.ray.drain_run"], cwd=REPO_ROOT,
                          env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = summary_of(proc.stdout)
    worker, head = seen["worker"], seen["head"]
    assert seen["on_worker"]
    assert seen["before"] == {"draining": {}, "nodes": sorted([head, worker])}
    assert seen["drain_rc"] == 0, seen["drain_err"]
    assert set(seen["draining"]) == {worker}
    assert abs(seen["draining"][worker] - (seen["asked"] + 120)) < 10
    assert seen["nodes"] == [head]
    # Given a node list, the drains are only those named.
    assert seen["given_list"] == sorted([head, worker])
    assert seen["given_list_and_drains"] == [head]


def test_a_job_on_a_draining_node_moves_before_the_deadline_exactly_once(tmp_path):
    """A 2-replica submitted job's driver (ElasticJob) on a head of 1 CPU and a worker of 2;
    the worker is drained with a 60 s deadline while the job trains there: it checkpoints,
    relaunches with the 1 replica the head holds, and finishes; every sample of every
    epoch exactly once (:mod:`tests.ray.drain_job_run`)."""
    from tests.core.harness import read_events
    from tests.exactly_once import assert_exactly_once
    record = tmp_path / "record"
    record.mkdir()
    proc = subprocess.run([sys.executable, "-m", "tests.ray.drain_job_run",
                           str(tmp_path / "storage"), str(record), "60"], cwd=REPO_ROOT,
                          env=_env(), capture_output=True, text=True, timeout=420)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = summary_of(proc.stdout)
    assert seen["drain_rc"] == 0, seen["drain_err"]
    assert seen["status"] == 0, proc.stderr[-3000:]
    assert seen["sizes"] == {"0": 2, "1": 1}, seen
    assert seen["drain_to_first_step_s"] is not None
    assert seen["drain_to_first_step_s"] < seen["deadline_s"], seen
    assert "draining (deadline in" in proc.stderr and "under its replicas: checkpointing" \
        in proc.stderr
    assert_exactly_once(read_events(record), 96, 2)


def test_a_trial_on_a_draining_node_moves_before_the_deadline_exactly_once(tmp_path):
    """A trial under AdaptDLScheduler grows to 2 replicas, one or both on a worker of 2
    CPUs (the head holds 1); the worker is drained with a 60 s deadline, then removed once
    the trial left it: the scheduler pauses the trial at a batch boundary (no report
    needed: reports come once an epoch) and relaunches it with the 1 replica the head
    holds; it finishes with no failure counted, every sample of every epoch exactly once
    (:mod:`tests.ray.drain_trial_run`)."""
    from tests.exactly_once import assert_exactly_once
    from tests.ray.drain_trial_run import EPOCHS, SIZE
    from tests.ray.interrupt_scenario import records
    record = tmp_path / "record"
    record.mkdir()
    proc = subprocess.run([sys.executable, "-m", "tests.ray.drain_trial_run",
                           str(tmp_path / "storage"), str(record), "60"], cwd=REPO_ROOT,
                          env=_env(), capture_output=True, text=True, timeout=420)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = summary_of(proc.stdout)
    assert seen["drain_rc"] == 0, seen["drain_err"]
    assert seen["status"] == "TERMINATED" and seen["failures"] == 0, seen
    assert seen["sizes"] == {"0": 1, "1": 2, "2": 1}, seen
    assert "draining" in seen["resize_log"][-1]["reason"], seen["resize_log"]
    assert seen["drain_to_first_step_s"] is not None
    assert seen["drain_to_first_step_s"] < seen["deadline_s"], seen
    assert seen["removed"]
    assert_exactly_once(records(record), SIZE, EPOCHS)
