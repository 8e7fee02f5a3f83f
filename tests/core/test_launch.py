"""The standalone launcher: `python -m adaptdl_core.launch` and its functions."""

import subprocess
import sys

import pytest

from adaptdl_core import launch
from tests.core.harness import JOBS, read_events


def test_cli_stops_with_143_then_resumes_on_fewer_replicas(tmp_path):
    def cli(*args):
        return subprocess.run([sys.executable, "-m", "adaptdl_core.launch", *args],
                              capture_output=True, text=True, timeout=180)

    job = [str(JOBS / "elastic_job.py"), "--record", str(tmp_path), "--size", "48"]
    first = cli("--replicas", "2", "--checkpoint-path", str(tmp_path / "ckpt"),
                *job, "--stop-after", "3")
    assert first.returncode == 143, first.stdout + first.stderr
    second = cli("--replicas", "1", "--restarts", "1", "--checkpoint-path",
                 str(tmp_path / "ckpt"), *job)
    assert second.returncode == 0, second.stdout + second.stderr
    events = read_events(tmp_path)
    assert {(e["restart"], e["rank"]) for e in events} == {(0, 0), (0, 1), (1, 0)}
    for epoch in range(3):
        seen = sorted(i for e in events if e["event"] == "batch" and e["epoch"] == epoch
                      for i in e["idx"])
        assert seen == list(range(48))


def test_job_status_and_env():
    assert launch.job_status([0, 0]) == 0
    assert launch.job_status([143, 143]) == 143
    assert launch.job_status([143, 0]) == 143
    assert launch.job_status([143, 7, 1]) == 7
    env = launch.replica_env(1, 3, 4321, checkpoint_path="/x", num_restarts=2, base_env={})
    assert env == {"ADAPTDL_MASTER_ADDR": "127.0.0.1", "ADAPTDL_MASTER_PORT": "4321",
                   "ADAPTDL_REPLICA_RANK": "1", "ADAPTDL_NUM_REPLICAS": "3",
                   "ADAPTDL_NUM_RESTARTS": "2", "ADAPTDL_CHECKPOINT_PATH": "/x"}
    with pytest.raises(ValueError, match="rank=3"):
        launch.replica_env(3, 3, 1)
    with pytest.raises(ValueError, match="num_replicas"):
        launch.start_replicas([sys.executable, "-c", "pass"], 0)
