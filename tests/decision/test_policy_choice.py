"""The decision core's policy argument by name, the remaining-time estimate it is fed, and
that the estimate reaches the policy."""

from __future__ import annotations

import pytest

from adaptdl_core.decision import (DecisionCore, JobProgress, JobSpec, NodeInfo,
                                   estimate_remaining_s)
from adaptdl_core.policy import PolluxPolicy, RemainingWorkPolicy

GPU = JobSpec({"GPU": 1})


def test_estimate_from_history():
    assert estimate_remaining_s(2, 10, 600.0) == pytest.approx(2400.0)  # 300 s per epoch
    assert estimate_remaining_s(10, 10, 600.0) == 0.0
    assert estimate_remaining_s(12, 10, 600.0) == 0.0   # past the plan: nothing left
    assert estimate_remaining_s(0.5, 2, 100.0) == pytest.approx(300.0)
    for bad in [(0, 10, 600.0), (2, 0, 600.0), (-1, 10, 5.0), (2, 10, float("nan")),
                (2, 10, -1.0), (True, 10, 5.0), ("2", 10, 5.0)]:
        assert estimate_remaining_s(*bad) is None, bad


def test_policy_by_name():
    assert isinstance(DecisionCore(policy="adaptdl").policy, RemainingWorkPolicy)
    pollux = DecisionCore(policy="pollux").policy
    assert isinstance(pollux, PolluxPolicy) and pollux.fair_share
    assert type(DecisionCore().policy) is PolluxPolicy
    with pytest.raises(ValueError, match="pollux, adaptdl"):
        DecisionCore(policy="fifo")


class Recording(PolluxPolicy):
    """Pollux that remembers the jobs of its last solve."""

    def __init__(self):
        super().__init__(fair_share=True)
        self.seen = {}

    def allocate(self, jobs, nodes, base_allocations=None, *, now=None):
        self.seen = dict(jobs)
        return super().allocate(jobs, nodes, base_allocations, now=now)


def test_the_reported_estimate_reaches_the_policy():
    clock = [0.0]
    policy = Recording()
    core = DecisionCore(policy=policy, clock=lambda: clock[0])
    core.set_nodes({"n0": NodeInfo({"GPU": 4})})
    core.add_job("a", GPU)
    core.add_job("b", GPU)
    core.update("a", progress=JobProgress(remaining_s=estimate_remaining_s(1, 4, 300.0)))
    core.decide()
    assert policy.seen["a"].remaining_s == pytest.approx(900.0)
    assert policy.seen["b"].remaining_s is None


def test_adaptdl_through_the_core_favours_the_job_nearly_done():
    clock = [0.0]
    core = DecisionCore(policy="adaptdl", clock=lambda: clock[0])
    core.set_nodes({"n0": NodeInfo({"GPU": 8})})
    hints = {"init_batch_size": 32, "max_profiled_replicas": 8, "max_profiled_nodes": 1}
    for name, left in (("near", 60.0), ("far", 36_000.0)):
        core.add_job(name, GPU)
        core.update(name, hints=hints, progress=JobProgress(remaining_s=left))
    d = core.decide()
    assert d["near"].replicas > d["far"].replicas >= 1
    assert d["near"].replicas + d["far"].replicas == 8


class Exploring(Recording):
    """A policy that asks for a wider exploration bound than Pollux's."""

    exploration_factor = 4


@pytest.mark.parametrize("policy, cap", [(Recording(), 2), (Exploring(), 4),
                                         (RemainingWorkPolicy(), 4),
                                         (RemainingWorkPolicy(exploration_factor=8), 8)])
def test_the_policys_exploration_factor_bounds_a_profiled_jobs_growth(policy, cap):
    # Profiled at one replica on a 16-GPU node: Pollux's bound is 2, the policy's own
    # factor widens it; the job's current size and the cluster still bound it.
    core = DecisionCore(policy=policy, clock=lambda: 0.0)
    core.set_nodes({"n0": NodeInfo({"GPU": 16})})
    core.add_job("a", GPU)
    core.update("a", hints={"init_batch_size": 32, "max_profiled_replicas": 1,
                            "max_profiled_nodes": 1})
    request = core.begin_solve()
    assert request.job_infos()["a"].max_replicas == cap


def test_exploration_cap_checks_its_factor():
    from adaptdl_core.decision import EXPLORATION_FACTOR, exploration_cap
    hints = {"max_profiled_replicas": 3}
    assert EXPLORATION_FACTOR == 2
    assert exploration_cap(hints) == 6 and exploration_cap(hints, 4) == 12
    assert exploration_cap(None, 4) == 1 and exploration_cap({}, 8) == 1
    for bad in (1, 0, 2.5, "4", True):
        with pytest.raises(ValueError, match="exploration_factor"):
            exploration_cap(hints, bad)
    with pytest.raises(ValueError, match="exploration_factor"):
        RemainingWorkPolicy(exploration_factor=1)
    assert RemainingWorkPolicy(exploration_factor=4.0).exploration_factor == 4
