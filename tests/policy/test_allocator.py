"""Tests for adaptdl_core.policy.allocator: constraints, optimality against brute force,
fairness, hysteresis and input validation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from adaptdl_core import goodput
from adaptdl_core.policy import (
    DEFAULT_RESTART_COST_S,
    JobInfo,
    LinearSpeedup,
    NodeInfo,
    PolluxPolicy,
    check_allocations,
    effective_speedups,
    optimize,
    power_mean,
    restart_penalty,
)

NOW = 10_000.0


# ---------------------------------------------------------------------------------------
# Hand-made speedup functions.

def concave(c: float, multi: float = 0.8, sat: int = 10 ** 6):
    """``K' / (1 + c (K' - 1))`` with ``K' = min(K, sat)``, times ``multi`` when N > 1."""

    def fn(n, k):
        n, k = np.asarray(n), np.asarray(k)
        kk = np.minimum(k, sat)
        s = kk / (1.0 + c * (kk - 1.0))
        s = np.where(n > 1, s * multi, s)
        return np.where((k > 0) & (n >= 1) & (n <= k), s, 0.0)

    return fn


def pollux_like(c: float, cross: int, gain: float = 1.1):
    """Depends on N only through N == 1 vs N > 1, and beyond ``cross`` replicas the
    multi-node shape is *faster* (as the fitted Pollux model can be)."""

    def fn(n, k):
        n, k = np.asarray(n), np.asarray(k)
        s = k / (1.0 + c * (k - 1.0))
        factor = np.where(k > cross, gain, 0.85)
        s = np.where(n > 1, s * factor, s)
        return np.where((k > 0) & (n >= 1) & (n <= k), s, 0.0)

    return fn


def flat(n, k):
    k = np.asarray(k)
    return np.where(k > 0, 1.0, 0.0) * np.ones(np.broadcast(np.asarray(n), k).shape)


def job(fn, ts=0.0, **kw) -> JobInfo:
    kw.setdefault("resources", {"GPU": 1})
    return JobInfo(speedup_fn=fn, creation_timestamp=ts, **kw)


def gpu_nodes(*sizes, preemptible=()) -> dict:
    return {f"n{i}": NodeInfo({"GPU": s}, preemptible=i in preemptible)
            for i, s in enumerate(sizes)}


# ---------------------------------------------------------------------------------------
# Independent reference implementation: constraints and exhaustive search.

def counts_of(jobs, nodes, allocations):
    jk, nk = list(jobs), list(nodes)
    out = np.zeros((len(jk), len(nk)), dtype=np.int64)
    for j, key in enumerate(jk):
        for n in allocations.get(key, []):
            out[j, nk.index(n)] += 1
    return out


def assert_constraints(jobs, nodes, base, allocations):
    """Every hard constraint, checked from scratch."""
    assert set(allocations) == set(jobs)
    jk, nk = list(jobs), list(nodes)
    counts = counts_of(jobs, nodes, allocations)
    basec = counts_of(jobs, nodes, {k: v for k, v in base.items()
                                    if k in jobs and all(n in nodes for n in v)})
    for j, key in enumerate(jk):
        info = jobs[key]
        k = counts[j].sum()
        pinned = not info.preemptible and basec[j].sum() > 0
        if pinned:
            assert np.array_equal(counts[j], basec[j]), f"pinned job {key} moved"
            continue
        if k:
            assert k >= info.min_replicas, key
            assert info.max_replicas is None or k <= info.max_replicas, key
            if not info.preemptible:
                for n, nkey in enumerate(nk):
                    assert counts[j, n] == 0 or not nodes[nkey].preemptible
    for n, nkey in enumerate(nk):
        for r, cap in nodes[nkey].resources.items():
            use = sum(counts[j, n] * jobs[key].resources.get(r, 0.0) for j, key in enumerate(jk))
            assert use <= cap + 1e-9, (nkey, r, use, cap)
        for key in jk:
            for r in jobs[key].resources:
                if r not in nodes[nkey].resources:
                    assert counts[jk.index(key), n] == 0 or jobs[key].resources[r] == 0
        multi = [j for j in range(len(jk)) if counts[j, n] > 0 and np.count_nonzero(counts[j]) > 1
                 and not (not jobs[jk[j]].preemptible and basec[j].sum() > 0)]
        assert len(multi) <= 1, f"node {nkey} hosts multi-node jobs {multi}"


def penalty(info: JobInfo, now: float) -> float:
    age = max(now - info.creation_timestamp, 0.0)
    d = info.restart_cost_s
    return 1.0 if age + d == 0 else max(age - info.num_restarts * d, 0.0) / (age + d)


def objective(speedups, p):
    """Lexicographic objective to minimise: (idle jobs if p <= 0, power-sum term)."""
    s = np.asarray(speedups, dtype=float)
    pos = s > 0
    safe = np.where(pos, s, 1.0)
    if p > 0:
        return 0.0, -float(np.where(pos, safe ** p, 0.0).sum())
    term = -np.log(safe) if p == 0 else safe ** p
    return float((~pos).sum()), float(np.where(pos, term, 0.0).sum())


def node_configs(jobs, node):
    jk = list(jobs)
    out = []

    def rec(j, cur, used):
        if j == len(jk):
            out.append(tuple(cur))
            return
        c = 0
        while True:
            need = {r: used.get(r, 0.0) + c * v for r, v in jobs[jk[j]].resources.items()}
            if any(need[r] > node.resources.get(r, 0.0) + 1e-9 for r in need):
                break
            cur.append(c)
            rec(j + 1, cur, {**used, **need})
            cur.pop()
            c += 1

    rec(0, [], {})
    return np.array(out, dtype=np.int64).reshape(-1, len(jk))


def brute_force(jobs, nodes, base, p, now, configs=None):
    """Best objective over every allocation satisfying the constraints (vectorised)."""
    jk, nk = list(jobs), list(nodes)
    per = configs or [node_configs(jobs, nodes[n]) for n in nk]
    grids = np.meshgrid(*[np.arange(len(c)) for c in per], indexing="ij")
    idx = np.stack([g.ravel() for g in grids], -1)
    counts = np.stack([per[n][idx[:, n]] for n in range(len(nk))], axis=-1)
    K, N = counts.sum(-1), (counts > 0).sum(-1)
    basec = counts_of(jobs, nodes, base)
    ok = np.ones(len(counts), dtype=bool)
    S = np.zeros(K.shape)
    pre = np.array([nodes[n].preemptible for n in nk])
    for j, key in enumerate(jk):
        info = jobs[key]
        if not info.preemptible and basec[j].sum() > 0:
            ok &= np.all(counts[:, j] == basec[j], axis=-1)
        else:
            mx = info.max_replicas if info.max_replicas is not None else 10 ** 9
            ok &= (K[:, j] == 0) | ((K[:, j] >= max(info.min_replicas, 1)) & (K[:, j] <= mx))
            if not info.preemptible:
                ok &= ~np.any(counts[:, j][:, pre] > 0, axis=-1)
        s = np.asarray(info.speedup_fn(N[:, j], K[:, j]), dtype=float)
        if basec[j].sum() > 0:
            same = np.all(counts[:, j] == basec[j], axis=-1)
            s = np.where(same, s, s * penalty(info, now))
        S[:, j] = s
    multi = (N > 1)[:, :, None] & (counts > 0)
    ok &= np.all(multi.sum(1) <= 1, axis=-1)
    S = S[ok]
    pos = S > 0
    safe = np.where(pos, S, 1.0)
    if p > 0:
        idle, term = np.zeros(len(S)), -np.where(pos, safe ** p, 0.0).sum(1)
    else:
        idle = (~pos).sum(1).astype(float)
        term = np.where(pos, -np.log(safe) if p == 0 else safe ** p, 0.0).sum(1)
    fewest = idle.min()
    return float(fewest), float(term[idle == fewest].min())


def random_instance(rng, max_jobs=5, max_nodes=3, max_combos=40_000):
    """A small random instance whose brute force stays cheap, with a base allocation."""
    while True:
        n_nodes = int(rng.integers(1, max_nodes + 1))
        n_jobs = int(rng.integers(2, max_jobs + 1))
        mixed = rng.random() < 0.3
        nodes = {}
        for i in range(n_nodes):
            res = ({"GPU": int(rng.integers(1, 4)), "CPU": int(rng.integers(2, 7))} if mixed
                   else {"GPU": int(rng.integers(1, 5))})
            nodes[f"n{i}"] = NodeInfo(res, preemptible=bool(rng.random() < 0.2))
        jobs = {}
        for i in range(n_jobs):
            if mixed:
                res = ({"GPU": 1, "CPU": int(rng.integers(1, 3))} if rng.random() < 0.7
                       else {"CPU": float(rng.choice([1.0, 1.5]))})
            else:
                res = {"GPU": 1}
            r = rng.random()
            if r < 0.5:
                fn = concave(rng.uniform(0, 0.6), rng.uniform(0.5, 1.0), int(rng.integers(1, 8)))
            elif r < 0.7:
                fn = pollux_like(rng.uniform(0, 0.3), int(rng.integers(1, 4)))
            elif r < 0.85:
                fn = LinearSpeedup(int(rng.integers(0, 3)))
            else:
                fn = flat
            mn = int(rng.integers(0, 3)) if rng.random() < 0.3 else 0
            mx = None if rng.random() < 0.6 else int(rng.integers(max(mn, 1), 5))
            jobs[f"j{i}"] = JobInfo(res, fn, creation_timestamp=float(rng.uniform(0, 9000)),
                                    min_replicas=mn, max_replicas=mx,
                                    preemptible=bool(rng.random() < 0.85),
                                    num_restarts=int(rng.integers(0, 4)),
                                    restart_cost_s=float(rng.uniform(0, 600)))
        configs = [node_configs(jobs, nodes[n]) for n in nodes]
        if math.prod(len(c) for c in configs) > max_combos:
            continue
        # A base allocation: the result of an earlier round, partly forgotten.
        earlier = optimize(jobs, nodes, {}, p=float(rng.choice([-1.0, 1.0])), now=NOW - 3000)
        base = {k: v for k, v in earlier.items() if rng.random() < 0.7}
        return jobs, nodes, base, configs


# ---------------------------------------------------------------------------------------
# Optimality and constraints on random instances.

@pytest.mark.parametrize("seed", range(6))
def test_matches_brute_force_on_small_instances(seed):
    rng = np.random.default_rng(1000 + seed)
    for _ in range(7):
        jobs, nodes, base, configs = random_instance(rng)
        p = float(rng.choice([-2.0, -1.0, 0.0, 1.0]))
        result = PolluxPolicy(p).allocate(jobs, nodes, base, now=NOW)
        assert_constraints(jobs, nodes, base, result.allocations)
        mine = objective([result.speedups[k] for k in jobs], p)
        best = brute_force(jobs, nodes, base, p, NOW, configs)
        assert mine[0] == best[0]
        assert mine[1] <= best[1] + 1e-5 * max(1.0, abs(best[1])), (mine, best)
        assert result.optimal
        assert result.gap == 0.0


@pytest.mark.parametrize("p", [-1.0, 1.0, 0.0])
def test_matches_brute_force_when_bin_packing_binds(p):
    """Identical small nodes and many jobs: the count DP alone is not attainable (items do
    not pack), so the local search / branch and bound must find the true optimum."""
    rng = np.random.default_rng(7)
    for trial in range(5):
        n_nodes, size = (3, 3) if trial % 2 else (4, 2)
        nodes = gpu_nodes(*([size] * n_nodes))
        jobs = {f"j{i}": job(concave(rng.uniform(0, 0.3), rng.uniform(0.5, 0.95),
                                     int(rng.integers(2, 9))), ts=float(i))
                for i in range(int(rng.integers(3, 6)))}
        result = PolluxPolicy(p).allocate(jobs, nodes, {}, now=NOW)
        assert_constraints(jobs, nodes, {}, result.allocations)
        mine = objective([result.speedups[k] for k in jobs], p)
        best = brute_force(jobs, nodes, {}, p, NOW)
        assert mine[0] == best[0]
        assert mine[1] <= best[1] + 1e-6 * max(1.0, abs(best[1]))


def test_constraints_hold_on_many_random_instances():
    rng = np.random.default_rng(42)
    # Small search budgets: this test is about feasibility, not optimality.
    budgets = dict(max_bnb_nodes=100, max_search_evals=500)
    for trial in range(30):
        n_nodes = int(rng.integers(1, 9))
        nodes = {}
        for i in range(n_nodes):
            nodes[f"n{i}"] = NodeInfo({"GPU": int(rng.integers(0, 9)),
                                       "CPU": int(rng.integers(4, 65))},
                                      preemptible=bool(rng.random() < 0.25))
        jobs = {}
        for i in range(int(rng.integers(1, 25))):
            res = ({"GPU": int(rng.integers(1, 3)), "CPU": int(rng.integers(1, 9))}
                   if trial % 2 else {"GPU": 1, "CPU": 4})
            mn = int(rng.integers(0, 4))
            jobs[i] = JobInfo(res, concave(rng.uniform(0, 0.5), rng.uniform(0.3, 1.2)),
                              creation_timestamp=float(rng.uniform(0, 9000)),
                              min_replicas=mn,
                              max_replicas=None if rng.random() < 0.5 else mn + int(
                                  rng.integers(0, 8)),
                              preemptible=bool(rng.random() < 0.8),
                              num_restarts=int(rng.integers(0, 3)))
        base = optimize(jobs, nodes, {}, now=NOW - 600, **budgets)
        assert_constraints(jobs, nodes, {}, base)
        check_allocations(jobs, nodes, base)
        # Next round: a node may disappear; pinned jobs on the others must stay.
        if n_nodes > 1 and rng.random() < 0.5:
            gone = f"n{int(rng.integers(0, n_nodes))}"
            nodes = {k: v for k, v in nodes.items() if k != gone}
        p = float(rng.choice([-1.0, 1.0]))
        result = PolluxPolicy(p, **budgets).allocate(jobs, nodes, base, now=NOW)
        assert_constraints(jobs, nodes, base, result.allocations)
        check_allocations(jobs, nodes, result.allocations, base)
        assert result.fitness == pytest.approx(
            power_mean([result.speedups[k] for k in jobs], p))
        assert 0.0 <= result.gap or math.isnan(result.gap)


def test_tiny_budgets_stay_feasible():
    """A tiny DP budget and no search still give valid allocations."""
    rng = np.random.default_rng(11)
    nodes = {n: NodeInfo({"GPU": 8, "CPU": 64}) for n in range(6)}
    for mixed in (False, True):
        jobs = {}
        for i in range(20):
            res = {"CPU": 6} if mixed and i % 3 == 0 else {"GPU": 1, "CPU": 4}
            jobs[i] = JobInfo(res, concave(rng.uniform(0, 0.2), 0.8), float(i))
        policy = PolluxPolicy(max_dp_cells=1, max_search_evals=0, max_bnb_nodes=0,
                              time_limit_s=5.0)
        result = policy.allocate(jobs, nodes, {}, now=NOW)
        assert_constraints(jobs, nodes, {}, result.allocations)
        assert result.num_idle == 0
        if mixed:       # two binding resource types: coarsened, so no bound
            assert not result.optimal and math.isnan(result.gap)
            assert result.details["dp_coarsened_by"] != [1, 1]
        else:           # the exact reductions leave few options: still certified
            assert result.optimal


def test_fixed_point_when_nothing_changes():
    """Re-running a round on its own result at the same time changes nothing."""
    rng = np.random.default_rng(5)
    for _ in range(10):
        jobs, nodes, base, _ = random_instance(rng, max_jobs=6, max_nodes=4,
                                               max_combos=10 ** 9)
        policy = PolluxPolicy(float(rng.choice([-1.0, 1.0])))
        first = policy.allocate(jobs, nodes, base, now=NOW)
        if not first.optimal:
            continue
        second = policy.allocate(jobs, nodes, first.allocations, now=NOW)
        assert second.allocations == first.allocations


def test_deterministic():
    rng = np.random.default_rng(3)
    jobs, nodes, base, _ = random_instance(rng, max_jobs=6, max_nodes=4, max_combos=10 ** 9)
    a = optimize(jobs, nodes, base, now=NOW)
    b = optimize(jobs, nodes, base, now=NOW)
    assert a == b


# ---------------------------------------------------------------------------------------
# Behaviour.

def test_utilitarian_vs_fair():
    """p = 1 gives more to the job whose speedup scales better; p = -1 spreads."""
    nodes = gpu_nodes(8)
    jobs = {"good": job(concave(0.05)), "poor": job(concave(0.5))}
    util = optimize(jobs, nodes, {}, p=1.0, now=NOW)
    fair = optimize(jobs, nodes, {}, p=-1.0, now=NOW)
    assert len(util["good"]) > len(util["poor"])
    assert len(util["good"]) == 7 and len(util["poor"]) == 1   # marginals >= 0.5 vs <= 1/3
    assert len(fair["poor"]) > len(util["poor"])
    assert len(fair["good"]) < len(util["good"])
    assert len(fair["good"]) + len(fair["poor"]) == 8
    # A fairer exponent spreads at least as much.
    fairer = optimize(jobs, nodes, {}, p=-4.0, now=NOW)
    assert len(fairer["poor"]) >= len(fair["poor"])
    geo = optimize(jobs, nodes, {}, p=0.0, now=NOW)
    assert len(util["poor"]) <= len(geo["poor"]) <= len(fair["poor"])


def test_flat_speedup_gets_no_extra_replicas():
    nodes = gpu_nodes(8, 8)
    jobs = {"flat": job(flat), "capped": job(LinearSpeedup(2)),
            "minflat": job(flat, min_replicas=3)}
    for p in (-1.0, 0.0, 1.0):
        out = optimize(jobs, nodes, {}, p=p, now=NOW)
        assert len(out["flat"]) == 1
        assert len(out["capped"]) == 4            # 2 x the largest profiled count
        assert len(out["minflat"]) == 3           # exactly its minimum
    saturating = {"sat": job(concave(0.1, sat=3))}
    assert len(optimize(saturating, nodes, {}, now=NOW)["sat"]) == 3


def test_hysteresis_small_gain_does_not_move_a_job():
    nodes = gpu_nodes(4, 4)
    # Speedup 1.0 at 2 replicas, 1.01 at 3: a 1% gain.
    small = lambda n, k: np.where(np.asarray(k) >= 3, 1.01,  # noqa: E731
                                  np.where(np.asarray(k) > 0, 1.0, 0.0)) * np.ones(
        np.broadcast(np.asarray(n), np.asarray(k)).shape)
    base = {"a": ["n1", "n1"]}
    expensive = {"a": job(small, ts=NOW - 3600, restart_cost_s=120.0, num_restarts=2)}
    assert optimize(expensive, nodes, base, now=NOW) == base
    # The same gain with free restarts is taken.
    free = {"a": job(small, ts=NOW - 3600, restart_cost_s=0.0)}
    assert len(optimize(free, nodes, base, now=NOW)["a"]) == 3
    # A large gain for an old job with a cheap restart is taken despite the penalty.
    big = {"a": job(concave(0.0), ts=NOW - 36000, restart_cost_s=30.0, num_restarts=1)}
    assert len(optimize(big, nodes, base, now=NOW)["a"]) == 8
    # A young job is not moved for the same gain (it would lose most of its life).
    young = {"a": job(concave(0.0), ts=NOW - 10, restart_cost_s=30.0)}
    assert optimize(young, nodes, base, now=NOW) == base


def test_near_ties_keep_the_current_nodes():
    nodes = gpu_nodes(4, 4, 4)
    jobs = {"a": job(concave(0.2, sat=2), ts=0.0, restart_cost_s=0.0),
            "b": job(concave(0.2, sat=2), ts=1.0, restart_cost_s=0.0),
            "c": job(flat, ts=2.0)}
    base = {"a": ["n2", "n2"], "b": ["n1", "n0"], "c": ["n1"]}
    out = optimize(jobs, nodes, base, now=NOW)
    assert out["a"] == ["n2", "n2"]
    assert out["c"] == ["n1"]
    # b is spread over two nodes; consolidating is strictly better (0.8 -> 1.0 speedup).
    assert len(set(out["b"])) == 1 and len(out["b"]) == 2


def test_running_job_not_preempted_for_identical_new_job():
    nodes = gpu_nodes(1)
    jobs = {"old_new": job(flat, ts=0.0), "running": job(flat, ts=5.0)}
    out = optimize(jobs, nodes, {"running": ["n0"]}, now=NOW)
    assert out == {"old_new": [], "running": ["n0"]}


def test_more_jobs_than_slots_runs_as_many_as_possible_oldest_first():
    nodes = gpu_nodes(2, 1)
    jobs = {f"j{i}": job(concave(0.0), ts=float(i)) for i in range(5)}
    for p in (-1.0, 0.0):
        out = optimize(jobs, nodes, {}, p=p, now=NOW)
        running = sorted(k for k, v in out.items() if v)
        assert running == ["j0", "j1", "j2"]
    # Utilitarian: all capacity is used, not necessarily by distinct jobs.
    out = optimize(jobs, nodes, {}, p=1.0, now=NOW)
    assert sum(len(v) for v in out.values()) == 3


def test_new_jobs_pay_no_penalty_and_moved_jobs_do():
    nodes = gpu_nodes(4)
    jobs = {"new": job(concave(0.0), ts=NOW - 100), "old": job(concave(0.0), ts=NOW - 100,
                                                                num_restarts=1)}
    allocs = {"new": ["n0", "n0"], "old": ["n0", "n0"]}
    sp = effective_speedups(jobs, nodes, allocs, {"old": ["n0"]}, now=NOW)
    assert sp["new"] == pytest.approx(2.0)
    assert sp["old"] == pytest.approx(2.0 * (100 - 30) / (100 + 30))
    sp = effective_speedups(jobs, nodes, allocs, {"old": ["n0", "n0"]}, now=NOW)
    assert sp["old"] == pytest.approx(2.0)


def test_restart_penalty_formula():
    j = job(flat, ts=100.0, num_restarts=2, restart_cost_s=50.0)
    assert restart_penalty(j, 1100.0) == pytest.approx((1000 - 100) / 1050)
    assert restart_penalty(j, 150.0) == 0.0                   # restarts ate its whole life
    assert restart_penalty(job(flat, ts=0.0, restart_cost_s=0.0), 0.0) == 1.0
    assert job(flat).restart_cost_s == DEFAULT_RESTART_COST_S
    assert job(flat, restart_cost_s=None).restart_cost_s == DEFAULT_RESTART_COST_S


def test_pinned_non_preemptible_jobs():
    nodes = gpu_nodes(4, 4, preemptible=(1,))
    jobs = {"pinned": job(concave(0.0), ts=0.0, preemptible=False),
            "other": job(concave(0.0), ts=1.0)}
    base = {"pinned": ["n0", "n1"]}                        # split, even on a spot node
    out = optimize(jobs, nodes, base, now=NOW)
    assert sorted(out["pinned"]) == ["n0", "n1"]
    assert_constraints(jobs, nodes, base, out)
    # The other job cannot share a node with the pinned multi-node job... unless it is
    # single-node: it gets the 6 free GPUs on one node at most.
    assert len(set(out["other"])) <= 1
    # A new non-preemptible job is never placed on a preemptible node.
    jobs2 = {"np": job(concave(0.0), preemptible=False)}
    out2 = optimize(jobs2, gpu_nodes(4, 8, preemptible=(1,)), {}, now=NOW)
    assert out2["np"] == ["n0"] * 4


def test_interference_at_most_one_multinode_job_per_node():
    nodes = gpu_nodes(4, 4, 4)
    jobs = {"a": job(concave(0.0), ts=0.0, max_replicas=6),
            "b": job(concave(0.0), ts=1.0, max_replicas=6)}
    out = optimize(jobs, nodes, {}, p=1.0, now=NOW)
    assert_constraints(jobs, nodes, {}, out)
    # 6 + 6 would need a node shared by two multi-node jobs: the optimum is 6 + 4.
    assert sorted(len(v) for v in out.values()) == [4, 6]


def test_min_and_max_replicas():
    nodes = gpu_nodes(4)
    jobs = {"big": job(concave(0.0), ts=0.0, min_replicas=3),
            "small": job(concave(0.0), ts=1.0, max_replicas=2)}
    out = optimize(jobs, nodes, {"small": ["n0", "n0"]}, now=NOW)
    # Fair share under the limits: big runs its minimum 3, small shrinks to 1.
    assert len(out["big"]) == 3 and len(out["small"]) == 1
    assert_constraints(jobs, nodes, {}, out)
    # A minimum that cannot be met leaves the job idle rather than violating it.
    out = optimize({"huge": job(concave(0.0), min_replicas=5)}, nodes, {}, now=NOW)
    assert out == {"huge": []}


def test_spread_preferring_model_is_spread():
    nodes = gpu_nodes(8, 8)
    jobs = {"x": job(pollux_like(0.0, cross=3, gain=1.2), max_replicas=6)}
    result = PolluxPolicy().allocate(jobs, nodes, {}, now=NOW)
    assert len(result.allocations["x"]) == 6 and len(set(result.allocations["x"])) == 2
    assert result.optimal


def test_vanished_node_replaces_job_without_penalty():
    nodes = gpu_nodes(4)
    jobs = {"a": job(concave(0.0), ts=NOW - 10, restart_cost_s=1000.0)}
    result = PolluxPolicy().allocate(jobs, nodes, {"a": ["gone", "gone"]}, now=NOW)
    assert result.allocations == {"a": ["n0"] * 4}
    assert result.speedups["a"] == pytest.approx(4.0)


def test_mixed_resources_and_fractional_requests():
    nodes = {"cpu": NodeInfo({"CPU": 8}), "gpu": NodeInfo({"CPU": 16, "GPU": 4})}
    jobs = {"c": JobInfo({"CPU": 1.5}, concave(0.1), 0.0),
            "g": JobInfo({"GPU": 1, "CPU": 4}, concave(0.1), 1.0)}
    result = PolluxPolicy().allocate(jobs, nodes, {}, now=NOW)
    assert_constraints(jobs, nodes, {}, result.allocations)
    assert len(result.allocations["g"]) == 4                 # GPU jobs only fit on "gpu"
    assert set(result.allocations["g"]) == {"gpu"}
    assert len(result.allocations["c"]) == 5                 # 8 // 1.5 on "cpu"
    assert result.optimal


def test_result_report():
    nodes = gpu_nodes(4, 4)
    jobs = {f"j{i}": job(concave(0.1 * i), ts=float(i)) for i in range(3)}
    for p in (-1.0, 0.0, 1.0):
        r = PolluxPolicy(p).allocate(jobs, nodes, {}, now=NOW)
        assert r.fitness == pytest.approx(power_mean(list(r.speedups.values()), p))
        assert r.num_idle == 0 and r.optimal and r.gap == 0.0
        assert r.solve_time_s >= 0
        assert list(r.allocations) == list(jobs)


def test_edge_cases():
    assert optimize({}, gpu_nodes(4), {}) == {}
    assert optimize({"a": job(flat)}, {}, {}) == {"a": []}
    assert optimize({"a": job(flat)}, gpu_nodes(0), {}) == {"a": []}
    # Base allocations of finished jobs are ignored.
    assert optimize({"a": job(flat)}, gpu_nodes(1), {"done": ["n0"]}, now=NOW) == {"a": ["n0"]}
    # A job asking for a resource no node has stays idle.
    tpu = JobInfo({"TPU": 1}, flat, 0.0)
    assert optimize({"t": tpu}, gpu_nodes(4), {}, now=NOW) == {"t": []}


def test_power_mean():
    assert power_mean([1, 4], 1) == pytest.approx(2.5)
    assert power_mean([1, 4], 0) == pytest.approx(2.0)
    assert power_mean([1, 4], -1) == pytest.approx(1.6)
    assert power_mean([0, 4], -1) == 0.0
    assert power_mean([], 1) == 0.0
    with pytest.raises(ValueError, match="p"):
        power_mean([1], float("nan"))
    with pytest.raises(ValueError, match="values"):
        power_mean([-1], 1)


# ---------------------------------------------------------------------------------------
# Input validation.

@pytest.mark.parametrize("kwargs, field", [
    (dict(resources={}), "resources"),
    (dict(resources={"GPU": 0}), "resources"),
    (dict(resources={"GPU": -1}), "resources"),
    (dict(resources={"GPU": float("inf")}), "resources"),
    (dict(resources=[("GPU", 1)]), "resources"),
    (dict(resources={"": 1}), "resources"),
    (dict(speedup_fn=3), "speedup_fn"),
    (dict(creation_timestamp=float("nan")), "creation_timestamp"),
    (dict(creation_timestamp="now"), "creation_timestamp"),
    (dict(min_replicas=-1), "min_replicas"),
    (dict(min_replicas=1.5), "min_replicas"),
    (dict(min_replicas=True), "min_replicas"),
    (dict(max_replicas=-2), "max_replicas"),
    (dict(min_replicas=4, max_replicas=2), "max_replicas"),
    (dict(preemptible="yes"), "preemptible"),
    (dict(num_restarts=-1), "num_restarts"),
    (dict(restart_cost_s=-5.0), "restart_cost_s"),
    (dict(restart_cost_s=float("inf")), "restart_cost_s"),
])
def test_jobinfo_validation(kwargs, field):
    args = dict(resources={"GPU": 1}, speedup_fn=flat, creation_timestamp=0.0)
    args.update(kwargs)
    with pytest.raises(ValueError, match=field):
        JobInfo(**args)


def test_nodeinfo_validation():
    with pytest.raises(ValueError, match="resources"):
        NodeInfo({"GPU": -1})
    with pytest.raises(ValueError, match="resources"):
        NodeInfo("GPU")
    with pytest.raises(ValueError, match="preemptible"):
        NodeInfo({"GPU": 1}, preemptible=1)


def test_optimize_argument_validation():
    jobs, nodes = {"a": job(flat)}, gpu_nodes(2)
    with pytest.raises(ValueError, match="jobs"):
        optimize([job(flat)], nodes, {})
    with pytest.raises(ValueError, match="jobs"):
        optimize({"a": "not a job"}, nodes, {})
    with pytest.raises(ValueError, match="nodes"):
        optimize(jobs, ["n0"], {})
    with pytest.raises(ValueError, match="nodes"):
        optimize(jobs, {"n0": {"GPU": 1}}, {})
    with pytest.raises(ValueError, match="base_allocations"):
        optimize(jobs, nodes, [("a", ["n0"])])
    with pytest.raises(ValueError, match="base_allocations"):
        optimize(jobs, nodes, {"a": "n0"})
    with pytest.raises(ValueError, match="p"):
        optimize(jobs, nodes, {}, p=float("inf"))
    with pytest.raises(ValueError, match="p"):
        optimize(jobs, nodes, {}, p="fair")
    with pytest.raises(ValueError, match="now"):
        optimize(jobs, nodes, {}, now=float("nan"))
    with pytest.raises(ValueError, match="min_gain"):
        PolluxPolicy(min_gain=-1)
    with pytest.raises(ValueError, match="max_dp_cells"):
        PolluxPolicy(max_dp_cells=0)
    with pytest.raises(ValueError, match="max_search_evals"):
        PolluxPolicy(max_search_evals=-1)
    with pytest.raises(ValueError, match="max_bnb_nodes"):
        PolluxPolicy(max_bnb_nodes=1.5)
    with pytest.raises(ValueError, match="time_limit_s"):
        PolluxPolicy(time_limit_s=0)
    # Pinned jobs exceeding a node's capacity are inconsistent input.
    pinned = {"a": job(flat, preemptible=False)}
    with pytest.raises(ValueError, match="base_allocations"):
        optimize(pinned, gpu_nodes(1), {"a": ["n0", "n0"]}, now=NOW)
    # A speedup function returning nonsense is reported with the job's key.
    bad = {"bad": job(lambda n, k: -np.ones(np.shape(k)))}
    with pytest.raises(ValueError, match="bad"):
        optimize(bad, nodes, {}, now=NOW)
    # check_allocations rejects violations.
    with pytest.raises(ValueError, match="capacity"):
        check_allocations(jobs, gpu_nodes(1), {"a": ["n0", "n0"]})
    with pytest.raises(ValueError, match="unknown node"):
        check_allocations(jobs, nodes, {"a": ["zz"]})
    two = {"a": job(flat), "b": job(flat)}
    with pytest.raises(ValueError, match="multi-node"):
        check_allocations(two, gpu_nodes(2, 2), {"a": ["n0", "n1"], "b": ["n0", "n1"]})
    with pytest.raises(ValueError, match="replicas"):
        check_allocations({"a": job(flat, max_replicas=1)}, nodes, {"a": ["n0", "n0"]})


# ---------------------------------------------------------------------------------------
# Integration with the real goodput model.

def test_with_real_goodput_functions():
    from adaptdl_core.policy import SpeedupFunction

    rng = np.random.default_rng(0)
    jobs = {}
    for i in range(6):
        alpha_r = rng.uniform(0.005, 0.05)
        perf = goodput.PerfParams(rng.uniform(0.01, 0.1), rng.uniform(1e-4, 1e-3),
                                  alpha_r * rng.uniform(1.5, 5), alpha_r * 0.05, alpha_r,
                                  alpha_r * 0.1, rng.uniform(1, 3))
        model = goodput.GoodputFunction(perf, goodput.GradParams(1.0, rng.uniform(1, 80)), 128)
        fn = SpeedupFunction(model, max_batch_size=4096, atomic_bsz_range=(16, 512),
                             accumulation=True)
        jobs[i] = JobInfo({"GPU": 1, "CPU": 4}, fn, creation_timestamp=float(i * 100))
    nodes = {n: NodeInfo({"GPU": 4, "CPU": 32}) for n in range(3)}
    first = PolluxPolicy().allocate(jobs, nodes, {}, now=NOW)
    assert_constraints(jobs, nodes, {}, first.allocations)
    assert first.num_idle == 0
    assert sum(len(v) for v in first.allocations.values()) <= 12
    second = PolluxPolicy().allocate(jobs, nodes, first.allocations, now=NOW + 60)
    assert_constraints(jobs, nodes, first.allocations, second.allocations)
    # Nothing changed but the clock: no job is restarted.
    assert second.allocations == first.allocations


def test_coarsened_mixed_dp_with_tiny_budget_stays_feasible():
    # Coarsening rounds requests up and capacity down: the DP must keep idling as an
    # option when the rounded lightest options no longer fit together (was an IndexError).
    rng = np.random.default_rng(3)
    for _ in range(30):
        jobs = {i: JobInfo({"GPU": int(rng.integers(1, 3)), "CPU": int(rng.integers(1, 9))},
                           LinearSpeedup(int(rng.integers(1, 5))), 0.0, max_replicas=8)
                for i in range(40)}
        nodes = {n: NodeInfo({"GPU": 8, "CPU": 64}) for n in range(8)}
        allocations = optimize(jobs, nodes, {}, now=100.0, max_dp_cells=3000)
        assert_constraints(jobs, nodes, {}, allocations)


_HUGE_NODE_SCRIPT = r"""
import resource, sys, time
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
import numpy as np
from adaptdl_core.goodput import GoodputFunction, GradParams, PerfParams
from adaptdl_core.policy import JobInfo, LinearSpeedup, NodeInfo, PolluxPolicy, SpeedupFunction
perf = PerfParams(0.017, 0.0007, 0.12, 0.0024, 0.03, 0.0034, 2.0)
def jobs():
    fns = [SpeedupFunction(GoodputFunction(perf, GradParams(0.01, 0.1), 128), 4096, (32, 1024)),
           LinearSpeedup(4), lambda n, k: np.sqrt(np.asarray(k, dtype=float))]
    return {f"j{i}": JobInfo(resources={"CPU": 1}, speedup_fn=fns[i % 3], creation_timestamp=i)
            for i in range(6)}
out = []
for cpus in (float(sys.argv[1]), 1e9):
    t = time.perf_counter()
    result = PolluxPolicy(-1).allocate(jobs(), {"big": NodeInfo(resources={"CPU": cpus})}, {},
                                       now=100.0)
    out.append((sorted((k, len(v)) for k, v in result.allocations.items()),
                time.perf_counter() - t))
print(repr(out))
"""


def test_a_huge_node_costs_what_a_node_the_jobs_can_fill_costs():
    """A node reporting 1e9 CPUs once took 24 GB (every replica count was enumerated): the
    replica counts are bounded by what the jobs can use, so under a 3 GiB address-space
    limit it gives the allocation of a node just large enough for them, as fast."""
    import ast
    import subprocess
    import sys

    # 128 (goodput: 4096 / 32) + 8 (linear prior: 2 x 4) + 4096 (an opaque callable's cap),
    # twice each: a node of that size holds every job at its bound.
    enough = 2 * (128 + 8 + 4096)
    proc = subprocess.run([sys.executable, "-c", _HUGE_NODE_SCRIPT, str(float(enough))],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (alloc_enough, t_enough), (alloc_huge, t_huge) = ast.literal_eval(proc.stdout.strip())
    assert alloc_huge == alloc_enough
    counts = dict(alloc_huge)
    assert counts["j1"] == counts["j4"] == 8          # the linear prior's cap
    assert counts["j2"] == counts["j5"] == 4096       # the opaque callable's cap
    assert t_huge < max(5 * t_enough, 2.0)


# ----------------------------------------------------------------------------- fair share

def test_fair_share_weighs_jobs_by_their_gain_at_the_fair_share():
    # A scales linearly, B gains 30% per extra replica; 4 GPUs, fair share 2 each. Over one
    # replica the harmonic mean prefers 2 + 2 (1/2 + 1/1.3 < 1/3 + 1/1); over the fair
    # share A counts for 2 and B for 1.3, and 3 + 1 wins (2/3 + 1.3 < 2/2 + 1.3/1.3).
    def linear(n, k):
        return np.asarray(k, dtype=float)

    def weak(n, k):
        k = np.asarray(k, dtype=float)
        return np.where(k > 0, 1.0 + 0.3 * (k - 1.0), 0.0)

    jobs = {"A": job(linear, ts=0.0), "B": job(weak, ts=1.0)}
    nodes = gpu_nodes(4)
    plain = PolluxPolicy(-1).allocate(jobs, nodes, {}, now=100.0)
    fair = PolluxPolicy(-1, fair_share=True).allocate(jobs, nodes, {}, now=100.0)
    assert {k: len(v) for k, v in plain.allocations.items()} == {"A": 2, "B": 2}
    assert {k: len(v) for k, v in fair.allocations.items()} == {"A": 3, "B": 1}
    assert fair.optimal
    # Reported speedups stay in the speedup functions' units.
    assert fair.speedups == {"A": pytest.approx(3.0), "B": pytest.approx(1.0)}


def test_fair_share_of_a_round():
    from adaptdl_core.policy.problem import _Problem

    nodes = gpu_nodes(*([4] * 16))
    jobs = {f"j{i}": job(flat, ts=float(i)) for i in range(10)}
    jobs["two"] = job(flat, ts=20.0, resources={"GPU": 2})
    prob = _Problem(jobs, nodes, {}, -1.0, 0.0)
    # 64 GPUs over 11 jobs: ceil(64 / 11) = 6 one-GPU replicas on one node; a two-GPU
    # replica is a share twice as large, so half as many of them.
    assert prob.fair_share(prob.job_keys.index("j0")) == (1, 6)
    assert prob.fair_share(prob.job_keys.index("two")) == (1, 3)
    with pytest.raises(ValueError, match="fair_share"):
        PolluxPolicy(-1, fair_share=1)
