"""A one-replica AdaptDL trial runs its replica inside the trial actor (no second process),
and trains exactly as it does in a replica process of its own."""

from __future__ import annotations

import pytest

ray = pytest.importorskip("ray")
from ray import tune  # noqa: E402

from adaptdl_ray.tune import AdaptDLTrainableCreator  # noqa: E402
from tests.ray.trial_jobs import (SEEDED_BASE as BASE, SEEDED_CASES as CASES,  # noqa: E402
                                  ResultsBySeed, seeded_job)

pytestmark = [pytest.mark.usefixtures("ray_session"), pytest.mark.slow]


def _run(tmp_path, name, *, in_process, reuse):
    results = ResultsBySeed()
    trainable = AdaptDLTrainableCreator(seeded_job, min_replicas=1, max_replicas=1,
                                        single_replica_in_process=in_process)
    grid = tune.Tuner(
        trainable, param_space={**BASE, "case": tune.grid_search(CASES)},
        tune_config=tune.TuneConfig(reuse_actors=reuse, max_concurrent_trials=1),
        run_config=tune.RunConfig(name=name, storage_path=str(tmp_path), verbose=0,
                                  callbacks=[results])).fit()
    assert not grid.errors, grid.errors
    return results.by_seed


def test_one_replica_runs_in_the_trial_actor_and_trains_as_in_its_own_process(tmp_path):
    inside = _run(tmp_path, "inside", in_process=True, reuse=True)
    apart = _run(tmp_path, "apart", in_process=False, reuse=False)
    assert sorted(inside) == sorted(apart) == [1, 2]
    # Tune's "pid" is the trial actor's; "fn_pid" the process the function ran in.
    assert all(r["fn_pid"] == r["pid"] for rs in inside.values() for r in rs)
    assert all(r["fn_pid"] != r["pid"] for rs in apart.values() for r in rs)
    # Reuse: the second trial ran in the first one's actor, and nothing leaked into it.
    assert inside[1][0]["pid"] == inside[2][0]["pid"]
    for seed in (1, 2):
        assert [r["epoch"] for r in inside[seed]] == [0, 1]
        assert [r["weights"] for r in inside[seed]] == [r["weights"] for r in apart[seed]]
        assert [r["loss"] for r in inside[seed]] == [r["loss"] for r in apart[seed]]
        assert all(r["inherited_states"] == [] and r["stray_vars"] == []
                   for r in inside[seed])


def test_a_failure_in_the_trial_actor_names_the_replica(tmp_path):
    trainable = AdaptDLTrainableCreator(seeded_job, min_replicas=1, max_replicas=1)
    grid = tune.Tuner(
        trainable, param_space={**BASE, "case": {"seed": 1, "hidden": 3},
                                "fail_at_epoch": 1},
        run_config=tune.RunConfig(name="fails", storage_path=str(tmp_path),
                                  verbose=0)).fit()
    assert grid.num_errors == 1
    message = str(grid.errors[0])
    assert "replica 0 of 1" in message and "in the trial actor" in message
    assert "planned failure at epoch 1" in message
    # The report made before the failure reached Tune.
    assert grid[0].metrics["epoch"] == 0


def test_single_replica_in_process_must_be_a_bool():
    with pytest.raises(ValueError, match="single_replica_in_process"):
        AdaptDLTrainableCreator(seeded_job, single_replica_in_process="yes")
