"""A job the front-end reports restarting keeps its allocation (no Ray, fake clock)."""

from __future__ import annotations

import pytest

from adaptdl_core.decision import DecisionCore, JobProgress, JobSpec, NodeInfo
from adaptdl_core.policy import PolluxPolicy
from tests.fake_clock import Clock


def start_two_jobs(restarting: bool):
    """Job a runs on all 4 GPUs; job b arrives. Pollux would split the node."""
    clock = Clock(1000.0)
    core = DecisionCore(policy=PolluxPolicy(fair_share=True), clock=clock, interval_s=60.0)
    core.set_nodes({"n0": NodeInfo({"GPU": 4})})
    core.add_job("a", JobSpec({"GPU": 1}))
    core.running("a", nodes=["n0"] * 4)
    core.update("a", progress=JobProgress(remaining_s=10_000.0, restarts=1,
                                          restarting=restarting))
    clock.now += 5000
    core.add_job("b", JobSpec({"GPU": 1}))
    return core


def test_a_restarting_job_is_not_shrunk_for_a_new_one():
    core = start_two_jobs(restarting=True)
    decisions = core.decide()
    assert decisions["a"].action == "keep" and decisions["a"].replicas == 4
    assert decisions["b"].action == "wait"
    # Once it trains again, the new job gets its share.
    core.update("a", progress=JobProgress(restarting=False))
    decisions = core.decide(force=True)
    assert decisions["a"].replicas < 4 and decisions["b"].action == "start"


def test_not_restarting_is_the_default():
    decisions = start_two_jobs(restarting=False).decide()
    assert decisions["b"].action == "start"


def test_restarting_must_be_a_bool():
    core = start_two_jobs(restarting=False)
    with pytest.raises(ValueError, match="progress.restarting must be True, False or None"):
        core.update("a", progress=JobProgress(restarting="yes"))
