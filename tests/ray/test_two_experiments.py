"""A second experiment in one process, after ``ray.shutdown()`` and ``ray.init()``, runs as
the first did (plain Tune allows it; a handle of the first cluster's control actor once
failed it with "Can't find actor")."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("ray")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


@pytest.mark.slow
def test_run_job_then_a_sweep_on_a_restarted_ray_in_one_process(subprocess_env):
    env = dict(subprocess_env, PYTHONPATH=os.pathsep.join(
        p for p in (ROOT, subprocess_env.get("PYTHONPATH")) if p))
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run([sys.executable, os.path.join(HERE, "two_experiments_run.py")],
                          env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"run_job": 1, "fit": [1]}, result
