"""Joining a job with replicas missing: every replica that waits fails on one deadline,
with a message naming the missing replicas in words.

Real processes (``tests/core/jobs/join_job.py``) of three jobs run at once: a 3-replica
job without replica 2, one without replica 0 (the master, which hosts the store), and a
2-replica job whose replica 1 dies right after joining. Each replica records when it
began to join, when it raised and what; the test times its exit. Every time is read from
``time.monotonic()``, the clock the rendezvous deadline is set on (one clock for all the
processes of the machine).
"""

import json
import subprocess
import sys
import time

import pytest

from adaptdl_core import collective, launch, ports
from tests.core.harness import JOBS

JOB = JOBS / "join_job.py"
TIMEOUT_S = 5.0
# The interpreter's own teardown after the exit handlers (torch's modules: seconds under
# load, up to 10 s measured with a load average of 13 on 2 cores) is only bounded against
# a hang; the library's part of the exit is timed by itself (see join_job.py).
TEARDOWN_LIMIT_S = 60.0
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
    started, unused = {}, []
    for job, (ranks, size, then) in {"no2": ((0, 1), 3, "exit"), "no0": ((1, 2), 3, "exit"),
                                      "dies": ((0, 1), 2, "die")}.items():
        out = root / job
        out.mkdir()
        # Held from now on: replica 0 inherits it; without replica 0 ("no0") it stays held
        # here, refusing connections as a port nobody listens on.
        held = ports.HeldPort()
        for rank in ranks:
            env = launch.replica_env(rank, size, held.port, extra_env={
                "ADAPTDL_TIMEOUT": str(DIES_TIMEOUT_S if then == "die" else TIMEOUT_S),
                "OMP_NUM_THREADS": "1", **(held.env() if rank == 0 else {})})
            started[job, rank] = subprocess.Popen(
                [sys.executable, str(JOB), "--out", str(out), "--then", then], env=env,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                pass_fds=(held.fileno(),) if rank == 0 else ())
        if 0 in ranks:
            held.close()  # (replica 0 holds its own copy)
        else:
            unused.append(held)
    outputs, exited = {}, {}
    pending = dict(started)
    deadline = time.monotonic() + 120
    while pending and time.monotonic() < deadline:
        for key, proc in list(pending.items()):
            if proc.poll() is not None:
                exited[key] = time.monotonic()
                outputs[key] = proc.stdout.read()
                del pending[key]
        time.sleep(0.02)
    for proc in pending.values():
        proc.kill()
    for held in unused:
        held.close()
    reports = {}
    for (job, rank), proc in started.items():
        path = root / job / f"rank{rank}.json"
        assert path.exists(), f"{job} rank {rank} wrote no report:\n{outputs.get((job, rank))}"
        report = json.loads(path.read_text())
        report["exited"] = exited.get((job, rank), float("inf"))
        done = root / job / f"rank{rank}.exit"
        report["handlers_done"] = float(done.read_text()) if done.exists() else float("inf")
        report["status"] = proc.returncode
        reports.setdefault(job, {})[rank] = report
    return reports


@pytest.mark.slow
def test_a_replica_that_never_started_is_named_on_every_replica(jobs):
    for r in jobs["no2"].values():
        assert r["type"] == "RendezvousTimeoutError", r
        assert r["message"].startswith(f"replica 2 of 3 never joined within {TIMEOUT_S:g} s "
                                       "(joined: 0, 1; master 127.0.0.1:"), r["message"]
        assert (r["missing"], r["joined"]) == ([2], [0, 1])
        assert r["status"] == 1


@pytest.mark.slow
def test_nobody_gives_up_before_the_deadline_nor_waits_again_at_exit(jobs):
    for job in ("no2", "no0"):
        began_0 = jobs[job][0]["began"] if 0 in jobs[job] else float("inf")
        for rank, r in jobs[job].items():
            # A replica's wait ends at its own deadline, or at replica 0's when it reads
            # replica 0's verdict; each deadline is TIMEOUT_S after a call that began
            # after "began" was read.
            assert r["raised"] >= min(r["began"], began_0) + TIMEOUT_S, (job, rank, r)
            # ...and no later than that deadline plus replica 0's grace of 2 s for its
            # verdict to be read; half a timeout more leaves a loaded machine room, a
            # second wait would take a whole one.
            assert r["raised"] - r["began"] < TIMEOUT_S * 1.5 + 2, (job, rank, r)
            # A second wait at exit (for the replicas that never came, or the store's
            # goodbye) would last another TIMEOUT_S; the exit handlers run in
            # milliseconds, half of it leaves a loaded machine ample room.
            assert r["handlers_done"] - r["raised"] < TIMEOUT_S / 2, (job, rank, r)
            assert r["exited"] - r["handlers_done"] < TEARDOWN_LIMIT_S, (job, rank, r)


@pytest.mark.slow
def test_an_unreachable_master_is_named(jobs):
    for rank, r in jobs["no0"].items():
        assert r["type"] == "RendezvousTimeoutError", r
        assert r["message"].startswith("replica 0 of 3 (the master, hosting the store at "
                                       "127.0.0.1:"), r["message"]
        assert f"could not be reached by replica {rank} within {TIMEOUT_S:g} s" in r["message"]
        assert r["missing"] == [0]


@pytest.mark.slow
def test_a_replica_failing_with_an_error_does_not_wait_a_timeout_to_exit(jobs):
    """Replica 1 dies after joining; replica 0's all_reduce fails at once, uncaught: its
    process ends without waiting (up to the timeout) for replica 1 to leave."""
    r = jobs["dies"][0]
    assert r["type"] == "RuntimeError" and r["status"] == 1, r
    # Waiting for the dead replica would last DIES_TIMEOUT_S, in the all_reduce or in the
    # exit handlers: half of it leaves a loaded machine ample room.
    assert r["raised"] - r["began"] < DIES_TIMEOUT_S / 2, r
    assert r["handlers_done"] - r["raised"] < DIES_TIMEOUT_S / 2, r
    assert r["exited"] - r["handlers_done"] < TEARDOWN_LIMIT_S, r
