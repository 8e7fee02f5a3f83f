"""End-to-end: AdaptDL trials on a real (local) Ray Tune run.

The trials' replicas record every batch's sample indices (tests/ray/trial_jobs.py), so
the tests can count: every epoch must see every sample exactly once, across resizes.
"""

from __future__ import annotations

import collections
import csv
import json
import os
import time

import pytest

ray = pytest.importorskip("ray")
from ray import tune  # noqa: E402

from adaptdl_core.policy import AllocationResult, NodeInfo, PolluxPolicy  # noqa: E402
from adaptdl_ray.tune import AdaptDLScheduler, AdaptDLTrainableCreator  # noqa: E402
from tests.exactly_once import assert_exactly_once  # noqa: E402
from tests.ray.interrupt_scenario import records as read_records  # noqa: E402
from tests.ray.trial_jobs import counting_job  # noqa: E402

pytestmark = [pytest.mark.usefixtures("ray_session"), pytest.mark.slow]


class ScriptedPolicy:
    """A deterministic grow / shrink sequence: a job gets ``start`` replicas until it has
    been seen running, then ``script[r]`` once it has restarted ``r`` times (the last entry
    once the script is exhausted). Use it with ``resize_rule=always_resize``: these tests
    check the resize mechanism, not whether a resize pays (test_scheduler_unit does)."""

    def __init__(self, start, script, done_file=None):
        self.start, self.script = start, list(script)
        self.seen_running = set()
        self.done_file = done_file  # touched once a job has run the whole script

    def allocate(self, jobs, nodes, base_allocations=None, *, now=None):
        node = next(iter(nodes))
        self.seen_running.update(base_allocations or {})
        allocations = {}
        for key, job in jobs.items():
            count = self.script[min(job.num_restarts, len(self.script) - 1)] \
                if key in self.seen_running else self.start
            allocations[key] = [node] * count
            if self.done_file and key in self.seen_running and \
                    job.num_restarts >= len(self.script):
                open(self.done_file, "w").close()
        return AllocationResult(allocations, {k: float(len(v)) for k, v in allocations.items()},
                                1.0, 0, True, 0.0)


def always_resize(**kwargs):
    """A resize rule that lets every proposed resize go ahead."""
    from adaptdl_core.policy import ResizeVerdict
    return ResizeVerdict(kwargs["current"] != kwargs["target"], "scripted")


def progress_rows(trial):
    """progress.csv's rows; every one as wide as the header (through resizes)."""
    with open(os.path.join(trial.local_path, "progress.csv"), newline="") as f:
        raw = list(csv.reader(f))
    assert all(len(r) == len(raw[0]) for r in raw[1:])
    return [dict(zip(raw[0], r)) for r in raw[1:]]


def test_trial_grows_shrinks_and_finishes_every_epoch_exactly_once(tmp_path):
    record_dir = tmp_path / "records"
    record_dir.mkdir()
    # Batches of 0.15 s until the policy has run its whole script, then as fast as they go:
    # the trial trains through its three resizes however slow the machine (up to 20 epochs
    # x 20 batches), then ends without waiting.
    size, epochs = 240, 20
    done = tmp_path / "script-done"
    policy = ScriptedPolicy(1, [3, 2, 1], done_file=str(done))  # 1 -> 3 -> 2 -> 1
    scheduler = AdaptDLScheduler(allocation_interval_s=1.0, policy=policy,
                                 resize_rule=always_resize)
    trainable = AdaptDLTrainableCreator(counting_job, max_replicas=3)
    analysis = tune.run(
        trainable, scheduler=scheduler, storage_path=str(tmp_path / "results"), verbose=0,
        config={"record_dir": str(record_dir), "epochs": epochs, "size": size,
                "batch_size": 12, "sleep": 0.15, "report_every": 5,
                "slow_until": str(done)})
    trial = analysis.trials[0]
    assert trial.status == "TERMINATED"
    assert done.exists()  # (the script ran to its end before training did)
    events = read_records(str(record_dir))
    assert_exactly_once(events, size, epochs)
    # The trial really ran at 1, 3 and 2 replicas (from the workers' own records) ...
    starts = sorted((e["restarts"], e["replicas"]) for e in events if e["event"] == "start")
    shapes = [replicas for _, replicas in dict(starts).items()]  # one per launch, in order
    assert len(starts) == sum(shapes), starts  # every replica of every launch started
    assert shapes == [1, 3, 2, 1], shapes
    # tune.get_context() works inside the replicas.
    assert {e["trial_id"] for e in events if e["event"] == "start"} == {trial.trial_id}
    assert sum(e["event"] == "finished" for e in events) == shapes[-1]
    # ... and each resize resumed mid-epoch, not at an epoch start: some epoch was
    # trained by more than one replica count.
    per_epoch = collections.defaultdict(set)
    for e in events:
        if e["event"] == "batch":
            per_epoch[e["epoch"]].add(e["replicas"])
    assert any(len(counts) > 1 for counts in per_epoch.values()), dict(per_epoch)
    # Every report reached Tune exactly once, in order, with the adaptdl/ metrics.
    rows = progress_rows(trial)
    keys = [r["report_key"] for r in rows]
    assert len(keys) == len(set(keys)), [k for k, c in collections.Counter(keys).items() if c > 1]
    assert [k for k in keys if k.endswith(":end")] == [f"{e}:end" for e in range(epochs)]
    # The last report is the last row (no extra row, no resize decided after it). It is
    # marked done when the function ended within the trainable's grace period after it; on
    # a loaded machine the function may end later, and Tune completes the trial with that
    # same row (a duplicate result, no new row).
    assert rows[-1]["report_key"] == f"{epochs - 1}:end", rows[-1]
    assert all(r["done"] == "False" for r in rows[:-1])
    restarts = [int(r["adaptdl/restarts"]) for r in rows]
    assert restarts == sorted(restarts) and restarts[-1] == len(shapes) - 1
    assert {int(r["adaptdl/replicas"]) for r in rows} >= {1, 2, 3}
    resize = [float(r["adaptdl/resize_s"]) for r in rows]
    assert resize[0] == 0.0 and resize[-1] > 0.0
    # The scheduler's own record agrees with what the workers saw.
    record = scheduler.state.jobs[trial.trial_id]
    assert record.resizes == len(shapes) - 1
    assert [n for _, n in record.history] == [1, 3, 2, 1, 0]


def test_three_trials_on_four_cpus_never_exceed_the_cluster_and_leak_nothing(tmp_path):
    record_root = tmp_path / "records"
    cluster = {"node": NodeInfo({"CPU": 4.0})}
    usage = []

    class Watch(tune.Callback):
        def on_step_end(self, iteration, trials, **info):
            usage.append(sum(t.placement_group_factory.required_resources.get("CPU", 0.0)
                             for t in trials if t.status == "RUNNING"))

    def config_for(i):
        d = record_root / str(i)
        d.mkdir(parents=True)
        return str(d)

    scheduler = AdaptDLScheduler(allocation_interval_s=2.0, nodes_fn=lambda: cluster,
                                 policy=PolluxPolicy())
    trainable = AdaptDLTrainableCreator(counting_job)
    analysis = tune.run(
        trainable, scheduler=scheduler, storage_path=str(tmp_path / "results"), verbose=0,
        callbacks=[Watch()],
        config={"record_dir": tune.grid_search([config_for(i) for i in range(3)]),
                "epochs": 2, "size": 96, "batch_size": 8, "sleep": 0.01, "report_every": 4})
    assert [t.status for t in analysis.trials] == ["TERMINATED"] * 3
    assert usage and max(usage) <= 4.0, max(usage)
    for i in range(3):
        assert_exactly_once(read_records(str(record_root / str(i))), 96, 2)
    # Every placement group the trials created is gone after the run.
    deadline = time.time() + 20
    while time.time() < deadline:
        alive = [pg for pg in ray.util.placement_group_table().values()
                 if pg["state"] != "REMOVED"]
        if not alive:
            break
        time.sleep(0.5)
    assert not alive, alive


def test_two_node_cluster_spans_nodes_and_moves_checkpoints_between_them(tmp_path):
    """A separate 2-node Ray cluster (ray.cluster_utils.Cluster) in a subprocess."""
    import subprocess
    import sys
    from tests.ray import two_node_run
    from tests.ray.conftest import REPO_ROOT
    record_dir = tmp_path / "records"
    record_dir.mkdir()
    env = dict(os.environ, PYTHONPATH=REPO_ROOT)
    proc = subprocess.run([sys.executable, "-m", "tests.ray.two_node_run", str(record_dir),
                           str(tmp_path / "results")], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=420)
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["status"] == "TERMINATED" and summary["num_nodes"] == 2
    assert summary["script_done"]  # (the grow came before training ended)
    events = read_records(str(record_dir))
    assert_exactly_once(events, 240, two_node_run.EPOCHS)
    starts = sorted((e["restarts"], e["replicas"], e["nodes"]) for e in events
                    if e["event"] == "start")
    shapes = sorted(set(starts))
    # 1 replica, then 3 (over both 2-CPU nodes): the checkpoint moved between nodes.
    assert [(r, n) for _, r, n in shapes] == [(1, 1), (3, 2)], shapes


def test_tuner_api_and_worker_failure_is_reported(tmp_path):
    record_dir = tmp_path / "records"
    record_dir.mkdir()

    def failing_job(config):
        import adaptdl_core.env as env
        counting_job(dict(config, epochs=1))
        if env.replica_rank() == 0:
            raise RuntimeError("boom in the training function")

    tuner = tune.Tuner(
        AdaptDLTrainableCreator(failing_job),
        param_space={"record_dir": str(record_dir), "size": 32, "batch_size": 8,
                     "report_every": 2},
        tune_config=tune.TuneConfig(scheduler=AdaptDLScheduler()),
        run_config=tune.RunConfig(storage_path=str(tmp_path / "results"), verbose=0))
    results = tuner.fit()
    assert results.num_errors == 1
    assert "boom in the training function" in str(results.errors[0])


def test_a_replica_that_fails_before_its_function_begins_fails_the_trial(tmp_path):
    """A replica whose run() failed before the training function began (its arguments
    could not be unpickled: seen when two threads imported torch at once) never reports
    nor ends: the trial must fail naming it, not wait for a report forever."""
    import threading

    from tests.ray.trial_jobs import PoisonOnSecondHop
    record_dir = tmp_path / "records"
    record_dir.mkdir()
    tuner = tune.Tuner(
        AdaptDLTrainableCreator(counting_job, min_replicas=2, max_replicas=2),
        param_space={"record_dir": str(record_dir), "epochs": 1, "size": 32,
                     "batch_size": 8, "poison": PoisonOnSecondHop()},
        tune_config=tune.TuneConfig(scheduler=AdaptDLScheduler()),
        run_config=tune.RunConfig(storage_path=str(tmp_path / "results"), verbose=0))
    outcome = {}

    def fit():
        try:
            outcome["results"] = tuner.fit()
        except BaseException as exc:  # noqa: BLE001 - shown by the assertion below
            outcome["error"] = exc

    thread = threading.Thread(target=fit, daemon=True)  # (a hang must not hang the suite)
    thread.start()
    thread.join(timeout=180)
    assert not thread.is_alive(), "the trial still waits for a replica that failed at its start"
    assert "error" not in outcome, outcome.get("error")
    results = outcome["results"]
    assert results.num_errors == 1
    message = str(results.errors[0])
    assert "replica" in message and "planned unpickling failure" in message, message


def test_run_job_trains_one_elastic_job_alone(tmp_path):
    from adaptdl_ray import run_job
    record_dir = tmp_path / "records"
    record_dir.mkdir()
    result = run_job(counting_job, {"record_dir": str(record_dir), "epochs": 2, "size": 96,
                                    "batch_size": 8, "report_every": 4},
                     storage_path=str(tmp_path / "results"), verbose=0)
    assert result.metrics["report_key"] == "1:end"
    events = read_records(str(record_dir))
    assert_exactly_once(events, 96, 2)
    # Nothing measured yet, so it starts at one replica (growth once its measurements say
    # more replicas pay: test_scheduler_unit); the adaptdl/ metrics reach the result.
    assert result.metrics["adaptdl/replicas"] == 1 and result.metrics["adaptdl/restarts"] == 0
