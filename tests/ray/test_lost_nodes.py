"""A node that vanishes without notice costs a submitted job or a Tune trial at most one
checkpoint interval: it continues on the other nodes from its newest in-place checkpoint,
with no failure (each on a two-node cluster of its own, in a subprocess:
:mod:`tests.ray.lost_node_job_run`, :mod:`tests.ray.lost_node_trial_run`)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("ray")

from tests.ray.test_draining_nodes import REPO_ROOT, _env  # noqa: E402
from tests.ray.two_nodes import summary_of  # noqa: E402

# Each test here starts Ray or whole trainings (tens of seconds).
pytestmark = pytest.mark.slow


def run_scenario(module, tmp_path, interval_s, *args):
    """Run the scenario ``module`` in its own process; ``(process, its summary, the
    record directory)``."""
    record = tmp_path / "record"
    record.mkdir()
    proc = subprocess.run([sys.executable, "-m", module, str(tmp_path / "storage"),
                           str(record), str(interval_s), *args], cwd=REPO_ROOT, env=_env(),
                          capture_output=True, text=True, timeout=420)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, summary_of(proc.stdout), record


def test_a_job_on_a_lost_node_continues_repeating_at_most_one_interval(tmp_path):
    """A 2-replica job on a worker of 2 CPUs (the head holds 1) checkpoints in place every
    2 s; after 30 batches (three intervals and more) the worker is removed abruptly: the
    job relaunches with the 1 replica the head holds and finishes with status 0; every
    sample of every epoch is trained at least once, and the repeats are at most one
    interval's batches (without in-place checkpoints they would be all 30)."""
    from tests.core.harness import read_events
    from tests.ray.lost_node_job_run import BATCH, EPOCHS, SIZE, SLEEP_S
    interval_s = 2.0
    proc, seen, record = run_scenario("tests.ray.lost_node_job_run", tmp_path, interval_s)
    assert seen["status"] == 0, proc.stderr[-3000:]
    assert seen["sizes"] == {"0": 2, "1": 1}, seen
    assert seen["loss_to_first_step_s"] is not None, seen
    assert "were lost" in proc.stderr
    assert_at_most_one_interval_repeated(read_events(record), EPOCHS, SIZE, interval_s,
                                         SLEEP_S, BATCH, seen)


def assert_at_most_one_interval_repeated(events, epochs, size, interval_s, sleep_s, batch,
                                         context):
    """Every sample of every epoch trained at least once; the repeats at most one
    interval's batches, plus the batch a save waits for and one in flight.

    Where the batches carry their time, the repeats are judged in time: the batches of a
    launch trained again later span at most one interval, plus 2 s for the save they
    followed and the batches in flight (on a loaded 2-core machine a batch takes longer
    than its sleep, and a save longer than on a quiet one, so a count of batches fits
    a quiet machine only)."""
    from tests.exactly_once import launch_of, samples_per_epoch
    per_epoch = samples_per_epoch(events)
    assert sorted(per_epoch) == list(range(epochs)), context
    for epoch, counts in per_epoch.items():
        assert set(counts) == set(range(size)), f"epoch {epoch}: samples missing"
    repeated = sum(c - 1 for counts in per_epoch.values() for c in counts.values())
    batches = [e for e in events if e["event"] == "batch"]
    if not batches or any("time" not in e for e in batches):
        bound = (interval_s / sleep_s + 2) * batch
        assert repeated <= bound, (repeated, bound, context)
        return
    last_launch = {}
    for e in batches:
        for i in e["idx"]:
            last_launch[(e["epoch"], i)] = max(last_launch.get((e["epoch"], i), -1),
                                               launch_of(e))
    lost = [e["time"] for e in batches
            if any(last_launch[(e["epoch"], i)] > launch_of(e) for i in e["idx"])]
    span = max(lost) - min(lost) if lost else 0.0  # (a loss right after a save loses none)
    assert span <= interval_s + 2.0, (span, repeated, context)


def test_a_trial_on_a_lost_node_continues_in_its_placement_group(tmp_path):
    """A 3-replica trial with one replica on the worker (bundles 0 and 1, and the trial
    actor, on the head) checkpoints in place every 2 s; after 30 steps the worker is
    removed abruptly: the trial starts its 3 replicas again from the newest checkpoint (Ray
    places the lost bundle on the head), ends TERMINATED with no failure counted; every
    sample at least once, the repeats at most one interval's batches."""
    from tests.ray.interrupt_scenario import records
    from tests.ray.lost_node_trial_run import BATCH, EPOCHS, SIZE, SLEEP_S
    interval_s = 2.0
    _, seen, record = run_scenario("tests.ray.lost_node_trial_run", tmp_path, interval_s)
    assert seen["nodes_before"] == [2], seen  # the first launch spanned both nodes
    assert seen["status"] == "TERMINATED" and seen["failures"] == 0, seen
    assert seen["sizes"] == {"0": 3, "1": 3}, seen
    assert seen["loss_to_first_step_s"] is not None, seen
    assert_at_most_one_interval_repeated(records(record), EPOCHS, SIZE, interval_s,
                                         SLEEP_S, BATCH, seen)


def test_a_trial_whose_own_node_is_lost_resumes_from_its_kept_in_place_checkpoint(tmp_path):
    """A one-replica trial runs its replica in the trial actor, on the worker (the head's
    CPU is held); it checkpoints in place every 2 s, and each checkpoint is also kept on
    the run's storage. The worker is removed without notice after 30 steps: Tune counts the
    failure and retries (max_failures=1) on the head, where the trial resumes from the kept
    checkpoint, not from the start: every sample at least once, the repeats at most one
    interval's (from the start they would be all 30 steps')."""
    from tests.ray.interrupt_scenario import records
    from tests.ray.lost_node_trial_run import BATCH, EPOCHS, SIZE, SLEEP_S
    interval_s = 2.0
    _, seen, record = run_scenario("tests.ray.lost_node_trial_run", tmp_path, interval_s,
                                   "actor")
    assert seen["status"] == "TERMINATED" and seen["failures"] == 1, seen
    assert seen["loss_to_first_step_s"] is not None, seen
    assert_at_most_one_interval_repeated(records(record), EPOCHS, SIZE, interval_s,
                                         SLEEP_S, BATCH, seen)
