"""CoreDriver: when and where a front-end's decision core solves, and its state on disk."""

from __future__ import annotations

import json
import os
import threading

import pytest

from adaptdl_core.decision import CoreDriver, CoreState, DecisionCore, JobSpec, NodeInfo
from adaptdl_core.decision import SolveRequest, speedup_from_hints
from tests.decision.stubs import CountingPolicy
from tests.decision.test_core import GOOD_4
from tests.fake_clock import Clock

GPU = JobSpec({"GPU": 1})


def make(**kwargs):
    clock, policy = Clock(1000.0), CountingPolicy()
    core = DecisionCore(policy=policy, clock=clock, interval_s=60.0)
    core.set_nodes({"n0": NodeInfo({"GPU": 4})})
    return CoreDriver(core, **kwargs), clock, policy


def test_a_due_solve_runs_after_prepare_and_is_applied_and_written(tmp_path):
    driver, clock, policy = make(solve_wait_s=None, state_dir=str(tmp_path))
    prepared = []
    driver.core.add_job("a", GPU)
    assert driver.step(lambda: prepared.append(clock.now)) is True
    assert prepared == [clock.now] and policy.calls == 1
    assert driver.core.decision_for("a").action == "start"
    saved = CoreState.load(str(tmp_path))
    assert saved.jobs["a"].target == 1 and saved.num_allocations == 1
    # Not due: no prepare, no solve, no write.
    writes = driver.writer.writes
    assert driver.step(lambda: prepared.append("again")) is False
    assert prepared == [clock.now] and policy.calls == 1 and driver.writer.writes == writes
    clock.now += 61  # the interval passed
    assert driver.step() is True and policy.calls == 2


class HeldPolicy(CountingPolicy):
    """A policy whose solves wait until ``release`` is set (at most 10 s)."""

    def __init__(self):
        super().__init__()
        self.release = threading.Event()

    def allocate(self, *args, **kwargs):
        self.release.wait(10)
        return super().allocate(*args, **kwargs)


def held_driver(**core_options):
    """A driver that waits 0.01 s for its solves, over a core whose policy is held."""
    policy = HeldPolicy()
    core = DecisionCore(policy=policy, clock=Clock(1000.0), interval_s=60.0, **core_options)
    core.set_nodes({"n0": NodeInfo({"GPU": 4})})
    return CoreDriver(core, solve_wait_s=0.01), core, policy


def test_a_slow_solve_is_applied_at_a_later_step():
    driver, core, policy = held_driver()
    release = policy.release
    core.add_job("a", GPU)
    assert driver.step() is False and driver.solving
    assert core.decision_for("a").action == "wait"  # the standing decision meanwhile
    assert driver.step() is False  # one solve at a time
    release.set()
    assert driver.collect(None) is True and not driver.solving
    assert core.decision_for("a").action == "start"
    # Solves are slower than the wait now: the next step does not wait at all.
    assert driver.last_solve_s > driver.solve_wait_s


def test_solve_now_applies_the_solve_in_flight_then_solves_whatever_the_limits():
    driver, core, policy = held_driver(min_event_gap_s=5.0)
    core.add_job("a", GPU)
    assert driver.step() is False and driver.solving
    core.add_job("b", GPU)  # (an event inside the core's gap: no solve would be due)
    assert not core.due()
    threading.Timer(0.2, policy.release.set).start()
    # Waits for the solve in flight (one at a time), then solves with "b" in this thread.
    assert driver.solve_now() is True and not driver.solving
    assert policy.calls == 2 and core.state.num_allocations == 2
    assert core.decision_for("b").action == "start"


def test_a_solver_elsewhere_fills_the_request_and_a_failed_solve_keeps_targets(caplog):
    seen = []

    def elsewhere(request: SolveRequest) -> None:
        plain = request.to_plain()
        seen.append(plain)
        request.accept({job_id: ["n0"] * 3 for job_id in plain["jobs"]})

    driver, clock, policy = make(solve_wait_s=None, solver=elsewhere)
    driver.core.add_job("a", GPU)
    driver.step()
    assert policy.calls == 0 and list(seen[0]["jobs"]) == ["a"]
    job = seen[0]["jobs"]["a"]
    assert job["spec"] == GPU.to_dict() and job["current"] == 0 and job["base"] == []
    json.dumps(seen[0])  # plain data
    assert driver.core.decision_for("a").replicas == 3

    def broken(request):
        request.error = ValueError("policy rejected its input")

    driver.solver = broken
    clock.now += 61
    assert driver.step() is False
    assert "the allocation failed" in caplog.text
    assert driver.core.state.jobs["a"].target == 3


def test_plain_requests_solve_as_local_ones():
    driver, clock, policy = make(solve_wait_s=None)
    core = driver.core
    core.set_nodes({"n0": NodeInfo({"GPU": 4}), "n1": NodeInfo({"GPU": 4})})
    for name in ("a", "b", "c"):
        core.add_job(name, GPU)
        core.update(name, hints=GOOD_4)
    local = core.begin_solve()
    local.run()
    plain = SolveRequest.from_plain(local.now, core.nodes, local.to_plain()["jobs"],
                                    CountingPolicy(),
                                    lambda key, hints: speedup_from_hints(hints))
    plain.run()
    assert {k: len(v) for k, v in plain.result.allocations.items()} == \
        {k: len(v) for k, v in local.result.allocations.items()}


def test_ordinary_changes_are_written_at_most_every_save_interval(tmp_path):
    now = [0.0]
    driver, clock, policy = make(solve_wait_s=None, state_dir=str(tmp_path),
                                 save_interval_s=5.0, monotonic=lambda: now[0])
    driver.save_soon()
    assert driver.writer.writes == 1
    now[0] = 1.0
    driver.save_soon()
    driver.save_if_due()
    assert driver.writer.writes == 1
    now[0] = 6.0
    driver.save_if_due()
    assert driver.writer.writes == 2
    assert os.path.exists(tmp_path / CoreState.FILE)


def test_bad_arguments_are_named():
    core = DecisionCore(clock=Clock(1000.0))
    with pytest.raises(TypeError, match="core must be a DecisionCore"):
        CoreDriver("core")
    with pytest.raises(ValueError, match="solve_wait_s"):
        CoreDriver(core, solve_wait_s=-1)
    with pytest.raises(ValueError, match="save_interval_s"):
        CoreDriver(core, save_interval_s=float("nan"))
    with pytest.raises(TypeError, match="solver must be a function"):
        CoreDriver(core, solver="allocator")


def test_decide_answers_as_the_core_does():
    """The driver's decide (synchronous) gives the decisions the core's own decide gives."""
    driver, clock, policy = make(solve_wait_s=None)
    plain = DecisionCore(policy=CountingPolicy(), clock=clock, interval_s=60.0)
    plain.set_nodes({"n0": NodeInfo({"GPU": 4})})
    for core in (driver.core, plain):
        for name in ("a", "b", "c", "d", "e"):
            core.add_job(name, GPU)
    assert driver.decide() == plain.decide()
    driver.core.running("a", replicas=1)
    plain.running("a", replicas=1)
    clock.now += 61
    assert driver.decide() == plain.decide()
