"""Where a trial's replicas run when it resizes in place, with fakes for Ray: its placement
group's base bundles first, its own one-bundle reservations beyond them; a shrink gives
its own reservations back first; leftover reservations of a dead trial actor go."""

from __future__ import annotations

import pytest

pytest.importorskip("ray")

from adaptdl_ray.tune import trial_replicas  # noqa: E402
from adaptdl_ray.tune.trial_replicas import TrialReplicas  # noqa: E402


class FakeReservation:
    def __init__(self, count, accelerator_type=None):
        self.count, self.cancelled, self.created = count, False, 0.0
        self.accelerator_type = accelerator_type
        self.actors = [f"own{i}" for i in range(count)]

    def up(self, wait_s=0.0):
        return not self.cancelled

    def cancel(self):
        self.cancelled = True


class FakePool:
    def __init__(self, *args, **kwargs):
        self.reserved, self.released, self.released_all = [], [], 0

    def reserve(self, count, *, warm_up=None, accelerator_type=None):
        self.reserved.append(FakeReservation(count, accelerator_type))
        return self.reserved[-1]

    def take(self, reservation):
        return list(reservation.actors)

    def release(self, actors, *, pgs=()):
        self.released.extend(actors)

    def release_all(self):
        self.released_all += 1


class FakeGroup:
    def __init__(self, num_replicas, resources, pg, info, actors):
        self.num_replicas, self.actors = num_replicas, list(actors)

    def imported_modules(self):
        return ["json"]

    def shutdown(self):
        self.shut = True


@pytest.fixture
def replicas(monkeypatch):
    """A trial with 2 base bundles; new base actors are named by their bundle."""
    stopped = []
    monkeypatch.setattr(trial_replicas, "ReplicaPool", FakePool)
    monkeypatch.setattr(trial_replicas, "WorkerGroup", FakeGroup)
    monkeypatch.setattr(trial_replicas, "new_workers",
                        lambda res, info, placements: [f"base{i}" for _, i in placements])
    monkeypatch.setattr(trial_replicas, "stop_workers", stopped.extend)
    r = TrialReplicas({"CPU": 1}, {}, object(), 2, "t1", in_process=False,
                      fits_fn=lambda extra: True)
    r.stopped = stopped
    return r


def test_a_launch_fills_the_base_bundles_then_its_own_reservations(replicas):
    group = replicas.group(4)
    assert group.actors == ["base0", "base1", "own0", "own1"]
    one = replicas.group(1)  # (base bundles already taken: it reserves its own)
    assert one.actors == ["own0"]


def test_a_shrink_keeps_base_replicas_and_gives_its_own_back(replicas):
    group = replicas.group(4)
    stay = replicas.survivors(group, 2)
    assert stay == ["base0", "base1"]
    replicas.release([a for a in group.actors if a not in stay])
    assert replicas._pool.released == ["own0", "own1"] and replicas.stopped == []
    # A shrink below the base stops base replicas: their bundles stay the trial's.
    stay = replicas.survivors(group, 1)
    assert stay == ["base0"]
    replicas.release(["base1"])
    assert replicas.stopped == ["base1"]
    again = replicas.group(2, keep=["base0"])
    assert again.actors == ["base0", "base1"]  # the freed bundle serves again


def test_a_grow_reserves_only_beyond_free_base_bundles(replicas):
    group = replicas.group(2)
    assert replicas.grow_ready(group, 2)  # two more: reserved, up at once (fakes)
    (grow,) = replicas._pool.reserved
    assert grow.count == 2
    bigger = replicas.group(4, keep=group.actors)
    assert bigger.actors == ["base0", "base1", "own0", "own1"]
    assert len(replicas._pool.reserved) == 1  # the grow's, taken: nothing reserved again


def test_a_grow_waits_for_room_and_gives_back_a_grow_no_longer_wanted(replicas):
    replicas._grow.fits_fn = lambda extra: False
    group = replicas.group(2)
    assert not replicas.grow_ready(group, 1) and replicas._pool.reserved == []
    replicas._grow.fits_fn = lambda extra: True
    assert replicas.grow_ready(group, 1)
    replicas.cancel_grow()
    assert replicas._pool.reserved[0].cancelled


def test_leftover_reservations_of_a_trial_are_removed(monkeypatch):
    import sys

    import ray.util
    pg_mod = sys.modules["ray.util.placement_group"]
    table = {"a": {"name": "adaptdl-trial-t1-1", "state": "CREATED"},
             "b": {"name": "adaptdl-trial-t1-2", "state": "REMOVED"},
             "c": {"name": "adaptdl-trial-t10-1", "state": "CREATED"},
             "d": {"name": "other", "state": "CREATED"}}
    removed = []
    monkeypatch.setattr(ray.util, "placement_group_table", lambda: table)
    monkeypatch.setattr(pg_mod, "get_placement_group", lambda name: name)
    monkeypatch.setattr(pg_mod, "remove_placement_group", removed.append)
    assert trial_replicas.remove_leftover_reservations("t1") == 1
    assert removed == ["adaptdl-trial-t1-1"]


def test_a_typed_trials_own_reservations_ask_for_its_type(monkeypatch):
    monkeypatch.setattr(trial_replicas, "ReplicaPool", FakePool)
    monkeypatch.setattr(trial_replicas, "WorkerGroup", FakeGroup)
    monkeypatch.setattr(trial_replicas, "new_workers",
                        lambda res, info, placements: [f"base{i}" for _, i in placements])
    r = TrialReplicas({"CPU": 1}, {}, object(), 1, "t1", in_process=True,
                      fits_fn=lambda extra: True, accelerator_type="A100")
    # (one replica: not in the trial actor, which holds no share of the A100 node)
    assert not r._in_process_allowed()
    group = r.group(3)
    assert group.actors == ["base0", "own0", "own1"]
    assert [g.accelerator_type for g in r._pool.reserved] == ["A100"]
    assert r.grow_ready(group, 1) and r._pool.reserved[-1].accelerator_type == "A100"
