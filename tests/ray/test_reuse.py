"""Tune's ``reuse_actors=True`` for AdaptDL trials: a trial actor and its warm replica
actors serve the next trial, which behaves exactly as in fresh processes."""

from __future__ import annotations

import pytest

ray = pytest.importorskip("ray")
from ray import tune  # noqa: E402

from adaptdl_ray.tune import AdaptDLTrainableCreator  # noqa: E402
from tests.ray.trial_jobs import (SEEDED_BASE as BASE, SEEDED_CASES as CASES,  # noqa: E402
                                  ResultsBySeed, seeded_job)

# Each test here starts Ray or whole trainings (tens of seconds).
pytestmark = pytest.mark.slow


def _run(tmp_path, name, reuse):
    """Both cases one after the other (one trial at a time); ``{seed: [results]}``."""
    results = ResultsBySeed()
    trainable = AdaptDLTrainableCreator(seeded_job, min_replicas=2, max_replicas=2)
    tuner = tune.Tuner(
        trainable,
        param_space={**BASE, "case": tune.grid_search(CASES)},
        tune_config=tune.TuneConfig(reuse_actors=reuse, max_concurrent_trials=1),
        run_config=tune.RunConfig(name=name, storage_path=str(tmp_path), verbose=0,
                                  callbacks=[results]))
    grid = tuner.fit()
    assert not grid.errors, grid.errors
    return results.by_seed


def _job_env(port):
    return {"ADAPTDL_REPLICA_RANK": "0", "ADAPTDL_NUM_REPLICAS": "1", "ADAPTDL_NUM_NODES": "1",
            "ADAPTDL_MASTER_ADDR": "127.0.0.1", "ADAPTDL_MASTER_PORT": str(port),
            "ADAPTDL_NUM_RESTARTS": "0", "ADAPTDL_JOB_ID": "j"}


def _stateful_job(config):
    """Joins the job, registers a State, leaves a stray variable; reports what it found."""
    import os

    import torch.distributed as dist

    import adaptdl_core.torch as adl
    from adaptdl_core import checkpoint, context
    found = {"states": context.current().states.names(),
             "stray": os.environ.get("ADAPTDL_STRAY"), "dist": dist.is_initialized()}
    adl.init_process_group("gloo")

    class Leaky(checkpoint.State):
        def save(self, fileobj):
            fileobj.write(b"x")

        def load(self, fileobj):
            pass

    Leaky("leaky")
    os.environ["ADAPTDL_STRAY"] = "1"
    tune.report(found)


def test_recycled_worker_forgets_the_previous_job():
    """In one process: after recycle() the next run finds no State, no process group, no
    stray variable and a new trial's context; the local files of the first job are gone."""
    import os

    import torch.distributed as dist

    from adaptdl_ray.replicas import _ray_private
    from adaptdl_ray.replicas.worker import ReplicaWorker
    world = {"world_rank": 0, "world_size": 1, "local_rank": 0, "local_world_size": 1,
             "node_rank": 0}
    worker = ReplicaWorker(0, {"trial_id": "a"})
    try:
        first = worker.run(_stateful_job, {}, {}, _job_env(worker.free_port()), None, None, 1,
                           world)
        assert first["status"] == "finished", first
        assert dist.is_initialized()
        old_root = os.environ["ADAPTDL_CHECKPOINT_PATH"]
        assert worker.recycle({"trial_id": "b"}) is True
        assert not dist.is_initialized() and not os.path.exists(old_root)
        assert not [k for k in os.environ if k.startswith("ADAPTDL_")]
        assert worker.next_results(0.0) == ([], False)  # the first job's reports are gone
        second = worker.run(_stateful_job, {}, {}, _job_env(worker.free_port()), None, None,
                            1, world)
        assert second["status"] == "finished", second
        [report], ended = worker.next_results(1.0)
        assert ended  # the function returned: its end came after its report
        assert worker.next_results(5.0) == ([], True)  # and no later call waits
        assert report["metrics"] == {"states": [], "stray": None, "dist": False}
        assert tune.get_context().get_trial_id() == "b"
    finally:
        worker.recycle({})
        _ray_private.clear_replica_session()


def _allreduce_job(config):
    """Joins the job's process group, all-reduces a tensor, reports the sum."""
    import torch
    import torch.distributed as dist

    import adaptdl_core.torch as adl
    adl.init_process_group("gloo")
    value = torch.ones(4)
    dist.all_reduce(value)
    tune.report({"sum": float(value.sum())})


def test_a_survivor_rejoins_many_times_without_leaking():
    """A replica that stays through resizes leaves its process group and joins the next one
    in the same process (the gloo path of a resize that keeps survivors): eight times, each
    run ends, and the process's open files and threads do not grow after the first runs."""
    import os
    import threading

    from adaptdl_ray.replicas import _ray_private
    from adaptdl_ray.replicas.worker import ReplicaWorker
    world = {"world_rank": 0, "world_size": 1, "local_rank": 0, "local_world_size": 1,
             "node_rank": 0}
    worker = ReplicaWorker(0, {"trial_id": "a"})
    counts = []
    try:
        for i in range(8):
            env = dict(_job_env(worker.free_port()), ADAPTDL_NUM_RESTARTS=str(i))
            outcome = worker.run(_allreduce_job, {}, {}, env, None, None, 1, world)
            assert outcome["status"] == "finished", outcome
            [report], _ = worker.next_results(5.0)
            assert report["metrics"] == {"sum": 4.0}
            assert worker.recycle({"trial_id": "a"}) is True
            counts.append((len(os.listdir("/proc/self/fd")), threading.active_count()))
    finally:
        worker.recycle({})
        _ray_private.clear_replica_session()
    (fds_early, threads_early), (fds_late, threads_late) = counts[2], counts[-1]
    assert fds_late <= fds_early + 2, counts
    assert threads_late <= threads_early + 1, counts


@pytest.mark.usefixtures("ray_session")
def test_reused_actors_give_the_results_of_fresh_ones(tmp_path):
    reused = _run(tmp_path, "reused", reuse=True)
    fresh = _run(tmp_path, "fresh", reuse=False)
    assert sorted(reused) == sorted(fresh) == [1, 2]
    # The second trial ran in the first one's replica processes, the fresh ones did not.
    assert reused[1][0]["pid"] == reused[2][0]["pid"]
    assert fresh[1][0]["pid"] != fresh[2][0]["pid"]
    for seed in (1, 2):
        assert [r["epoch"] for r in reused[seed]] == [0, 1]
        assert [r["weights"] for r in reused[seed]] == [r["weights"] for r in fresh[seed]]
        assert [r["loss"] for r in reused[seed]] == [r["loss"] for r in fresh[seed]]
        # Nothing of the previous job reached the next one.
        assert all(r["inherited_states"] == [] for r in reused[seed])
        assert all(r["stray_vars"] == [] for r in reused[seed])
        assert all(r["adaptdl/restarts"] == 0 for r in reused[seed])
