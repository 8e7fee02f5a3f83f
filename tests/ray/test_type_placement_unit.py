"""Placement by accelerator type on Ray, without Ray: a submitted job's sizer carries the
type its solve chose (start, move) to the supervisor, and a move to another type is a
resize that ends once the job reports running there."""

from __future__ import annotations

from adaptdl_core.decision import JobProgress, JobSpec, NodeInfo
from adaptdl_ray.cluster.sizing import CoreSizer
from tests.ray.typed_policy import TypeSwitchPolicy

NODES = {"ta": NodeInfo({"CPU": 2}, accelerator_type="typeA"),
         "tb": NodeInfo({"CPU": 2}, accelerator_type="typeB"),
         "head": NodeInfo({"CPU": 1})}


def sizer_with(policy, clock):
    sizer = CoreSizer("j", JobSpec({"CPU": 1}, 1, 2), nodes_fn=lambda: NODES,
                      clock=lambda: clock[0], interval_s=1.0)
    sizer.core.policy = policy
    return sizer


def test_a_jobs_start_and_move_carry_the_type_chosen():
    switched, clock = [False], [1000.0]
    sizer = sizer_with(TypeSwitchPolicy("typeA", "typeB", 2, lambda: switched[0]), clock)
    assert sizer.start() == 2 and sizer.start_type == "typeA"
    sizer.observe(2, nodes=["ta", "ta"], progress=JobProgress(restarts=0))
    clock[0] += 2
    keep = sizer.decision()
    assert keep.action == "keep" and keep.accelerator_type == "typeA"
    # The policy moves it to typeB at the same size: a resize naming typeB.
    switched[0] = True
    clock[0] += 2
    move = sizer.decision()
    assert (move.action, move.replicas, move.accelerator_type) == ("resize", 2, "typeB")
    sizer.begin_resize(move)
    # Once it reports running on typeB, nothing more moves.
    sizer.observe(2, nodes=["tb", "tb"], progress=JobProgress(restarts=1))
    clock[0] += 2
    after = sizer.decision()
    assert after.action == "keep" and after.accelerator_type == "typeB"


def test_nodes_the_core_does_not_know_are_reported_as_a_count():
    sizer = sizer_with(TypeSwitchPolicy("typeA", "typeB", 2, lambda: False), [1000.0])
    sizer.start()
    sizer.observe(2, nodes=["ta", "gone"])
    record = sizer.core.record("j")
    assert record.current == 2 and not record.placed_known
    sizer.observe(2, nodes=["ta", "ta"])
    assert record.placed == ["ta", "ta"] and record.placed_known


def test_on_a_cluster_of_one_type_no_type_is_carried():
    sizer = CoreSizer("j", JobSpec({"CPU": 1}, 1, 2),
                      nodes_fn=lambda: {"n": NodeInfo({"CPU": 2}, accelerator_type="T4")})
    sizer.start()
    assert sizer.start_type is None and sizer.decision().accelerator_type is None
