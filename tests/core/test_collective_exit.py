"""Replica 0 of a collective returns only once every replica has read the result.

Replica 0 hosts the store. Before the fix it returned from a collective as soon as every
replica had *published* its value, and only the atexit teardown kept its store up until
the others had read: a replica 0 ending without atexit (``os._exit``, a forked child, a
kill) made the others fail reading the last result with ``CollectiveError ... Connection
reset by peer`` (in 5 to 8 of 12 rounds on a 2-core machine).
"""

import json
import subprocess
import sys

from tests.core.harness import JOBS

JOB = JOBS / "exit_race_job.py"
ROUNDS, REPLICAS = 16, 3


def test_every_replica_reads_the_last_result_when_all_exit_at_once(subprocess_env):
    """16 jobs of 3 replicas, run at once; every replica of every job calls ``os._exit``
    right after its last collective: every replica got every result, and none failed."""
    proc = subprocess.run([sys.executable, str(JOB), "--rounds", str(ROUNDS),
                           "--replicas", str(REPLICAS)],
                          env=subprocess_env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["rounds"] == ROUNDS
    assert report["failures"] == [], (
        f"[round, rank, status] of failed replicas: {report['failures']}\n"
        + proc.stderr[-3000:])
