"""The resize cost estimate: from measured resizes of the job and its profile group."""

from __future__ import annotations

import pytest

from adaptdl_core.decision import DecisionCore, JobProgress, JobSpec, NodeInfo
from adaptdl_core.decision.resize_cost import CostSample, estimate_resize_cost
from tests.decision.stubs import CountingPolicy


def test_before_any_resize_the_prior_raised_to_the_longest_start_up():
    assert estimate_resize_cost([], prior_s=30.0).seconds == 30.0
    quick = estimate_resize_cost([], launches_s=[3.4], prior_s=30.0)
    assert quick.seconds == 30.0 and "prior" in quick.basis
    slow = estimate_resize_cost([], launches_s=[3.4, 44.0], prior_s=30.0)
    assert slow.seconds == 44.0 and "start-up" in slow.basis


def test_the_median_of_the_latest_resizes_to_the_same_size_follows_the_load():
    quiet = [CostSample(t, 2, 10.0, True) for t in (1, 2, 3)]
    assert estimate_resize_cost(quiet, target=2, prior_s=30).seconds == 10.0
    # The machine got busy: the two latest resizes took 28 s; the estimate follows.
    busy = quiet + [CostSample(4, 2, 28.0, True), CostSample(5, 2, 29.0, True)]
    assert estimate_resize_cost(busy, target=2, prior_s=30).seconds == 28.0
    # One outlier among the latest does not decide it.
    spike = quiet + [CostSample(4, 2, 90.0, True)]
    assert estimate_resize_cost(spike, target=2, prior_s=30).seconds == 10.0


def test_resizes_to_the_same_size_come_first_then_any_size():
    samples = [CostSample(1, 2, 20.0, True), CostSample(2, 1, 6.0, True)]
    assert estimate_resize_cost(samples, target=1, prior_s=30).seconds == 6.0
    assert estimate_resize_cost(samples, target=2, prior_s=30).seconds == 20.0
    other = estimate_resize_cost(samples, target=4, prior_s=30)
    assert other.seconds == 13.0 and "any size" in other.basis


def test_the_basis_says_whose_resizes_it_rests_on():
    own, group = CostSample(1, 2, 9.0, True), CostSample(2, 2, 11.0, False)
    assert "(this job)" in estimate_resize_cost([own], target=2, prior_s=30).basis
    assert "(its profile group)" in estimate_resize_cost([group], target=2, prior_s=30).basis
    both = estimate_resize_cost([own, group], target=2, prior_s=30)
    assert both.seconds == 10.0 and "this job and its profile group" in both.basis


@pytest.mark.parametrize("kwargs, name", [
    ({"prior_s": float("nan")}, "prior_s"), ({"prior_s": 1, "recent": 0}, "recent"),
    ({"prior_s": 1, "launches_s": [-1.0]}, "measured seconds")])
def test_bad_input_is_named(kwargs, name):
    with pytest.raises(ValueError, match=name):
        estimate_resize_cost([], **kwargs)


def _core(group_of):
    now = [1000.0]
    core = DecisionCore(policy=CountingPolicy(), clock=lambda: now[0], interval_s=30.0)
    core.set_nodes({"n0": NodeInfo({"GPU": 4})})
    for job_id, group in group_of.items():
        core.add_job(job_id, JobSpec({"GPU": 1}, profile_group=group))
        core.running(job_id, replicas=1)
    return core, now


def test_a_trial_predicts_with_its_profile_groups_measured_resizes():
    core, now = _core({"a": "sweep", "b": "sweep", "c": "other"})
    core.begin_resize("a", to=2)
    core.update("a", progress=JobProgress(restarts=1, resize_cost_s=17.0))
    assert core.resize_cost("a", 2) == 17.0
    b = core.resize_cost_estimate("b", 2)
    assert b.seconds == 17.0 and "profile group" in b.basis
    assert core.resize_cost("c", 2) == 30.0  # another group: nothing measured there
    # b's own resize is measured too: the median of both, and the log holds both figures.
    now[0] += 10
    core.begin_resize("b", to=2)
    entry = core.state.jobs["b"].resize_log[-1]
    assert entry["cost_s"] == 17.0 and "profile group" in entry["cost_basis"]
    core.update("b", progress=JobProgress(restarts=1, resize_cost_s=25.0))
    assert (entry["cost_s"], entry["measured_s"]) == (17.0, 25.0)
    assert core.resize_cost("a", 2) == 21.0 == core.resize_cost("b", 2)


def test_the_prior_before_any_measurement_is_the_cores_setting():
    from adaptdl_core.decision import DecisionCore, JobSpec, NodeInfo
    core = DecisionCore(clock=lambda: 0.0, resize_cost_prior_s=4.0)
    core.set_nodes({"n0": NodeInfo({"CPU": 4})})
    core.add_job("a", JobSpec({"CPU": 1}))
    assert core.resize_cost("a") == 4.0
    with pytest.raises(ValueError, match="resize_cost_prior_s"):
        DecisionCore(resize_cost_prior_s=0)
