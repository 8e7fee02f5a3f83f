"""In-place checkpoints (the job supervisor's and a Tune trial's), with a fake clock and
fake replicas: the schedule, what a save takes, and a save that finds no boundary."""

from __future__ import annotations

import pytest

from adaptdl_ray.supervisor.in_place import InPlaceCheckpoints, InPlaceSave
from tests.fake_clock import Clock


class Group:
    """Replicas whose saves take ``cost`` seconds of the clock; ``answers`` are what
    their saves say, in turn (an exception is raised)."""

    def __init__(self, clock, answers, cost=2.0):
        self.clock, self.answers, self.cost = clock, list(answers), cost
        self.saves, self.fetched = 0, []

    def save(self, timeout_s):
        self.saves += 1
        self.clock.now += self.cost
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def checkpoint_archive(self, path=None):
        self.fetched.append(path)
        return f"archive@{path}".encode()


TAKEN = {"taken": True, "path": "ckpt-7", "index": 7}


def test_a_save_is_due_one_interval_after_the_launch_and_after_the_last_save():
    clock = Clock(100.0)
    saves = InPlaceCheckpoints(10.0, 5.0, name="job j", clock=clock)
    group = Group(clock, [TAKEN, TAKEN])
    saves.restart()
    clock.now = 109.9
    assert saves.save_if_due(group) is None and group.saves == 0
    clock.now = 110.0
    assert saves.save_if_due(group) == InPlaceSave(b"archive@ckpt-7", 7, 2.0)
    assert group.fetched == ["ckpt-7"]
    clock.now = 121.9  # (the save ended at 112: ten seconds of training after it)
    assert saves.save_if_due(group) is None
    clock.now = 122.0
    assert saves.save_if_due(group) is not None and group.saves == 2


def test_the_first_check_of_a_launch_not_restarted_schedules_it():
    clock = Clock()
    saves = InPlaceCheckpoints(10.0, 5.0, name="trial t", clock=clock)
    assert not saves.due()
    clock.now = 9.0
    assert not saves.due()
    clock.now = 10.0
    assert saves.due()


def test_no_interval_no_saves():
    clock = Clock()
    saves = InPlaceCheckpoints(None, 5.0, name="job j", clock=clock)
    saves.restart()
    clock.now = 1e9
    assert not saves.due() and saves.save_if_due(Group(clock, [])) is None


def test_a_function_that_ended_before_a_boundary_gives_no_save():
    clock = Clock()
    group = Group(clock, [{"taken": False, "path": None, "index": 3}])
    assert InPlaceCheckpoints(10.0, 5.0, name="job j", clock=clock).save(group) is None
    assert group.fetched == []


def test_a_save_without_a_boundary_in_time_is_skipped_and_the_next_is_one_interval_later(
        caplog):
    clock = Clock()
    saves = InPlaceCheckpoints(10.0, 5.0, name="job j", clock=clock)
    group = Group(clock, [TimeoutError("rank 1 took no stop within 5 s"), TAKEN])
    saves.restart()
    clock.now = 10.0
    assert saves.save_if_due(group) is None
    assert "job j: in-place checkpoint skipped: rank 1 took no stop" in caplog.text
    assert not saves.due()  # (12 now: due at 22)
    clock.now = 22.0
    assert saves.save_if_due(group) is not None


def test_a_failure_during_a_save_is_raised_and_the_schedule_goes_on():
    clock = Clock()
    saves = InPlaceCheckpoints(10.0, 5.0, name="job j", clock=clock)
    saves.restart()
    clock.now = 10.0
    with pytest.raises(RuntimeError, match="replica died"):
        saves.save_if_due(Group(clock, [RuntimeError("replica died")]))
    assert not saves.due()
