"""Decision time and quality of the Pollux allocator (adaptdl_core.policy).

Three measurements, printed as markdown tables:

1. **Decision time** for 16 / 64 / 256 jobs on 4 / 16 / 64 nodes (8 GPUs + 64 CPUs per node,
   every job asking ``{"GPU": 1, "CPU": 4}`` per replica, p = -1). "cold" is a first round
   with freshly built speedup functions (it includes evaluating the goodput models, the
   cost of which belongs to :mod:`adaptdl_core.goodput`), "warm" a steady-state round 60 s
   later on the previous allocation with memoised speedups (what a scheduler pays every
   interval), "churn" a warm round after 1/8 of the jobs were replaced by new ones.
   ``optimal`` says whether the allocator certified its result optimal.
2. **Versus brute force** on small instances (<= 5 jobs, <= 3 nodes, mixed resources,
   pinned jobs, base allocations): how often the allocator's objective equals the
   exhaustive optimum.
3. **Versus a genetic algorithm** of the original's size (population 100, 100
   generations; written here: uniform crossover over jobs, +-1 mutations, repair of every
   constraint, tournament selection, elitism, seeded with the current allocation) on the
   same instances and objective: a steady-state round whose base allocation came from an
   earlier utilitarian round (so there is something to fix). "gap to bound" is the
   allocator's own certificate: at most that much below the optimum.

Speedup functions: the real :class:`~adaptdl_core.goodput.GoodputFunction` with throughput
parameters fitted to the Pollux traces (``benchmarks/fit_accuracy.py``) and gradient
statistics read from the traces' validation runs at a random point of training; if the
goodput module or the traces are missing, synthetic concave curves.

Usage: ``python benchmarks/policy.py [--quick] [--seed N]`` (full: about 3 minutes on a
busy 2-core machine; ``--quick``: under 30 s).
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Tuple

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from adaptdl_core.policy import (  # noqa: E402
    JobInfo,
    NodeInfo,
    PolluxPolicy,
    SpeedupFunction,
    check_allocations,
    effective_speedups,
    power_mean,
    restart_penalty,
)

try:  # the goodput model may be absent in a partial checkout
    from adaptdl_core.goodput import GoodputFunction, GradParams, PerfParams
except ImportError:  # pragma: no cover
    GoodputFunction = None

P = -1.0
NODE = {"GPU": 8, "CPU": 64}          # an 8-GPU node (the traces' nodes had 4 T4s)
REPLICA = {"GPU": 1, "CPU": 4}

# Throughput parameters fitted to placements.csv by benchmarks/fit_accuracy.py
# (alpha_c, beta_c, alpha_n, beta_n, alpha_r, beta_r, gamma), and per model:
# initial batch M0, largest batch, per-replica batch range (from the traces).
TRACE_MODELS = {
    "bert": ((0.169, 0.05862, 1.374, 0.01421, 0.2838, 0.03273, 2.012), 12, 384, (4, 12)),
    "cifar10": ((0.01727, 0.0007029, 0.1223, 0.002399, 0.03009, 0.003447, 2.059),
                128, 4096, (32, 1024)),
    "imagenet": ((0.06417, 0.004484, 0.3062, 0.00555, 0.07917, 0.00505, 2.67),
                 200, 12800, (20, 200)),
    "ncf": ((0.006925, 6.318e-07, 0.01544, 0.0004214, 0.003387, 0.0009702, 1.0),
            256, 32768, (32, 32768)),
}
TRACE_DIRS = [ROOT / "adaptdl_core" / "sim" / "data" / "traces"]  # vendored (see its README)


# ---------------------------------------------------------------------------------------
# Speedup functions.

def _grad_samples() -> Dict[str, List[Tuple[float, float]]]:
    """(grad_sqr, grad_var) rows of each model's smallest-batch validation run."""
    out: Dict[str, List[Tuple[float, float]]] = {}
    for model, (_, m0, _, _) in TRACE_MODELS.items():
        for d in TRACE_DIRS:
            path = d / model / f"validation-{m0}.csv"
            if path.exists():
                with open(path, newline="") as f:
                    rows = [(float(r["grad_sqr"]), float(r["grad_var"]))
                            for r in csv.DictReader(f)]
                out[model] = [r for r in rows if r[0] > 0 and r[1] > 0]
                break
    return out


class SpeedupFactory:
    """Builds realistic speedup functions (trace-fitted goodput) or synthetic ones."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.grads = _grad_samples() if GoodputFunction is not None else {}
        self.real = bool(self.grads)

    @property
    def kind(self) -> str:
        return ("real GoodputFunction, Pollux-trace parameters" if self.real
                else "synthetic concave curves")

    def __call__(self) -> Callable:
        rng = self.rng
        if self.real:
            model = str(rng.choice(sorted(self.grads)))
            perf, m0, max_bsz, bsz_range = TRACE_MODELS[model]
            rows = self.grads[model]
            sqr, var = rows[int(rng.integers(0, len(rows)))]
            goodput = GoodputFunction(PerfParams(*perf), GradParams(sqr, var), m0)
            return SpeedupFunction(goodput, max_batch_size=max_bsz, atomic_bsz_range=bsz_range,
                                   accumulation=True)
        c, multi, sat = rng.uniform(0.0, 0.3), rng.uniform(0.6, 0.95), int(rng.integers(2, 64))

        def fn(n, k, c=c, multi=multi, sat=sat):
            n, k = np.asarray(n), np.asarray(k)
            kk = np.minimum(k, sat)
            s = kk / (1.0 + c * (kk - 1.0)) * np.where(n > 1, multi, 1.0)
            return np.where((k > 0) & (n >= 1) & (n <= k), s, 0.0)

        return fn


def make_cluster(rng, factory, n_jobs: int, n_nodes: int, now: float, mixed: bool = False):
    nodes = {f"node{i}": NodeInfo(dict(NODE)) for i in range(n_nodes)}
    jobs = {}
    for i in range(n_jobs):
        res = dict(REPLICA)
        if mixed and i % 3 == 0:
            res = {"CPU": int(rng.choice([2, 4, 8]))}      # CPU-only jobs
        jobs[f"job{i}"] = JobInfo(res, factory(),
                                  creation_timestamp=now - float(rng.uniform(60, 6 * 3600)),
                                  num_restarts=int(rng.integers(0, 4)),
                                  restart_cost_s=float(rng.uniform(15, 120)))
    return jobs, nodes


# ---------------------------------------------------------------------------------------
# Objective helpers shared by the comparisons.

def objective(speedups, p: float) -> Tuple[float, float]:
    """(idle jobs if p <= 0, power mean of the running jobs); larger second part is better."""
    s = np.asarray(list(speedups), dtype=float)
    pos = s > 0
    idle = float((~pos).sum()) if p <= 0 else 0.0
    running = s[pos] if p <= 0 else s
    return idle, power_mean(running, p) if running.size else 0.0


def better_or_equal(a, b, rel=1e-6) -> bool:
    return a[0] < b[0] or (a[0] == b[0] and a[1] >= b[1] * (1 - rel))


# ---------------------------------------------------------------------------------------
# Genetic algorithm (the original's search method), vectorised over the population.

class GeneticAllocator:
    """GA over integer allocation matrices (jobs x nodes), same objective and constraints."""

    def __init__(self, jobs, nodes, base, p, now, population=100, generations=100, seed=0):
        self.rng = np.random.default_rng(seed)
        self.pop, self.gens, self.p = population, generations, p
        self.jk, self.nk = list(jobs), list(nodes)
        J, M = len(self.jk), len(self.nk)
        res = sorted({r for n in nodes.values() for r in n.resources}
                     | {r for j in jobs.values() for r in j.resources})
        self.req = np.array([[jobs[j].resources.get(r, 0.0) for r in res] for j in self.jk])
        self.cap = np.array([[nodes[n].resources.get(r, 0.0) for r in res] for n in self.nk])
        self.base = np.zeros((J, M), dtype=np.int64)
        for j, key in enumerate(self.jk):
            for n in base.get(key, []):
                self.base[j, self.nk.index(n)] += 1
        self.has_base = self.base.sum(1) > 0
        self.pinned = np.array([not jobs[k].preemptible for k in self.jk]) & self.has_base
        self.factor = np.array([restart_penalty(jobs[k], now) for k in self.jk])
        self.minr = np.array([max(jobs[k].min_replicas, 1) for k in self.jk])
        self.maxr = np.array([jobs[k].max_replicas or 10 ** 9 for k in self.jk])
        with np.errstate(divide="ignore", invalid="ignore"):
            per_node = np.where(self.req[:, None, :] > 0,
                                self.cap[None] / self.req[:, None, :], np.inf).min(-1)
        self.fit = np.floor(per_node + 1e-9).astype(np.int64)          # (J, M)
        node_pre = np.array([nodes[n].preemptible for n in self.nk])
        np_jobs = np.array([not jobs[k].preemptible for k in self.jk])
        self.fit[np_jobs[:, None] & node_pre[None, :]] = 0
        self.kmax = np.minimum(self.fit.sum(1), self.maxr)
        kcap = int(self.kmax.max(initial=1))
        # Dense speedup tables S[j, N, K]. Every speedup model used here (the goodput model
        # and the synthetic curves) depends on N only through N == 1 vs N > 1, so N = 1
        # and N = 2 are evaluated and N = 2 is copied to larger N.
        self.table = np.zeros((J, M + 1, kcap + 1))
        for j, key in enumerate(self.jk):
            kk = np.arange(1, int(self.kmax[j]) + 1)
            if kk.size == 0:
                continue
            one = np.asarray(jobs[key].speedup_fn(np.ones_like(kk), kk), dtype=float)
            two = np.asarray(jobs[key].speedup_fn(np.minimum(2, kk), kk), dtype=float)
            self.table[j, 1, kk] = one
            for n in range(2, M + 1):
                self.table[j, n, kk] = np.where(kk >= n, two, 0.0)

    def _score(self, P):
        K = P.sum(2)
        N = (P > 0).sum(2)
        J = P.shape[1]
        S = self.table[np.arange(J)[None, :], N, np.minimum(K, self.table.shape[2] - 1)]
        changed = np.any(P != self.base[None], axis=2) & self.has_base[None]
        S = np.where(changed, S * self.factor[None], S)
        pos = S > 0
        safe = np.where(pos, S, 1.0)
        if self.p > 0:
            return np.zeros(len(P)), -np.where(pos, safe ** self.p, 0).sum(1), S
        term = -np.log(safe) if self.p == 0 else safe ** self.p
        return (~pos).sum(1).astype(float), np.where(pos, term, 0).sum(1), S

    def _repair(self, P):
        rng = self.rng
        P = np.maximum(P, 0)
        P = np.minimum(P, self.fit[None])
        P[:, self.pinned] = self.base[self.pinned]
        free = self.cap - np.einsum("jn,jr->nr", self.base[self.pinned].astype(float),
                                    self.req[self.pinned])
        mov = ~self.pinned
        K = P.sum(2)
        over = (K > self.maxr[None]) & mov[None]
        scale = np.where(over, self.maxr[None] / np.maximum(K, 1), 1.0)
        P = np.where(mov[None, :, None], np.floor(P * scale[:, :, None]), P).astype(np.int64)
        use = np.einsum("pjn,jr->pnr", (P * mov[None, :, None]).astype(float), self.req)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(use > 0, free[None] / use, np.inf).min(-1)
        f = np.minimum(ratio, 1.0)
        P = np.where(mov[None, :, None], np.floor(P * f[:, None, :] + 1e-9), P).astype(np.int64)
        # Interference: keep one multi-node job per node (pinned ones first, else largest).
        N = (P > 0).sum(2)
        multi = (N > 1)[:, :, None] & (P > 0)
        bad = multi.sum(1) > 1
        if bad.any():
            score = np.where(multi, P + 1e6 * self.pinned[None, :, None]
                             + rng.random(P.shape) * 0.5, -1.0)
            keeper = score.argmax(1)
            jidx = np.arange(P.shape[1])[None, :, None]
            drop = multi & bad[:, None, :] & (jidx != keeper[:, None, :]) & mov[None, :, None]
            P = np.where(drop, 0, P)
        K = P.sum(2)
        P = np.where(((K > 0) & (K < self.minr[None]) & mov[None])[:, :, None], 0, P)
        return P

    def run(self):
        rng = self.rng
        J, M = self.base.shape
        density = min(1.0, self.fit.sum() / max(J * M, 1) / max(self.fit.max(initial=1), 1))
        P = rng.integers(0, 3, size=(self.pop, J, M)) * (rng.random((self.pop, J, M)) < density)
        P[0] = self.base
        P = self._repair(P)
        for _ in range(self.gens):
            z, g, _ = self._score(P)
            order = np.lexsort((g, z))
            P = P[order]
            z, g = z[order], g[order]
            elite = max(1, self.pop // 10)
            n_child = self.pop - elite
            # Tournament selection of two parents per child (rank-based: lower is better).
            a = np.minimum(rng.integers(0, self.pop, n_child), rng.integers(0, self.pop, n_child))
            b = np.minimum(rng.integers(0, self.pop, n_child), rng.integers(0, self.pop, n_child))
            mask = rng.random((n_child, J)) < 0.5
            child = np.where(mask[:, :, None], P[a], P[b])
            mut = rng.random((n_child, J)) < max(0.1, 1.0 / J)
            node = rng.integers(0, M, size=(n_child, J))
            delta = rng.choice(np.array([-1, 1, 2]), size=(n_child, J)) * mut
            child[np.arange(n_child)[:, None], np.arange(J)[None, :], node] += delta
            wipe = rng.random((n_child, J)) < 0.01
            child = np.where(wipe[:, :, None], 0, child)
            P = np.concatenate([P[:elite], self._repair(child)])
        z, g, S = self._score(P)
        best = np.lexsort((g, z))[0]
        counts = P[best]
        return {k: [self.nk[n] for n in range(M) for _ in range(int(counts[j, n]))]
                for j, k in enumerate(self.jk)}


# ---------------------------------------------------------------------------------------
# Brute force for small instances.

def brute_force(jobs, nodes, base, p, now):
    jk, nk = list(jobs), list(nodes)
    per = []
    for n in nk:
        out = []

        def rec(j, cur, used):
            if j == len(jk):
                out.append(tuple(cur))
                return
            c = 0
            while all(used.get(r, 0) + c * v <= nodes[n].resources.get(r, 0) + 1e-9
                      for r, v in jobs[jk[j]].resources.items()):
                cur.append(c)
                rec(j + 1, cur, {r: used.get(r, 0) + c * v
                                 for r, v in jobs[jk[j]].resources.items()} | {
                    r: used[r] for r in used if r not in jobs[jk[j]].resources})
                cur.pop()
                c += 1

        rec(0, [], {})
        per.append(np.array(out, dtype=np.int64).reshape(-1, len(jk)))
    if math.prod(len(c) for c in per) > 300_000:
        return None
    best = None
    ga = GeneticAllocator(jobs, nodes, base, p, now, population=1, generations=0)
    grids = np.meshgrid(*[np.arange(len(c)) for c in per], indexing="ij")
    idx = np.stack([g.ravel() for g in grids], -1)
    counts = np.stack([per[n][idx[:, n]] for n in range(len(nk))], axis=-1)
    valid = np.all(ga._repair(counts) == counts, axis=(1, 2))  # repair = identity iff valid
    z, g, S = ga._score(counts[valid])
    order = np.lexsort((g, z))
    best = objective(S[order[0]], p)
    return best


# ---------------------------------------------------------------------------------------
# The three measurements.

def time_round(policy, jobs, nodes, base, now):
    t0 = time.perf_counter()
    result = policy.allocate(jobs, nodes, base, now=now)
    return time.perf_counter() - t0, result


def decision_times(rng, factory, sizes, reps):
    rows = []
    policy = PolluxPolicy(P)
    for n_jobs, n_nodes, mixed in sizes:
        now = 100_000.0
        jobs, nodes = make_cluster(rng, factory, n_jobs, n_nodes, now, mixed)
        cold, first = time_round(policy, jobs, nodes, {}, now)
        check_allocations(jobs, nodes, first.allocations)
        warm_times, base, result = [], first.allocations, first
        for r in range(reps):
            now += 60
            t, result = time_round(policy, jobs, nodes, base, now)
            warm_times.append(t)
            base = result.allocations
        moved = sum(result.allocations[k] != first.allocations[k] for k in jobs)
        # Churn: 1/8 of the jobs finish and as many new ones arrive.
        gone = list(jobs)[:: 8]
        jobs2 = {k: v for k, v in jobs.items() if k not in gone}
        new, _ = make_cluster(rng, factory, len(gone), 0, now)
        jobs2.update({f"new{k}": v for k, v in new.items()})
        churn, res3 = time_round(policy, jobs2, nodes, base, now + 60)
        check_allocations(jobs2, nodes, res3.allocations, base)
        rows.append((n_jobs, n_nodes, mixed, cold, statistics.median(warm_times), churn,
                     first, result, res3, moved))
    return rows


def versus_brute_force(rng, factory, n_instances):
    """Ours and the GA against the exhaustive optimum on small random instances."""
    stats = {"total": 0, "ours": 0, "ga": 0, "certified": 0, "worst": 0.0, "ga_worst": 0.0,
             "t_ours": 0.0, "t_ga": 0.0}

    def gap(a, best):
        if better_or_equal(a, best):
            return 0.0
        return math.inf if a[0] != best[0] else 1 - a[1] / best[1]

    for _ in range(n_instances * 3):
        if stats["total"] >= n_instances:
            break
        n_jobs, n_nodes = int(rng.integers(2, 6)), int(rng.integers(1, 4))
        nodes = {f"n{i}": NodeInfo({"GPU": int(rng.integers(1, 4)),
                                    "CPU": int(rng.integers(4, 13))})
                 for i in range(n_nodes)}
        now = 50_000.0
        jobs = {}
        for i in range(n_jobs):
            res = ({"GPU": 1, "CPU": 4} if rng.random() < 0.75
                   else {"CPU": int(rng.integers(1, 4))})
            jobs[f"j{i}"] = JobInfo(res, factory(), now - float(rng.uniform(60, 20000)),
                                    min_replicas=int(rng.integers(0, 2)),
                                    preemptible=bool(rng.random() < 0.85),
                                    num_restarts=int(rng.integers(0, 3)),
                                    restart_cost_s=float(rng.uniform(15, 120)))
        prev = PolluxPolicy(1.0).optimize(jobs, nodes, {}, now=now - 1000)
        base = {k: v for k, v in prev.items() if rng.random() < 0.7}
        p = float(rng.choice([-1.0, 0.0, 1.0]))
        best = brute_force(jobs, nodes, base, p, now)
        if best is None:
            continue
        t0 = time.perf_counter()
        res = PolluxPolicy(p).allocate(jobs, nodes, base, now=now)
        stats["t_ours"] += time.perf_counter() - t0
        t0 = time.perf_counter()
        ga_alloc = GeneticAllocator(jobs, nodes, base, p, now, seed=stats["total"]).run()
        stats["t_ga"] += time.perf_counter() - t0
        ga = objective(effective_speedups(jobs, nodes, ga_alloc, base, now=now).values(), p)
        ours = objective(res.speedups.values(), p)
        stats["total"] += 1
        stats["certified"] += res.optimal
        for name, val in (("ours", ours), ("ga", ga)):
            g = gap(val, best)
            stats[name] += g == 0.0
            key = "worst" if name == "ours" else "ga_worst"
            stats[key] = max(stats[key], g)
    return stats


def versus_ga(rng, factory, sizes, seeds):
    rows = []
    for n_jobs, n_nodes in sizes:
        for s in range(seeds):
            now = 100_000.0
            jobs, nodes = make_cluster(rng, factory, n_jobs, n_nodes, now)
            # Compare on a steady-state round: base = an earlier allocation.
            base = PolluxPolicy(1.0).optimize(jobs, nodes, {}, now=now - 600)
            t0 = time.perf_counter()
            ours = PolluxPolicy(P).allocate(jobs, nodes, base, now=now)
            t_ours = time.perf_counter() - t0
            ga = GeneticAllocator(jobs, nodes, base, P, now, seed=s)
            t0 = time.perf_counter()
            ga_alloc = ga.run()
            t_ga = time.perf_counter() - t0
            check_allocations(jobs, nodes, ga_alloc, base)
            ga_obj = objective(effective_speedups(jobs, nodes, ga_alloc, base, now=now).values(), P)
            our_obj = objective(ours.speedups.values(), P)
            rows.append((n_jobs, n_nodes, s, our_obj, ga_obj, t_ours, t_ga, ours.gap))
    return rows


def fmt_obj(o):
    return f"{o[1]:.3f}" + (f" ({int(o[0])} idle)" if o[0] else "")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller run (under 30 s)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    factory = SpeedupFactory(rng)
    t_start = time.perf_counter()
    print(f"# Pollux allocator benchmark ({'quick' if args.quick else 'full'}, seed "
          f"{args.seed}, p = {P}, speedups: {factory.kind})\n")

    if args.quick:
        sizes = [(16, 4, False), (64, 16, False), (256, 64, False)]
        reps = 3
    else:
        sizes = [(j, m, False) for j in (16, 64, 256) for m in (4, 16, 64)]
        sizes.append((64, 16, True))
        reps = 5
    print("## Decision time per round (ms)\n")
    print("| jobs | nodes | cold (1st round) | warm (steady) | churn (1/8 new) "
          "| optimal (cold/warm/churn) | fitness (warm) | idle | restarted after warm rounds |")
    print("|---:|---:|---:|---:|---:|:---:|---:|---:|---:|")
    for (n_jobs, n_nodes, mixed, cold, warm, churn, first, res, res3, moved) in decision_times(
            rng, factory, sizes, reps):
        flags = "/".join("yes" if r.optimal else "no" for r in (first, res, res3))
        label = f"{n_jobs}{' (mixed)' if mixed else ''}"
        print(f"| {label} | {n_nodes} | {cold * 1e3:.1f} | {warm * 1e3:.1f} | "
              f"{churn * 1e3:.1f} | {flags} | {objective(res.speedups.values(), P)[1]:.3f} | "
              f"{res.num_idle} | {moved} |")

    n_bf = 10 if args.quick else 40
    st = versus_brute_force(rng, factory, n_bf)
    n = max(st["total"], 1)
    print("\n## Versus brute force (<= 5 jobs, <= 3 nodes, mixed resources, base allocations,"
          " p in {-1, 0, 1})\n")
    print("| instances | ours = optimum | ours certified | ours worst gap | ours mean ms "
          "| GA = optimum | GA worst gap | GA mean ms |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    print(f"| {st['total']} | {st['ours']} | {st['certified']} | {st['worst']:.2%} | "
          f"{st['t_ours'] / n * 1e3:.1f} | {st['ga']} | {st['ga_worst']:.2%} | "
          f"{st['t_ga'] / n * 1e3:.0f} |")

    ga_sizes = [(16, 4), (64, 16)] if args.quick else [(16, 4), (16, 16), (64, 16), (64, 64),
                                                        (256, 64)]
    seeds = 1 if args.quick else 2
    print("\n## Versus a genetic algorithm (population 100 x 100 generations), p = -1\n")
    print("| jobs | nodes | seed | ours: power mean | GA: power mean | ours vs GA "
          "| ours (ms) | GA (ms) | ours: gap to bound |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n_jobs, n_nodes, s, ours, ga, t_o, t_g, gap in versus_ga(rng, factory, ga_sizes, seeds):
        if ours[0] != ga[0]:
            rel = f"{int(ga[0] - ours[0]):+d} running"
        else:
            rel = f"{ours[1] / ga[1] - 1:+.1%}"
        print(f"| {n_jobs} | {n_nodes} | {s} | {fmt_obj(ours)} | {fmt_obj(ga)} | {rel} | "
              f"{t_o * 1e3:.1f} | {t_g * 1e3:.0f} | "
              f"{'0 (optimal)' if gap == 0 else format(gap, '.2%')} |")
    print(f"\n(total benchmark time {time.perf_counter() - t_start:.1f} s, "
          f"{os.cpu_count()} CPUs)")


if __name__ == "__main__":
    main()
