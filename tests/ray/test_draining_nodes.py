"""A node Ray is draining (a spot node given its preemption notice) is seen at once, with
its deadline, and left out of the cluster every decision places work on (a two-node
cluster of its own, in a subprocess: :mod:`tests.ray.drain_run`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray")

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_a_draining_node_is_left_out_with_its_deadline():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p))
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run([sys.executable, "-m", "tests.ray.drain_run"], cwd=REPO_ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
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
