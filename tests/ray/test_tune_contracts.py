"""AdaptDL trials keep Ray Tune's contracts, checked through Tune's public API only.

Each test runs a real (local) Tune experiment of ``tests/ray/trial_jobs.contract_job``:
checkpoints come back as the user reported them, failures retry from the latest state,
results are well-formed, Tune's wrappers work, and a searcher keeps its feedback. (An
interrupted driver resuming exactly where it stopped: ``test_interrupt_points.py``.)
"""

from __future__ import annotations

import os

import pytest

ray = pytest.importorskip("ray")
import torch  # noqa: E402
from ray import tune  # noqa: E402

from adaptdl_ray.tune import (AdaptDLScheduler, AdaptDLTrainableCreator,  # noqa: E402
                              model_state_dict)
from tests.exactly_once import assert_exactly_once  # noqa: E402
from tests.ray.interrupt_scenario import csv_rows, records  # noqa: E402
from tests.ray.trial_jobs import contract_job  # noqa: E402

pytestmark = [pytest.mark.usefixtures("ray_session"), pytest.mark.slow]


def weights_of(state_dict):
    return [v.item() for t in state_dict.values() for v in t.flatten()]


def cases(tmp_path, **variants):
    """A grid over trials, each with its own record directory: ``name -> dict``."""
    out = []
    for name, extra in variants.items():
        d = tmp_path / name
        d.mkdir()
        out.append({"record_dir": str(d), "name": name, **extra})
    return tune.grid_search(out)


BASE = {"epochs": 3, "size": 48, "batch_size": 8, "sleep": 0.02}


def test_checkpoints_are_the_users_and_periodic_ones_do_not_relaunch(tmp_path):
    """User checkpoints come back through result.checkpoint / best_checkpoints /
    get_best_result; without one, the final model is one call away; checkpoint_frequency
    and the in-place saves never relaunch the replicas; the replicas' context is right."""
    trainable = AdaptDLTrainableCreator(contract_job, min_replicas=2, max_replicas=2)
    tuner = tune.Tuner(
        trainable,
        param_space={**BASE, "case": cases(tmp_path, user={"user_checkpoint": True},
                                           plain={"user_checkpoint": False})},
        tune_config=tune.TuneConfig(scheduler=AdaptDLScheduler(), metric="neg_loss",
                                    mode="max"),
        run_config=tune.RunConfig(
            storage_path=str(tmp_path / "results"), verbose=0,
            checkpoint_config=tune.CheckpointConfig(
                num_to_keep=2, checkpoint_score_attribute="neg_loss",
                checkpoint_score_order="max", checkpoint_frequency=2)))
    grid = tuner.fit()
    assert grid.num_errors == 0
    by_case = {r.config["case"]["name"]: r for r in grid}
    for name, result in by_case.items():
        events = records(tmp_path / name)
        assert_exactly_once(events, BASE["size"], BASE["epochs"])
        rows = csv_rows(result.path)
        assert [r["report_key"] for r in rows] == [f"{e}:end" for e in range(BASE["epochs"])]
        assert {r["adaptdl/restarts"] for r in rows} == {"0"}, "a checkpoint relaunched"
        assert all(float(r["time_this_iter_s"]) > 0 for r in rows)
        assert float(rows[-1]["time_total_s"]) == pytest.approx(
            sum(float(r["time_this_iter_s"]) for r in rows), rel=1e-6)
        final = result.metrics["weights"]
        # One call gives the final weights of the AdaptiveDataParallel model.
        assert weights_of(model_state_dict(result.checkpoint)) == final
        # tune.get_context() in both replicas.
        starts = sorted((e for e in events if e["event"] == "start"),
                        key=lambda e: e["world_rank"])
        assert [(e["world_rank"], e["world_size"], e["local_rank"], e["local_world_size"],
                 e["node_rank"]) for e in starts] == [(0, 2, 0, 2, 0), (1, 2, 1, 2, 0)]
        trial_dirs = {e["trial_dir"] for e in starts}
        assert {e["trial_id"] for e in starts} == {result.metrics["trial_id"]}
        assert len(trial_dirs) == 1 and os.path.basename(trial_dirs.pop()) == \
            os.path.basename(result.path)
        assert all(e["trial_name"] and e["trial_name"] in result.path for e in starts)
    user = by_case["user"]
    with user.checkpoint.as_directory() as d:
        saved = torch.load(os.path.join(d, "model.pt"), weights_only=True)
        assert os.path.isdir(os.path.join(d, ".adaptdl"))
    assert weights_of(saved) == user.metrics["weights"]
    assert 1 <= len(user.best_checkpoints) <= 2  # num_to_keep
    for checkpoint, metrics in user.best_checkpoints:
        with checkpoint.as_directory() as d:
            assert os.path.exists(os.path.join(d, "model.pt"))
    best = grid.get_best_result(metric="neg_loss", mode="max", scope="all")
    with best.checkpoint.as_directory() as d:
        assert os.listdir(d)
    with by_case["plain"].checkpoint.as_directory() as d:
        assert not os.path.exists(os.path.join(d, "model.pt"))


def test_failures_retry_from_the_latest_state_and_keep_every_report(tmp_path):
    """max_failures=2: a replica that raises and a replica process that dies are retried
    from the latest checkpoint; the driver lives, every epoch is reported once."""
    trainable = AdaptDLTrainableCreator(contract_job, min_replicas=2, max_replicas=2)
    tuner = tune.Tuner(
        trainable,
        param_space={**BASE, "sleep": 0.05,
                     "case": cases(tmp_path, raises={"fail_at": [1, 2]},
                                   dies={"exit_at": [1, 2]})},
        tune_config=tune.TuneConfig(scheduler=AdaptDLScheduler()),
        run_config=tune.RunConfig(
            storage_path=str(tmp_path / "results"), verbose=0,
            failure_config=tune.FailureConfig(max_failures=2),
            checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=1)))
    grid = tuner.fit()
    assert grid.num_errors == 0
    for result in grid:
        rows = csv_rows(result.path)
        keys = [r["report_key"] for r in rows]
        # Every epoch reported, in order; as with any Tune trial, a retry repeats the
        # reports made after the checkpoint it restarts from.
        assert sorted(set(keys)) == [f"{e}:end" for e in range(BASE["epochs"])], keys
        assert keys == sorted(keys), keys
        assert rows[-1]["adaptdl/restarts"] == "1"  # one retry, from the checkpoint
        assert os.path.exists(os.path.join(result.config["case"]["record_dir"],
                                           "failed-once"))


@pytest.mark.parametrize("dead_rank", [1, 0])
def test_a_failure_without_retries_names_the_replica_that_failed(tmp_path, dead_rank):
    """The trial's error blames the replica whose process died (rank 1: not the survivor's
    connection error; rank 0: not Ray's bare ActorDiedError)."""
    trainable = AdaptDLTrainableCreator(contract_job, min_replicas=2, max_replicas=2)
    grid = tune.Tuner(
        trainable, param_space={**BASE, "case": cases(tmp_path, dies={
            "exit_at": [0, 2], "after_checkpoint": False, "exit_rank": dead_rank})},
        tune_config=tune.TuneConfig(scheduler=AdaptDLScheduler()),
        run_config=tune.RunConfig(storage_path=str(tmp_path / "results"), verbose=0)).fit()
    assert grid.num_errors == 1
    error = str(grid.errors[0])
    assert f"replica {dead_rank} of 2" in error and "died" in error, error


@pytest.mark.parametrize("order", ["creator_inside", "creator_outside"])
def test_with_parameters_passes_objects_in_both_orders(tmp_path, order):
    big = list(range(1000))

    def job(config, data=None):
        import adaptdl_core.torch as adl
        adl.init_process_group("gloo")
        tune.report({"n": len(data), "last": data[-1]})

    if order == "creator_inside":
        trainable = tune.with_parameters(AdaptDLTrainableCreator(job), data=big)
    else:
        trainable = AdaptDLTrainableCreator(tune.with_parameters(job, data=big))
    result = tune.Tuner(trainable, tune_config=tune.TuneConfig(scheduler=AdaptDLScheduler()),
                        run_config=tune.RunConfig(storage_path=str(tmp_path), verbose=0)
                        ).fit()[0]
    assert result.error is None, result.error
    assert (result.metrics["n"], result.metrics["last"]) == (1000, 999)


def test_a_searcher_is_not_asked_for_more_trials_than_under_fifo(tmp_path):
    """HyperOpt with no explicit concurrency limit: when the first result arrives, only a
    few trials exist (under FIFO 2 of 20), so TPE learns from the results."""
    from ray.tune.search.hyperopt import HyperOptSearch

    seen = []

    class FirstResult(tune.Callback):
        def on_trial_result(self, iteration, trials, trial, result, **info):
            if not seen:
                seen.append(len(trials))

    class StopAtFirstResult(tune.Stopper):
        def __call__(self, trial_id, result):
            return False

        def stop_all(self):
            return bool(seen)

    d = tmp_path / "rec"
    d.mkdir()
    tune.Tuner(
        AdaptDLTrainableCreator(contract_job),
        param_space={**BASE, "epochs": 1, "record_dir": str(d),
                     "sleep": tune.uniform(0.0, 0.01)},
        tune_config=tune.TuneConfig(scheduler=AdaptDLScheduler(), num_samples=16,
                                    search_alg=HyperOptSearch(random_state_seed=0),
                                    metric="neg_loss", mode="max"),
        run_config=tune.RunConfig(storage_path=str(tmp_path / "results"), verbose=0,
                                  stop=StopAtFirstResult(), callbacks=[FirstResult()])).fit()
    assert seen and seen[0] <= 4, seen
    print(f"trials created when the first result arrived: {seen[0]} of 16")
