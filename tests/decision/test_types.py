"""Accelerator types in the decision core: per-type hints, their bootstrap for types a job
has not run on, and moves between types as resizes."""

from __future__ import annotations

import pytest

from adaptdl_core.decision import DecisionCore, JobProgress, JobSpec, NodeInfo
from adaptdl_core.decision.type_models import (TypeSpeeds, compute_speed, project_hints,
                                               type_speed_prior, typed_hints,
                                               typed_speedups)
from adaptdl_core.policy import RemainingWorkPolicy
from tests.fake_clock import Clock

# A model that scales well, profiled on 4 replicas of one node.
FIT = {"init_batch_size": 64, "max_batch_size": 2048,
       "perf_params": {"alpha_c": 0.02, "beta_c": 0.002, "alpha_n": 0.01, "beta_n": 0.0001,
                       "alpha_r": 0.005, "beta_r": 0.00005, "gamma": 1.5},
       "grad_params": {"sqr": 1.0, "var": 200.0}, "local_bsz_bounds": [16, 512],
       "gradient_accumulation": True, "max_profiled_replicas": 4, "max_profiled_nodes": 1}


def faster(hints, ratio, **extra):
    return dict(project_hints(hints, ratio), **extra)


def test_typed_hints_measured_then_borrowed_then_projected_then_unknown():
    speeds = TypeSpeeds({"g": {"t4": FIT, "a100": faster(FIT, 4.0)}})
    assert speeds.ratio("t4", "a100", 64) == pytest.approx(4.0)
    assert speeds.learnt("t4", "a100", 64) and not speeds.learnt("t4", "h100", 64)
    latest = dict(FIT, grad_params={"sqr": 1.0, "var": 900.0})
    own = {"t4": FIT}
    group = {"rtx": faster(FIT, 2.0, max_profiled_replicas=8)}
    out = typed_hints(["t4", "rtx", "a100", "h100"], own, group, latest, speeds)
    # Measured: its own fit, with its newest gradient statistics.
    assert out["t4"]["perf_params"] == FIT["perf_params"]
    assert out["t4"]["grad_params"] == latest["grad_params"]
    # Borrowed from its group on rtx, extent included.
    assert out["rtx"]["perf_params"] == group["rtx"]["perf_params"]
    assert out["rtx"]["max_profiled_replicas"] == 8
    # Projected from its own t4 fit by the learnt ratio (4x), and to an H100 by the
    # published specs (no group has run there).
    assert compute_speed(out["a100"], 64) == pytest.approx(4.0 * compute_speed(FIT, 64))
    prior = type_speed_prior("h100") / type_speed_prior("t4")
    assert compute_speed(out["h100"], 64) == pytest.approx(prior * compute_speed(FIT, 64))
    assert out["a100"]["max_profiled_replicas"] == 4
    # Nothing measured anywhere: unknown.
    assert typed_hints(["t4"], {}, {}, None, speeds) == {"t4": None}
    # A fit of no known type stands for the job on every type, unscaled.
    blind = typed_hints(["t4", "a100"], {}, {}, FIT, speeds)
    assert blind["t4"]["perf_params"] == blind["a100"]["perf_params"] == FIT["perf_params"]


def test_spec_prior_orders_common_accelerators_and_knows_ray_names():
    t4, l4, a100, h100 = (type_speed_prior(n) for n in ("T4", "L4", "A100", "H100"))
    assert t4 == pytest.approx(1.0) and t4 < l4 < a100 < h100
    assert type_speed_prior("A100-40G") == a100 and type_speed_prior("mystery-9") is None


def test_typed_speedups_share_one_unit_and_respect_exploration():
    speeds = TypeSpeeds({})
    hints = {"t4": FIT, "a100": faster(FIT, 3.0), "k80": None}
    fns = typed_speedups(hints, speeds, factor=2)
    one_t4 = float(fns["t4"](1, 1))
    assert float(fns["a100"](1, 1)) == pytest.approx(3.0 * one_t4, rel=0.15)
    # Profiled at 4 replicas: flat beyond 8 (factor 2).
    assert float(fns["t4"](2, 16)) == pytest.approx(float(fns["t4"](2, 8)))
    assert float(fns["t4"](2, 8)) > float(fns["t4"](2, 4))
    # No fit on k80: one replica, scaled by the spec ratio to the unit's type.
    assert fns["k80"].cap == 1
    assert float(fns["k80"](1, 1)) == pytest.approx(
        type_speed_prior("k80") / type_speed_prior("t4"))


def typed_core():
    clock = Clock(1000.0)
    core = DecisionCore(policy=RemainingWorkPolicy(), clock=clock, interval_s=60.0)
    core.set_nodes({"t4-0": NodeInfo({"GPU": 4}, accelerator_type="t4"),
                    "a100-0": NodeInfo({"GPU": 4}, accelerator_type="a100")})
    return core, clock


def test_core_keeps_hints_per_type_and_models_every_type():
    core, clock = typed_core()
    core.add_job("j", JobSpec({"GPU": 1}, profile_group="m"))
    core.running("j", nodes=["t4-0"] * 4)
    core.update("j", hints=FIT, progress=JobProgress(remaining_s=50_000.0))
    assert set(core.record("j").hints_by_type) == {"t4"}
    # Hints naming their type go to it, whatever the placement.
    core.update("j", hints=dict(faster(FIT, 4.0), accelerator_type="a100"))
    assert set(core.record("j").hints_by_type) == {"t4", "a100"}
    request = core.begin_solve()
    request.run()
    info = request.infos["j"]
    assert set(info.type_speedups) == {"t4", "a100"}
    assert float(info.type_speedups["a100"](1, 4)) > 3.0 * float(info.type_speedups["t4"](1, 4))
    core.finish_solve(request)
    # It runs on t4 and the a100 node is idle: once old enough that a restart costs it
    # little, the policy moves it there, and with long training left the move pays.
    clock.now += 100_000
    d = core.decide(force=True)["j"]
    assert d.action == "resize" and {n for n in d.nodes} == {"a100-0"}
    assert "moving saves" in d.reason
    # The decision names the type chosen: the front-end places the replicas on it.
    assert d.accelerator_type == "a100"


def test_core_holds_a_move_that_does_not_pay():
    core, clock = typed_core()
    core.add_job("j", JobSpec({"GPU": 1}))
    core.running("j", nodes=["t4-0"] * 4)
    core.update("j", hints=dict(faster(FIT, 1.3), accelerator_type="a100"))
    core.update("j", hints=dict(FIT, accelerator_type="t4"),
                progress=JobProgress(remaining_s=100.0, restarts=1))
    clock.now += 100_000
    d = core.decide(force=True)["j"]
    # The policy wants it on the idle, 1.3x faster a100 node; with 100 s left the move
    # saves 100 * (1 - 1/1.3) = 23 s, less than a resize (the 30 s prior).
    assert set(core.record("j").nodes) == {"a100-0"}
    assert d.action == "hold" and set(d.nodes) == {"t4-0"}
    assert "not more than the resize cost" in d.reason
    assert d.accelerator_type == "t4"  # (where it stays)


def test_placement_type_is_the_one_type_of_a_mixed_clusters_nodes():
    from adaptdl_core.policy import placement_type
    mixed = {"t": NodeInfo({"GPU": 4}, accelerator_type="t4"),
             "a": NodeInfo({"GPU": 4}, accelerator_type="a100"),
             "cpu": NodeInfo({"CPU": 8})}
    assert placement_type(mixed, ["a", "a"]) == "a100"
    assert placement_type(mixed, ["t"]) == "t4"
    # Several types, a node of no type, an unknown node, nothing: no type to ask for.
    for placement in (["t", "a"], ["cpu"], ["gone"], []):
        assert placement_type(mixed, placement) is None
    # A cluster of one type (or none) needs no type in the replicas' bundles.
    one = {"t": mixed["t"], "cpu": mixed["cpu"]}
    assert placement_type(one, ["t"]) is None


def test_decisions_carry_no_type_on_a_cluster_of_one_type():
    core = DecisionCore(clock=Clock(1000.0))
    core.set_nodes({"n": NodeInfo({"GPU": 4}, accelerator_type="t4")})
    core.add_job("j", JobSpec({"GPU": 1}))
    d = core.decide(force=True)["j"]
    assert d.action == "start" and d.accelerator_type is None


def test_a_start_on_a_mixed_cluster_names_its_type():
    core, _ = typed_core()
    core.add_job("j", JobSpec({"GPU": 1}))
    d = core.decide(force=True)["j"]
    assert d.action == "start" and d.accelerator_type in ("t4", "a100")
    assert {core.nodes[n].accelerator_type for n in d.nodes} == {d.accelerator_type}


def test_exploring_params_free_the_intra_node_sync_of_a_one_replica_fit_only():
    from adaptdl_core.decision.jobs import exploring_params
    from adaptdl_core.goodput import PerfParams
    fit = PerfParams(0.1, 0.01, 0.3, 0.02, 0.2, 0.01, 1.5)
    assert exploring_params(fit, 2) is fit
    free = exploring_params(fit, 1)
    assert (free.alpha_r, free.beta_r) == (0.0, 0.0)
    assert free == PerfParams(0.1, 0.01, 0.3, 0.02, 0.0, 0.0, 1.5)
