"""The sweep mode of the simulator: static vs adaptive vs adaptive+ASHA on the same draws."""

from __future__ import annotations

import json

import numpy as np
import pytest

from adaptdl_core.sim.__main__ import main
from adaptdl_core.sim.sweep import AshaRule, QualityModel, run_sweep, simulate_arm

TRIALS, EPOCHS, CLUSTER_GPUS = 8, 8, 16


@pytest.fixture(scope="module")
def sweep():
    return run_sweep(trials=TRIALS, epochs=EPOCHS, seed=3)


def _by_name(arm_result):
    return {t["name"]: t for t in arm_result["trials"]}


def test_static_and_adaptive_complete_every_trial(sweep):
    for arm in ("a", "b"):
        r = sweep["arms"][arm]
        assert r["completed"] == TRIALS and r["stopped_early"] == 0
        assert all(t["status"] == "completed" and t["epochs"] == EPOCHS for t in r["trials"])
        assert r["makespan"] > 0 and r["gpu_hours"] > 0
    a = sweep["arms"]["a"]
    # The static arm: 4 GPUs at the fixed batch, one start each, never resized.
    assert {p[1] for t in a["trials"] for p in t["timeline"]} == {4}
    assert a["batch"]["min"] == a["batch"]["max"] == 2048 and a["restarts"] == 0
    assert sweep["ratio_b_a"] == pytest.approx(
        sweep["arms"]["b"]["makespan"] / a["makespan"])


def test_same_draws_give_same_qualities_in_every_arm(sweep):
    a, b, c = (_by_name(sweep["arms"][k]) for k in "abc")
    for name, trial in a.items():
        assert b[name]["metric"] == trial["metric"]
        if c[name]["status"] == "completed":
            assert c[name]["metric"] == trial["metric"]
    assert len({t["metric"] for t in a.values()}) == TRIALS  # the draws differ per trial
    assert sweep["arms"]["a"]["top5"] == sweep["arms"]["b"]["top5"]


def test_asha_stops_some_trials_early_and_keeps_a_good_one(sweep):
    a, c = sweep["arms"]["a"], sweep["arms"]["c"]
    assert c["stopped_early"] > 0 and c["completed"] >= 1
    assert c["stopped_early"] + c["completed"] == TRIALS
    stopped = [t for t in c["trials"] if t["status"] == "stopped"]
    assert all(t["epochs"] < EPOCHS for t in stopped)
    assert c["gpu_hours"] < sweep["arms"]["b"]["gpu_hours"]
    finals = sorted(t["metric"] for t in a["trials"])
    assert c["top1"] >= np.percentile(finals, 75)


def test_adaptive_never_holds_more_gpus_than_the_cluster(sweep):
    for arm in ("b", "c"):
        r = sweep["arms"][arm]
        assert 4 < r["max_gpus_held"] <= CLUSTER_GPUS
        # Rebuild the GPUs held over time from the per-trial timelines.
        changes = sorted((p[0], t["name"], p[1]) for t in r["trials"] for p in t["timeline"])
        ends = {t["name"]: t["ended"] for t in r["trials"]}
        for when, _, _ in changes:
            held = {}
            for t0, name, gpus in changes:
                if t0 <= when and ends[name] > when:
                    held[name] = gpus
            assert sum(held.values()) <= CLUSTER_GPUS


def test_asha_rule_follows_tune_semantics():
    rule = AshaRule(100, grace_period=1, reduction_factor=4)
    assert rule.rungs == (1, 4, 16, 64)
    assert rule.on_epoch("t0", 1, 0.50)        # first at the rung: continues
    assert not rule.on_epoch("t1", 1, 0.40)    # below the 75th percentile of {0.50}
    assert rule.on_epoch("t2", 1, 0.60)
    assert rule.recorded(1) == {"t0": 0.50, "t1": 0.40, "t2": 0.60}
    assert rule.on_epoch("t0", 2, 0.0)         # judged once per rung
    assert rule.on_epoch("t0", 100, 0.0)       # complete, not stopped
    assert rule.cutoff(4) is None
    with pytest.raises(ValueError, match="reduction_factor"):
        AshaRule(100, reduction_factor=1)
    with pytest.raises(ValueError, match="grace_period"):
        AshaRule(10, grace_period=11)


def test_quality_model_is_seeded_and_follows_the_reference():
    ref = [0.4, 0.6, 0.9]
    q1, q2 = QualityModel(ref, 5, seed=7), QualityModel(ref, 5, seed=7)
    assert [q1.metric(i, 3) for i in range(5)] == [q2.metric(i, 3) for i in range(5)]
    assert (q1.offsets <= 0).all()
    flat = QualityModel(ref, 2, seed=7, offset_sd=0.0, noise_sd=0.0)
    assert [flat.metric(1, e) for e in (1, 2, 3)] == ref
    with pytest.raises(IndexError):
        q1.metric(0, 4)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="arm must be one of"):
        simulate_arm("d", trials=1, epochs=1)
    with pytest.raises(ValueError, match="gpus_per_trial"):
        simulate_arm("a", trials=1, epochs=1, gpus_per_trial=32)
    with pytest.raises(ValueError, match="static_batch"):
        simulate_arm("a", trials=1, epochs=1, static_batch=64)


def test_cli_writes_the_json(tmp_path, capsys):
    out = tmp_path / "sweep.json"
    assert main(["sweep", "--trials", "3", "--epochs", "2", "--arms", "a,b",
                 "--no-share-profiles", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert set(result["arms"]) == {"a", "b"} and result["arms"]["b"]["completed"] == 3
    assert result["arms"]["b"]["settings"]["share_profiles"] is False
    assert "makespan (b)/(a)" in capsys.readouterr().out
    assert main(["sweep", "--arms", "x"]) == 2


def test_shared_profiles_let_a_new_trial_start_wide():
    # Without sharing every adaptive trial starts on one GPU (the exploration cap of a job
    # never profiled); with the core's profile group (the default) a later trial starts
    # from an earlier trial's profile.
    kw = dict(trials=2, concurrent=1, epochs=6)
    alone = simulate_arm("b", share_profiles=False, **kw)
    assert [t["timeline"][0][1] for t in alone["trials"]] == [1, 1]
    r = simulate_arm("b", **kw)
    first, second = r["trials"]
    assert first["timeline"][0][1] == 1 and second["timeline"][0][1] > 1
    assert second["restarts"] < alone["trials"][1]["restarts"]
    assert r["settings"]["share_profiles"] is True


def test_makespan_bounds_bound_the_simulated_arms(sweep):
    from adaptdl_core.sim.sweep import makespan_bounds

    bounds = makespan_bounds(trials=TRIALS, epochs=EPOCHS)
    a, b = sweep["arms"]["a"], sweep["arms"]["b"]
    assert bounds["lower_bound"] <= bounds["fair_share"] < bounds["static"]
    # The static estimate is arm (a) without its 5-s ticks.
    assert bounds["static"] == pytest.approx(a["makespan"], rel=0.03)
    assert bounds["lower_bound"] <= b["makespan"]
    assert bounds["lower_bound_ratio"] == pytest.approx(
        bounds["lower_bound"] / bounds["static"])
    assert len(bounds["gpus_by_epoch"]) == EPOCHS
    with pytest.raises(ValueError, match="gpus_per_trial"):
        makespan_bounds(gpus_per_trial=17)
