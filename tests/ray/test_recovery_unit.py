"""The rules the job supervisor and a Tune trial share, with fakes (no Ray cluster): a
replica's failure over a lost node, the step toward a new size, and the hand-over of the
replicas that stay."""

from __future__ import annotations

import pytest

from adaptdl_ray.replicas import group as worker_group
from adaptdl_ray.supervisor.outcomes import Boundary, boundary_of
from adaptdl_ray.supervisor.recovery import (FailureVerdict, ResizeStep, Verdict, hand_over,
                                             judge_failure, resize_step)


class Group:
    def __init__(self, node_ids):
        self.node_ids = list(node_ids)
        self.actors = []  # (no actor to ask: the nodes' absence decides at once)


def test_a_failure_over_a_lost_node_continues_and_is_logged(caplog):
    verdict = judge_failure(RuntimeError("actor died\nmore ids"), Group(["a", "b", "b"]),
                            lambda: ["a"], name="trial t")
    assert verdict == FailureVerdict(Verdict.CONTINUE, ("b",), "actor died")
    assert "trial t: node(s) b under its replicas were lost (actor died)" in caplog.text


def test_a_failure_on_nodes_still_there_is_the_jobs(caplog):
    verdict = judge_failure(ValueError(), Group(["a", "b"]), lambda: ["a", "b"], name="job j")
    assert verdict == FailureVerdict(Verdict.FAIL, (), "ValueError")
    assert "were lost" not in caplog.text


class Grow:
    def __init__(self, ready):
        self.ready, self.asked, self.cancelled = ready, [], 0

    def grow_ready(self, extra):
        self.asked.append(extra)
        return self.ready

    def cancel(self):
        self.cancelled += 1


@pytest.mark.parametrize("current, target, moves, ready, step, asked, cancelled", [
    (2, 2, False, True, ResizeStep.HOLD, [], 1),     # same size: a grow is given back
    (2, 4, False, False, ResizeStep.WAIT, [2], 0),   # new replicas still starting
    (2, 4, False, True, ResizeStep.GO, [2], 0),      # they are up: checkpoint now
    (3, 1, False, False, ResizeStep.GO, [], 0),      # a shrink goes at once
    (2, 2, True, False, ResizeStep.GO, [], 0),       # a move to another type, same size
    (2, 3, True, False, ResizeStep.GO, [], 0),       # ... its new replicas start after
])
def test_the_step_toward_a_new_size(current, target, moves, ready, step, asked, cancelled):
    grow = Grow(ready)
    assert resize_step(current, target, moves=moves, grow_ready=grow.grow_ready,
                       cancel_grow=grow.cancel) is step
    assert grow.asked == asked and grow.cancelled == cancelled


@pytest.mark.parametrize("stay, recycled, kept, released, recycles", [
    (["r0", "r1"], True, ["r0", "r1"], ["r2"], 1),
    (["r0", "r1"], False, [], ["r0", "r1", "r2"], 1),  # not idle: every one is replaced
    ([], True, [], ["r0", "r1", "r2"], 0),             # none stays: nothing to recycle
])
def test_the_replicas_that_stay_are_handed_over(monkeypatch, stay, recycled, kept, released,
                                                recycles):
    calls, gone = [], []
    monkeypatch.setattr(worker_group, "recycle_workers",
                        lambda actors, info: calls.append((list(actors), info)) or recycled)
    actors = ["r0", "r1", "r2"]
    assert hand_over(actors, stay, {"trial_id": "t"}, release=gone.extend) == kept
    assert gone == released
    assert calls == [(actors, {"trial_id": "t"})] * recycles  # all leave together


def test_where_replicas_stopped():
    assert boundary_of([{"status": "finished"}] * 2) is Boundary.FINISHED
    assert boundary_of([{"status": "finished"}, {"status": "checkpointed"}]) is \
        Boundary.CHECKPOINTED
