"""A Tune trial's sizes as the scheduler keeps them (``TrialSizes``), with a fake clock and
no Ray: a move off a draining node begun while a resize in place is not reported yet."""

from __future__ import annotations

from adaptdl_core.decision import CoreDriver, DecisionCore, JobSpec, NodeInfo
from adaptdl_core.policy import PolluxPolicy
from adaptdl_ray.tune.trial_sizes import TrialSizes
from tests.fake_clock import Clock


def sizes_of_a_trial_grown_in_place():
    """Trial ``t`` ran on 1 replica (restart 0) and was told to grow to 2; the grow has
    happened (restart 1) but the trial's next report has not come."""
    clock = Clock(1000.0)
    core = DecisionCore(policy=PolluxPolicy(), clock=clock, interval_s=60.0)
    core.set_nodes({"n0": NodeInfo({"CPU": 4})})
    core.add_job("t", JobSpec({"CPU": 1}, max_replicas=2))
    sizes = TrialSizes(core, CoreDriver(core, solve_wait_s=None))
    sizes.reported("t", {"adaptdl/replicas": 1, "adaptdl/restarts": 0}, 1)
    core.begin_resize("t", to=2, reason="grow")
    clock.now += 30
    return core, sizes


def test_a_move_after_an_unreported_grow_is_logged_from_the_launchs_size():
    core, sizes = sizes_of_a_trial_grown_in_place()
    sizes.note_launches({"t": (["n0", "n1"], 1)})  # as the control actor answers
    assert sizes.launch_size("t") == 2
    sizes.move("t", 2, 1, "node(s) n1 draining (deadline in 60 s)")
    # The late report of the grown launch, then the relaunch's first report on 1 replica.
    sizes.reported("t", {"adaptdl/replicas": 2, "adaptdl/restarts": 1}, 1)
    sizes.reported("t", {"adaptdl/replicas": 1, "adaptdl/restarts": 2,
                         "adaptdl/resize_s": 4.0}, 1)
    log = core.state.jobs["t"].resize_log
    assert [(e["from"], e["to"], e["reason"]) for e in log] == [
        (1, 2, "grow"), (2, 1, "node(s) n1 draining (deadline in 60 s)")], log
    assert log[-1]["measured_s"] == 4.0


def test_without_the_launchs_restarts_the_relaunch_looks_like_a_resize_of_its_own():
    # What the launch's restart count is for: told only the last report's size, the core
    # takes the grown launch's late report as the end of the move, and the relaunch as a
    # resize nobody decided.
    core, sizes = sizes_of_a_trial_grown_in_place()
    sizes.move("t", 1, 1, "node(s) n1 draining (deadline in 60 s)")
    sizes.reported("t", {"adaptdl/replicas": 2, "adaptdl/restarts": 1}, 1)
    sizes.reported("t", {"adaptdl/replicas": 1, "adaptdl/restarts": 2,
                         "adaptdl/resize_s": 4.0}, 1)
    log = core.state.jobs["t"].resize_log
    assert len(log) == 3 and "draining" not in log[-1]["reason"], log


def test_a_grow_waiting_to_be_measured_is_not_cancelled_by_its_own_hold():
    """Under the amortised rule (the Ray front-ends' default) a job is not resized again
    before its last resize is measured; the grow in flight is that resize, so the hold it
    causes must not cancel it. A policy that changes its mind does."""
    from adaptdl_core.decision import JobProgress
    from adaptdl_core.policy import ResizeVerdict, amortised_resize_verdict
    from tests.decision.stubs import FixedSizePolicy

    def rule(**kwargs):
        # The amortised rule once the job has resized; before, every resize pays (the
        # stub policy gives no speedup to weigh).
        if kwargs.get("since_last_s") is None:
            return ResizeVerdict(True, "pays")
        return amortised_resize_verdict(**kwargs)

    clock, policy = Clock(1000.0), FixedSizePolicy(2)
    core = DecisionCore(policy=policy, clock=clock, interval_s=10.0, resize_rule=rule)
    core.set_nodes({"n0": NodeInfo({"CPU": 2})})
    core.add_job("t", JobSpec({"CPU": 1}, max_replicas=2))
    sizes = TrialSizes(core, CoreDriver(core, solve_wait_s=None))
    core.decide()
    sizes.reported("t", {"adaptdl/replicas": 1, "adaptdl/restarts": 0}, 1)
    core.update("t", progress=JobProgress(remaining_s=600.0))
    clock.now += 20
    core.decide()
    sizes.resize("t", 1, lambda replicas: True)
    assert sizes.target_of("t") == 2 and core.state.jobs["t"].resize_pending
    clock.now += 20
    core.decide()
    assert core.decision_for("t").action == "hold"  # (not measured yet)
    sizes.resize("t", 1, lambda replicas: True)
    assert sizes.target_of("t") == 2 and core.state.jobs["t"].resize_pending
    assert "cancelled" not in core.state.jobs["t"].resize_log[-1]
    # The policy now wants 1: the grow not carried out yet is cancelled.
    policy.replicas = 1
    clock.now += 20
    core.decide()
    sizes.resize("t", 1, lambda replicas: True)
    assert sizes.target_of("t") == 1 and not core.state.jobs["t"].resize_pending
    assert core.state.jobs["t"].resize_log[-1]["cancelled"] == "the policy kept its size"
