"""A Tune trial on a cluster of two accelerator types, without Ray: its relaunch's request
names the type its decision chose, a move to another type is a pause and a relaunch (not a
resize in place), and once it runs on the new type nothing moves it again."""

from __future__ import annotations

import pytest

pytest.importorskip("ray.tune")
from ray.tune.experiment import Trial  # noqa: E402
from ray.tune.schedulers import TrialScheduler  # noqa: E402

from adaptdl_core.policy import NodeInfo  # noqa: E402
from adaptdl_ray.tune import AdaptDLScheduler  # noqa: E402
from adaptdl_ray.tune.resources import num_replicas_of, request_type  # noqa: E402
from adaptdl_ray.tune.trial_types import (is_type_move,  # noqa: E402
                                          needs_typed_relaunch,
                                          nodes_to_report)
from tests.ray.test_scheduler_unit import LONG, StubTrial, start_trial  # noqa: E402,F401
from tests.ray.test_scheduler_unit import clock  # noqa: E402,F401 - the fixture
from tests.ray.typed_policy import TypeSwitchPolicy  # noqa: E402

NODES = {"ta": NodeInfo({"CPU": 2}, accelerator_type="typeA"),
         "tb": NodeInfo({"CPU": 2}, accelerator_type="typeB")}


def test_a_decision_is_a_type_move_only_off_its_type():
    assert not is_type_move(None, None, ["ta"], NODES)         # one type: never
    assert not is_type_move("typeB", "typeB", ["ta"], NODES)   # its request holds it there
    assert is_type_move("typeB", "typeA", ["ta"], NODES)
    assert is_type_move("typeB", None, ["ta"], NODES)          # untyped, placed elsewhere
    assert not is_type_move("typeB", None, ["tb"], NODES)      # untyped, already there
    assert is_type_move("typeB", None, None, NODES)            # not known where: relaunch


def test_a_grow_of_a_trial_not_requesting_the_type_is_a_relaunch():
    assert needs_typed_relaunch("typeA", None, ["ta"], NODES, grows=True)
    assert not needs_typed_relaunch("typeA", None, ["ta"], NODES, grows=False)
    assert not needs_typed_relaunch("typeA", "typeA", ["ta"], NODES, grows=True)
    assert not needs_typed_relaunch(None, None, ["ta"], NODES, grows=True)


def test_the_core_is_told_the_nodes_of_the_launch_a_result_came_from():
    assert nodes_to_report((["ta"], 2), 1, 2, NODES) == ["ta"]
    assert nodes_to_report((["ta"], 1), 1, 2, NODES) is None   # an older launch
    assert nodes_to_report((["ta", "ta"], 2), 1, 2, NODES) is None  # another count
    assert nodes_to_report((["gone"], 2), 1, 2, NODES) is None  # a node the core lacks
    assert nodes_to_report(None, 1, 2, NODES) is None
    one = {"n": NodeInfo({"CPU": 2}, accelerator_type="T4")}
    assert nodes_to_report((["n"], 2), 1, 2, one) is None       # one type: counts only


def report(sched, tc, trial, restarts, nodes):
    """A result of ``trial``'s launch ``restarts``, whose replicas run on ``nodes`` (as
    the launch posted them to the control actor)."""
    sched._sizes.note_launches({trial.trial_id: (nodes, restarts)})
    return sched.on_trial_result(tc, trial, trial.result(**LONG, **{
        "adaptdl/restarts": restarts}))


def test_a_trial_moves_to_the_type_its_decision_names_by_a_relaunch(clock):
    switched = [False]
    sched = AdaptDLScheduler(solve_wait_s=None, nodes_fn=lambda: NODES,
                             allocation_interval_s=30,
                             policy=TypeSwitchPolicy("typeA", "typeB", 1, lambda: switched[0]))
    tc, a = start_trial(sched, "a")
    # Its first request names the type its first solve chose (solved when Tune added it).
    assert a.status == Trial.RUNNING and request_type(a.placement_group_factory) == "typeA"
    # It runs on typeA, as the policy places it: nothing moves.
    assert report(sched, tc, a, 1, ["ta"]) == TrialScheduler.CONTINUE
    clock[0] += 31
    assert report(sched, tc, a, 1, ["ta"]) == TrialScheduler.CONTINUE
    assert sched.core.record("a").placed == ["ta"] and sched.state.jobs["a"].resizes == 0
    # The policy moves it to typeB at the same size: a pause (Tune checkpoints it), not a
    # resize in place (its placement group cannot change while it runs).
    switched[0] = True
    clock[0] += 31
    assert report(sched, tc, a, 1, ["ta"]) == TrialScheduler.PAUSE
    assert sched.target_of("a") == 1 and sched.state.jobs["a"].resizes == 1
    assert "typeB" in sched.state.jobs["a"].resize_log[-1]["reason"]
    # Relaunched with a request for typeB (its base bundles, its minimum).
    a.status = Trial.PAUSED
    tc.start_pending(sched)
    assert a.status == Trial.RUNNING
    pgf = a.placement_group_factory
    assert request_type(pgf) == "typeB" and num_replicas_of(pgf) == 1
    # Its first result, before the core has heard where it runs: its typed request says
    # so; nothing moves again.
    sched._sizes.note_launches({"a": (["ta"], 1)})  # (the old launch, as last read)
    assert sched.on_trial_result(tc, a, a.result(**LONG)) == TrialScheduler.CONTINUE
    # Once it reports its new nodes, the core sees it on typeB: kept there.
    assert report(sched, tc, a, 2, ["tb"]) == TrialScheduler.CONTINUE
    clock[0] += 31
    assert report(sched, tc, a, 2, ["tb"]) == TrialScheduler.CONTINUE
    assert sched.core.record("a").placed == ["tb"]
    assert sched.core.decision_for("a").action == "keep"
    assert sched.state.jobs["a"].resizes == 1 and "a" not in sched._relaunches


def test_a_new_trial_requests_the_type_its_first_solve_chose_on_a_mixed_cluster_only(clock):
    from tests.ray.test_scheduler_unit import StubController
    sched = AdaptDLScheduler(solve_wait_s=30, nodes_fn=lambda: NODES,
                             allocation_interval_s=30,
                             policy=TypeSwitchPolicy("typeA", "typeB", 1, lambda: True))
    tc = StubController()
    a = tc.add(sched, StubTrial("a"))
    # Solved when Tune added it, in Tune's thread, before Tune stages it.
    assert sched.state.num_allocations == 1 and sched.core.record("a").nodes == ["tb"]
    assert request_type(a.placement_group_factory) == "typeB"
    tc.start_pending(sched)
    assert a.status == Trial.RUNNING and request_type(a.placement_group_factory) == "typeB"
    # Each trial Tune adds is placed before it is staged.
    b = tc.add(sched, StubTrial("b"))
    assert sched.state.num_allocations == 2
    assert request_type(b.placement_group_factory) == "typeB"
    # On a cluster of one type nothing is solved when a trial is added, and its request
    # names no type.
    one = AdaptDLScheduler(solve_wait_s=None, allocation_interval_s=30,
                           nodes_fn=lambda: {"n": NodeInfo({"CPU": 2}, accelerator_type="T4")},
                           policy=TypeSwitchPolicy("T4", "T4", 1, lambda: True))
    c = StubController().add(one, StubTrial("c"))
    assert one.state.num_allocations == 0 and request_type(c.placement_group_factory) is None


def test_a_trial_started_untyped_on_the_chosen_type_is_not_moved(clock):
    # No room at its first solve (its request then names no type); its next solve places
    # it on typeB, where Ray happened to start it.
    room = [False]
    sched = AdaptDLScheduler(solve_wait_s=None, nodes_fn=lambda: NODES,
                             allocation_interval_s=30,
                             policy=TypeSwitchPolicy(None, "typeB", 1, lambda: room[0]))
    tc, a = start_trial(sched, "a")
    assert request_type(a.placement_group_factory) is None
    room[0] = True
    for _ in range(3):
        clock[0] += 31
        assert report(sched, tc, a, 1, ["tb"]) == TrialScheduler.CONTINUE
    assert sched.state.jobs["a"].resizes == 0
    assert request_type(a.placement_group_factory) is None


def test_a_grow_of_an_untyped_trial_is_a_typed_relaunch_not_a_resize_in_place(clock):
    from adaptdl_core.policy import ResizeVerdict
    from adaptdl_ray.tune import AdaptDLTrainableCreator
    from tests.ray.test_scheduler_unit import StubController, train_fn
    sched = AdaptDLScheduler(solve_wait_s=None, nodes_fn=lambda: NODES,
                             allocation_interval_s=30,
                             resize_rule=lambda **kw: ResizeVerdict(True, "paying"),
                             policy=TypeSwitchPolicy(None, "typeA", 2, lambda: room[0]))
    room = [False]  # no room at its first solve: its first request names no type
    tc = StubController()
    a = tc.add(sched, StubTrial("a", AdaptDLTrainableCreator(train_fn, max_replicas=2)))
    tc.start_pending(sched)
    assert request_type(a.placement_group_factory) is None
    room[0] = True
    clock[0] += 31
    # The policy grows it to 2 on typeA: its request names no type, so its new replica's
    # reservation could go anywhere; it is relaunched with a typed request instead of
    # being told to grow in place.
    assert report(sched, tc, a, 1, ["ta"]) == TrialScheduler.PAUSE
    assert sched.target_of("a") == 1
    a.status = Trial.PAUSED
    tc.start_pending(sched)
    assert a.status == Trial.RUNNING and sched.target_of("a") == 2
    assert request_type(a.placement_group_factory) == "typeA"
    assert num_replicas_of(a.placement_group_factory) == 1  # its minimum; it grows in place


class Plan:
    """Places each job as ``plan[job] = (type, replicas)`` says (no room: ``(None, 0)``)."""

    knows_types = True

    def __init__(self, plan):
        self.plan = plan

    def allocate(self, jobs, nodes, base_allocations=None, *, now=None):
        from adaptdl_core.policy import AllocationResult
        out = {}
        for key in jobs:
            kind, count = self.plan.get(key, (None, 0))
            typed = [n for n, info in nodes.items() if info.accelerator_type == kind]
            out[key] = [typed[i % len(typed)] for i in range(count)] if typed else []
        return AllocationResult(out, {k: float(len(v)) for k, v in out.items()},
                                1.0, 0, True, 0.0)


def test_a_move_to_a_type_waits_for_room_on_that_type_not_on_any_node(clock):
    from adaptdl_ray.tune import AdaptDLTrainableCreator
    from tests.ray.test_scheduler_unit import StubController, train_fn
    plan = {"a": ("typeA", 1), "b": ("typeB", 2)}
    sched = AdaptDLScheduler(solve_wait_s=None, nodes_fn=lambda: NODES,
                             allocation_interval_s=30, policy=Plan(plan))
    tc = StubController()
    b = tc.add(sched, StubTrial("b", AdaptDLTrainableCreator(train_fn, min_replicas=2,
                                                             max_replicas=2)))
    a = tc.add(sched, StubTrial("a"))
    tc.start_pending(sched)
    assert request_type(b.placement_group_factory) == "typeB"
    assert request_type(a.placement_group_factory) == "typeA"
    assert report(sched, tc, b, 0, ["tb", "tb"]) == TrialScheduler.CONTINUE
    # The policy moves "a" to typeB, whose two CPUs "b" holds.
    plan["a"] = ("typeB", 1)
    clock[0] += 31
    assert report(sched, tc, a, 0, ["ta"]) == TrialScheduler.PAUSE
    a.status = Trial.PAUSED
    # The cluster has 2 CPUs free (typeA's), none on typeB: "a" waits, paused.
    tc.start_pending(sched)
    assert a.status == Trial.PAUSED and "a" in sched._relaunches
    # "b" ends: its room on typeB is free, and "a" relaunches there.
    b.status = Trial.TERMINATED
    sched.on_trial_complete(tc, b, {})
    tc.start_pending(sched)
    assert a.status == Trial.RUNNING and request_type(a.placement_group_factory) == "typeB"
