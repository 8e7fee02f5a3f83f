"""Joining a job with replicas missing: every replica that waits fails on one deadline,
with a message naming the missing replicas in words.

Real processes (``tests/core/jobs/join_job.py``) of three jobs run at once: a 3-replica
job without replica 2, one without replica 0 (the master, which hosts the store), and a
2-replica job whose replica 1 dies right after joining. Each replica records when it
began to join and what it raised; the test times its exit.
"""

import json
import subprocess
import sys
import time

import pytest

from adaptdl_core import collective, launch
from tests.core.harness import JOBS

JOB = JOBS / "join_job.py"
TIMEOUT_S = 5.0
# Replica 0 may keep its store up to 2 s for the others to read its verdict; the rest
# is the interpreter's exit on a small shared machine.
MARGIN_S = 5.0
# The job whose replica dies after joining: a long timeout, so that an exit that waited
# for it (for the dead replica to leave) would show.
DIES_TIMEOUT_S = 20.0


def test_ranks_in_words():
    assert collective.ranks_in_words([2]) == "replica 2"
    assert collective.ranks_in_words([3, 2]) == "replicas 2 and 3"
    assert collective.ranks_in_words([5, 1, 2]) == "replicas 1, 2 and 5"


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """Start both jobs' replicas; returns {job: {rank: report with "exited"}}."""
    root = tmp_path_factory.mktemp("rendezvous")
    started = {}
    for job, (ranks, size, then) in {"no2": ((0, 1), 3, "exit"), "no0": ((1, 2), 3, "exit"),
                                      "dies": ((0, 1), 2, "die")}.items():
        out = root / job
        out.mkdir()
        port = launch.free_port()
        for rank in ranks:
            env = launch.replica_env(rank, size, port, extra_env={
                "ADAPTDL_TIMEOUT": str(DIES_TIMEOUT_S if then == "die" else TIMEOUT_S),
                "OMP_NUM_THREADS": "1"})
            started[job, rank] = subprocess.Popen(
                [sys.executable, str(JOB), "--out", str(out), "--then", then], env=env,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    outputs, exited = {}, {}
    pending = dict(started)
    deadline = time.time() + 120
    while pending and time.time() < deadline:
        for key, proc in list(pending.items()):
            if proc.poll() is not None:
                exited[key] = time.time()
                outputs[key] = proc.stdout.read()
                del pending[key]
        time.sleep(0.02)
    for proc in pending.values():
        proc.kill()
    reports = {}
    for (job, rank), proc in started.items():
        path = root / job / f"rank{rank}.json"
        assert path.exists(), f"{job} rank {rank} wrote no report:\n{outputs.get((job, rank))}"
        report = json.loads(path.read_text())
        report["exited"] = exited.get((job, rank), float("inf"))
        report["status"] = proc.returncode
        reports.setdefault(job, {})[rank] = report
    return reports


def test_a_replica_that_never_started_is_named_on_every_replica(jobs):
    for r in jobs["no2"].values():
        assert r["type"] == "RendezvousTimeoutError", r
        assert r["message"].startswith(f"replica 2 of 3 never joined within {TIMEOUT_S:g} s "
                                       "(joined: 0, 1; master 127.0.0.1:"), r["message"]
        assert (r["missing"], r["joined"]) == ([2], [0, 1])
        assert r["status"] == 1


def test_nobody_waits_past_the_timeout_plus_a_margin(jobs):
    for job in ("no2", "no0"):
        for rank, r in jobs[job].items():
            assert TIMEOUT_S * 0.9 <= r["raised"] - r["began"], (job, rank, r)
            # Until the process is gone: no second wait at exit.
            assert r["exited"] - r["began"] < TIMEOUT_S + MARGIN_S, (job, rank, r)


def test_an_unreachable_master_is_named(jobs):
    for rank, r in jobs["no0"].items():
        assert r["type"] == "RendezvousTimeoutError", r
        assert r["message"].startswith("replica 0 of 3 (the master, hosting the store at "
                                       "127.0.0.1:"), r["message"]
        assert f"could not be reached by replica {rank} within {TIMEOUT_S:g} s" in r["message"]
        assert r["missing"] == [0]


def test_a_replica_failing_with_an_error_does_not_wait_a_timeout_to_exit(jobs):
    """Replica 1 dies after joining; replica 0's all_reduce fails at once, uncaught: its
    process ends without waiting (up to the timeout) for replica 1 to leave."""
    r = jobs["dies"][0]
    assert r["type"] == "RuntimeError" and r["status"] == 1, r
    assert r["raised"] - r["began"] < DIES_TIMEOUT_S / 2, r
    assert r["exited"] - r["raised"] < MARGIN_S, r
