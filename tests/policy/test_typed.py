"""The type-aware allocator on hand-checked cases, its two solvers against each other, and
its bad input."""

from __future__ import annotations

import numpy as np
import pytest

from adaptdl_core.policy import (JobInfo, NodeInfo, RemainingWorkPolicy, TypedAllocator,
                                 check_allocations, policy_by_name, power_mean,
                                 typed_round_applies)


class Lin:
    """``rate * min(K, cap)``, a little slower across nodes."""

    def __init__(self, rate: float, cap: int) -> None:
        self.rate, self.cap = rate, cap
        self.max_useful_replicas = cap

    def __call__(self, n, k):
        n, k = np.asarray(n), np.asarray(k)
        return np.where(k > 0, self.rate * np.minimum(k, self.cap) * np.where(n > 1, 0.95, 1.0),
                        0.0)


def typed_job(rates: dict, cap: int = 8, **kw) -> JobInfo:
    fns = {t: Lin(r, cap) for t, r in rates.items()}
    return JobInfo({"GPU": 1}, next(iter(fns.values())), kw.pop("created", 0.0),
                   type_speedups=fns, **kw)


def cluster(slow_nodes: int = 2, fast_nodes: int = 1) -> dict:
    nodes = {f"t4-{i}": NodeInfo({"GPU": 4}, accelerator_type="t4") for i in range(slow_nodes)}
    nodes.update({f"a100-{i}": NodeInfo({"GPU": 8}, accelerator_type="a100")
                  for i in range(fast_nodes)})
    return nodes


def type_of(alloc, nodes):
    kinds = {nodes[n].accelerator_type for n in alloc}
    assert len(kinds) == 1, alloc
    return kinds.pop()


@pytest.mark.parametrize("exact", [True, False])
def test_each_job_gets_the_type_where_it_gains_most(exact):
    nodes = cluster()
    jobs = {"bert": typed_job({"t4": 1.0, "a100": 10.0}),
            "yolo": typed_job({"t4": 1.0, "a100": 1.2})}
    alloc = TypedAllocator(-1, max_exact_options=10_000 if exact else 0).allocate(
        jobs, nodes, {}, now=100.0)
    assert alloc.details["method"] == ("exact" if exact else "lagrangian")
    assert type_of(alloc.allocations["bert"], nodes) == "a100"
    assert type_of(alloc.allocations["yolo"], nodes) == "t4"
    # Both at their caps: 8 replicas each (the a100 node, both t4 nodes).
    assert len(alloc.allocations["bert"]) == 8 and len(alloc.allocations["yolo"]) == 8
    check_allocations(jobs, nodes, alloc.allocations)


def test_a_young_job_is_not_moved_for_a_small_gain_but_an_old_one_is():
    nodes = cluster(slow_nodes=1, fast_nodes=1)
    base = {"j": ["t4-0"] * 4}
    # On the a100 node it would be 1.5x as fast; moving costs a restart of 300 s.
    young = {"j": typed_job({"t4": 1.0, "a100": 1.5}, cap=4, created=0.0, restart_cost_s=300.0)}
    stay = TypedAllocator(-1).allocate(young, nodes, base, now=600.0)
    # 600 s old: the move keeps 600 / 900 of the speedup, 1.5 * 0.67 < 1.
    assert stay.allocations["j"] == base["j"]
    old = {"j": typed_job({"t4": 1.0, "a100": 1.5}, cap=4, created=0.0, restart_cost_s=300.0)}
    move = TypedAllocator(-1).allocate(old, nodes, base, now=30_000.0)
    assert type_of(move.allocations["j"], nodes) == "a100"
    assert move.details["types"]["j"] == "a100"


def test_contended_fast_type_goes_to_the_fair_optimum():
    # One 8-GPU a100 node, two 4-GPU t4 nodes; three jobs, each 4x faster on a100.
    # The harmonic mean is best with jobs spread over both types, all of them running.
    nodes = cluster()
    jobs = {k: typed_job({"t4": 1.0, "a100": 4.0}, cap=8, created=float(i))
            for i, k in enumerate("abc")}
    exact = TypedAllocator(-1).allocate(jobs, nodes, {}, now=10.0)
    assert exact.num_idle == 0
    used = {t: 0 for t in ("t4", "a100")}
    for alloc in exact.allocations.values():
        used[type_of(alloc, nodes)] += len(alloc)
    assert used["a100"] <= 8 and used["t4"] <= 8
    check_allocations(jobs, nodes, exact.allocations)
    # Brute force over (type, count) of each job confirms the exact solver's fitness.
    best = 0.0
    opts = [(t, k) for t in ("t4", "a100") for k in range(1, 9)]
    for a in opts:
        for b in opts:
            for c in opts:
                use = {"t4": 0, "a100": 0}
                for t, k in (a, b, c):
                    use[t] += k
                if use["t4"] > 8 or use["a100"] > 8:
                    continue
                vals = [(4.0 if t == "a100" else 1.0) * k for t, k in (a, b, c)]
                best = max(best, power_mean(vals, -1))
    assert exact.fitness == pytest.approx(best, rel=0.06)   # t4 jobs may span 2 nodes


def test_lagrangian_is_close_to_exact_on_random_rounds():
    rng = np.random.default_rng(3)
    for _ in range(5):
        nodes = cluster(slow_nodes=3, fast_nodes=2)
        jobs = {f"j{i}": typed_job({"t4": 1.0, "a100": float(rng.uniform(1.0, 8.0))},
                                   cap=int(rng.integers(1, 17)), created=float(i))
                for i in range(int(rng.integers(3, 12)))}
        exact = TypedAllocator(-1).allocate(jobs, nodes, {}, now=50.0)
        lagr = TypedAllocator(-1, max_exact_options=0).allocate(jobs, nodes, {}, now=50.0)
        check_allocations(jobs, nodes, lagr.allocations)
        assert lagr.num_idle == exact.num_idle == 0
        assert lagr.fitness >= 0.93 * exact.fitness


def test_a_job_missing_a_type_never_runs_there():
    nodes = cluster(slow_nodes=1, fast_nodes=1)
    jobs = {"only-t4": JobInfo({"GPU": 1}, Lin(1.0, 4), 0.0, type_speedups={"t4": Lin(1.0, 4)}),
            "any": typed_job({"t4": 1.0, "a100": 1.0}, cap=4)}
    alloc = TypedAllocator(-1).allocate(jobs, nodes, {}, now=1.0)
    assert type_of(alloc.allocations["only-t4"], nodes) == "t4"


def test_when_the_typed_round_applies_and_the_adaptdl_policy_routes_to_it():
    nodes = cluster()
    jobs = {"a": typed_job({"t4": 1.0, "a100": 10.0}), "b": typed_job({"t4": 1.0, "a100": 1.1})}
    assert typed_round_applies(jobs, nodes)
    one_type = {k: NodeInfo({"GPU": 4}, accelerator_type="t4") for k in "xy"}
    assert not typed_round_applies(jobs, one_type)
    # A node of no known type (a CPU-only head node) does not make a cluster mixed.
    with_head = dict(one_type, head=NodeInfo({"CPU": 8}))
    assert not typed_round_applies(jobs, with_head)
    mixed = dict(jobs, c=JobInfo({"GPU": 1, "CPU": 2}, Lin(1, 2), 0.0))
    assert not typed_round_applies(mixed, nodes)
    result = policy_by_name("adaptdl").allocate(jobs, nodes, {}, now=10.0)
    assert result.details.get("types") == {"a": "a100", "b": "t4"}
    # On nodes of one type the policy is the type-unaware one it always was.
    plain = RemainingWorkPolicy().allocate(jobs, one_type, {}, now=10.0)
    assert "types" not in plain.details


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="accelerator_type"):
        NodeInfo({"GPU": 4}, accelerator_type="")
    with pytest.raises(ValueError, match=r"type_speedups\['t4'\] must be callable"):
        JobInfo({"GPU": 1}, Lin(1, 1), 0.0, type_speedups={"t4": 3.0})
    with pytest.raises(ValueError, match="type_speedups must be None or a non-empty dict"):
        JobInfo({"GPU": 1}, Lin(1, 1), 0.0, type_speedups={})
    with pytest.raises(ValueError, match="p must be < 0"):
        TypedAllocator(1.0)
    nodes = {"x": NodeInfo({"GPU": 4}, accelerator_type="t4")}
    with pytest.raises(ValueError, match="several known accelerator types"):
        TypedAllocator(-1).allocate({"a": typed_job({"t4": 1.0})}, nodes, {}, now=0.0)
