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
