"""A stop that lands after an epoch's training loop (at its last boundary, or in the
validation loop after it) waits for the next epoch: the epoch's code after the training
loop runs to its end with the values the loop set (the quickstart reports the last
``loss``), and the resumption starts the next epoch, so every epoch is reported once and
nothing raises ``NameError``."""

from __future__ import annotations

import json

import pytest

from tests.core.harness import JOBS, run_replicas

# Each test here starts Ray or whole trainings (tens of seconds).
pytestmark = pytest.mark.slow

JOB = JOBS / "stop_after_training_job.py"
EPOCHS = 4


def _events(results):
    out = []
    for line in results[0][1].splitlines():
        if line.startswith("{"):
            out.append(json.loads(line))
    return out


@pytest.mark.parametrize("replicas", [1, 2])
@pytest.mark.parametrize("stop_at", ["last-batch", "validation"])
def test_a_stop_after_the_training_loop_resumes_in_the_next_epoch(tmp_path, replicas, stop_at):
    ckpt = tmp_path / "ckpt"
    first = run_replicas(JOB, replicas, ckpt, 0, ["--stop-at", stop_at])
    for rank, (status, out) in enumerate(first):
        assert status == 143, f"rank {rank} exited {status}:\n{out[-3000:]}"
    events = _events(first)
    assert [e["epoch"] for e in events if e["event"] == "interrupt"] == [1]
    # The interrupted epoch still ran its validation and its report, on the loop's loss.
    assert [e["epoch"] for e in events if e["event"] == "report"] == [0, 1]

    second = run_replicas(JOB, replicas, ckpt, 1, ["--stop-at", stop_at])
    for rank, (status, out) in enumerate(second):
        assert status == 0, f"rank {rank} exited {status}:\n{out[-3000:]}"
    resumed = _events(second)
    assert [e["epoch"] for e in resumed if e["event"] == "report"] == [2, 3]
    assert all(e["restart"] == 1 for e in resumed)
