"""Replicas placed on an accelerator type: the one bundle rule, as the pool's reservations,
a grow's and a Tune trial's placement group request use it (no Ray cluster needed)."""

from __future__ import annotations

import pytest

from adaptdl_ray.replicas.bundles import (ACCELERATOR_LABEL, TYPE_SHARE, bundles_type,
                                          label_selectors, replica_bundle, type_resource)


def test_a_bundle_for_a_type_asks_for_a_sliver_of_its_resource():
    assert replica_bundle({"CPU": 1, "GPU": 1}, "A100") == \
        {"CPU": 1.0, "GPU": 1.0, "accelerator_type:A100": TYPE_SHARE}
    assert TYPE_SHARE < 0.01  # (a node of the type holds as many as its GPUs allow)
    assert type_resource("T4") == "accelerator_type:T4"


def test_without_a_type_the_bundle_is_the_replicas_resources():
    resources = {"CPU": 2, "GPU": 0.5}
    bundle = replica_bundle(resources)
    assert bundle == resources and bundle is not resources


def test_a_type_asked_by_its_label_leaves_the_bundle_alone_and_selects_per_bundle():
    assert replica_bundle({"CPU": 1}, "H100", by_label=True) == {"CPU": 1.0}
    assert label_selectors("H100", 2) == [{ACCELERATOR_LABEL: "H100"}] * 2
    with pytest.raises(ValueError, match="accelerator_type"):
        label_selectors("", 1)


@pytest.mark.parametrize("bad", ["", 4, None])
def test_type_resource_rejects_a_non_type(bad):
    with pytest.raises(ValueError, match="accelerator_type"):
        type_resource(bad)


def test_the_type_of_bundles_is_the_one_they_all_name():
    typed = replica_bundle({"CPU": 1}, "T4")
    assert bundles_type([{}, typed, typed]) == "T4"
    assert bundles_type([{}, {"CPU": 1}]) is None
    assert bundles_type([typed, replica_bundle({"CPU": 1}, "A100")]) is None
    assert bundles_type([typed, {"CPU": 1}]) is None
    assert bundles_type([]) is None


def test_a_trials_request_asks_for_its_type_in_every_replica_bundle():
    pytest.importorskip("ray")
    from adaptdl_core.decision import JobSpec
    from adaptdl_ray.tune.resources import (num_replicas_of, placement_group_factory,
                                            request_type)
    spec = JobSpec({"CPU": 1}, 1, 4)
    plain = placement_group_factory(spec, 2)
    assert plain.bundles == [{"CPU": 1.0}] * 2 and request_type(plain) is None
    typed = placement_group_factory(spec, 3, "A100")
    assert typed.bundles == [{"CPU": 1.0, "accelerator_type:A100": TYPE_SHARE}] * 3
    assert num_replicas_of(typed) == 3 and request_type(typed) == "A100"
    # A type named only by its label: plain bundles, the type in the selectors.
    labelled = placement_group_factory(spec, 2, "H100", by_label=True)
    assert labelled.bundles == [{"CPU": 1.0}] * 2 and request_type(labelled) == "H100"
    assert num_replicas_of(labelled) == 2
    assert labelled != placement_group_factory(spec, 2, "L4", by_label=True)
    assert labelled == placement_group_factory(spec, 2, "H100", by_label=True)
    # Without Ray to ask, a type is asked for by its resource.
    assert placement_group_factory(spec, 2, "A100") == typed.__class__(
        [{}] + [replica_bundle({"CPU": 1}, "A100")] * 2, strategy="PACK")


class Reservation:
    def __init__(self, count, accelerator_type):
        self.count, self.accelerator_type = count, accelerator_type
        self.cancelled, self.created = False, 0.0

    def up(self, wait_s=0.0):
        return True

    def cancel(self):
        self.cancelled = True


class Pool:
    resources = {"CPU": 1.0}

    def __init__(self):
        self.reserved = []

    def reserve(self, count, *, warm_up=None, accelerator_type=None):
        self.reserved.append(Reservation(count, accelerator_type))
        return self.reserved[-1]

    def release(self, actors, *, pgs=()):
        pass


def test_a_grow_reserves_on_its_type_and_one_of_another_type_is_given_back():
    from adaptdl_ray.replicas.pool import Grow
    pool = Pool()
    grow = Grow(pool, fits_fn=lambda extra: True)
    assert grow.ready(2, lambda: ([], []), "T4")
    assert pool.reserved[-1].accelerator_type == "T4"
    # The decision moved to another type: the T4 grow is given back, an A100 one asked.
    assert grow.ready(2, lambda: ([], []), "A100")
    assert pool.reserved[0].cancelled and pool.reserved[-1].accelerator_type == "A100"
    # A launch on T4 does not take the A100 grow (it is given back).
    assert grow.take(2, "T4") is None and pool.reserved[-1].cancelled
    assert grow.ready(1, lambda: ([], []))
    assert grow.take(1) is pool.reserved[-1]


def test_the_default_room_check_counts_the_types_sliver(monkeypatch):
    from adaptdl_ray.replicas import nodes, pool as pool_mod
    pool = Pool()
    grow = pool_mod.Grow(pool)
    monkeypatch.setattr(nodes, "free_resources", lambda: {"CPU": 4.0})
    assert grow.ready(2, lambda: ([], []))          # (no type: CPUs are enough)
    grow.cancel()
    # No free A100 resource at all: no node of that type has room.
    assert not grow.ready(2, lambda: ([], []), "A100")
    monkeypatch.setattr(nodes, "free_resources",
                        lambda: {"CPU": 4.0, "accelerator_type:A100": 1.0})
    assert grow.ready(2, lambda: ([], []), "A100")


def test_the_room_check_of_a_type_named_only_by_its_label_counts_the_replicas_resources(
        monkeypatch):
    from adaptdl_ray.replicas import nodes, pool as pool_mod
    grow = pool_mod.Grow(Pool())
    monkeypatch.setattr(nodes, "free_resources", lambda: {"CPU": 4.0})
    monkeypatch.setattr(nodes, "asked_by_label", lambda kind: kind == "H100")
    assert grow.ready(2, lambda: ([], []), "H100")
    grow.cancel()
    assert not grow.ready(5, lambda: ([], []), "H100")      # (5 CPUs are not free)
    assert not grow.ready(2, lambda: ([], []), "A100")      # (no node of that type)
