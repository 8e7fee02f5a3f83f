"""Pollux cluster allocation: which job gets how many replicas on which nodes.

Inputs are plain data: :class:`JobInfo` per job (per-replica resources, a speedup
function, age, replica limits, restart history) and :class:`NodeInfo` per node (capacity).
An *allocation* of a job is a list of node keys with one entry per replica (a node appears
as many times as the job has replicas on it; ``[]`` means the job does not run). The
allocator maximises the power-mean fitness (Pollux)::

    FITNESS_p(A) = ((1/J) * sum_j S_j(A_j) ** p) ** (1/p)      (p = 0: geometric mean)

where ``S_j`` is the job's speedup at the ``(num_nodes, num_replicas)`` shape of ``A_j``,
multiplied by the re-allocation penalty of :func:`restart_penalty` when ``A_j`` differs
from the job's current ("base") allocation. ``p = -1`` (harmonic mean, the default) is
fair; more negative is fairer; ``p = 1`` maximises the plain sum (utilitarian).

For ``p <= 0`` a job with speedup 0 makes the power mean 0 whatever the others get, so the
objective is made lexicographic (the limit of letting idle jobs' speedups tend to 0):
first run as many jobs as possible, then maximise the power mean of the running ones.

Constraints, all hard: node capacity for every resource type; a job runs ``0`` replicas
or between ``min_replicas`` and ``max_replicas``; a non-preemptible job that is running
keeps exactly its base allocation (and a non-preemptible job is never placed on a
preemptible node); at most one multi-node job (replicas on more than one node) per node.

How it is solved, and what is exact:

1. *Counts by dynamic programming.* The objective is separable over jobs, so with each
   job's value at ``K`` replicas taken as an upper bound over all its placements (its
   unpenalised base allocation, or the penalised speedup at the fewest nodes ``N_min``
   that can hold ``K`` replicas or at ``N_min + 1``), a knapsack DP over jobs x capacity
   finds the best replica counts of that relaxation exactly. When all movable jobs
   request the same per-replica resources ("slot" case, e.g. every trial of a Tune
   experiment) capacity is counted in replica slots per node, which also accounts for
   per-node rounding. With mixed requests the DP runs over aggregate capacity of the (at
   most three) binding resource types; this relaxation ignores per-node fragmentation.
   The bound is valid when more nodes than ``N_min + 1`` never beat both ``N_min`` and
   ``N_min + 1``: true for speedups non-increasing in the node count
   (:class:`~.speedup.LinearSpeedup`) and for the Pollux goodput model, which depends on
   the node count only through ``N == 1`` vs ``N > 1``.
   Exact reductions keep the DP small: dominated options are pruned; for ``p <= 0`` a job
   never takes more than the capacity left once the most jobs that can run have their
   minimum; if every job can run, idling is not considered; and Lagrangian reduced-cost
   fixing drops options that cannot appear in any solution as good as a known one. Only
   if the DP still exceeds ``max_dp_cells`` is it made heuristic (a geometric subset of
   replica counts, or coarser resource units with mixed requests); it then gives no bound.
2. *Packing.* Replicas are placed on nodes: unchanged allocations first, then the largest
   jobs, each on a single node when one fits (best fit), else on the fewest nodes not
   already hosting another multi-node job.
3. *Certificate.* If the packed allocation attains the DP bound it is **optimal**
   (``AllocationResult.optimal``). Otherwise (fragmentation, interference, mixed requests)
   the better of three starts (this packing, the packing of a second DP that charges
   multi-node shapes the whole nodes they span, and the status quo) is improved by a
   bounded local search on the true objective (re-pack two nodes so that split jobs fit
   on one; re-place one job; re-place a receiver and a donor jointly), and for at most 12
   movable jobs a depth-first branch and bound over placements (up to node symmetry,
   pruned by DP bounds on the remaining jobs) runs within ``max_bnb_nodes``. When it
   completes the result is **optimal**: small instances (a few jobs and nodes) complete.
   Otherwise the result is **heuristic** and ``AllocationResult.gap`` bounds its loss
   against the relaxation. "Optimal" is up to the ``min_gain`` rule below (relative 1e-6).

Hysteresis falls out of the penalty: moving a running job only pays when the fitness gain
beats its restart cost. In addition an unchanged allocation wins near-ties (a relative
``1e-6`` preference) and an extra replica is only taken for a relative speedup gain above
``min_gain``, so floating-point noise never moves or grows a job.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Callable, Dict, Hashable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

__all__ = [
    "DEFAULT_RESTART_COST_S",
    "JobInfo",
    "NodeInfo",
    "AllocationResult",
    "PolluxPolicy",
    "optimize",
    "restart_penalty",
    "power_mean",
    "effective_speedups",
    "check_allocations",
]

#: Restart cost (seconds) assumed when a job has not measured its own. Pollux reports
#: 15-120 s per checkpoint-restart; a 2-worker torch trial on Ray measured 8-16 s on a small
#: machine. 30 s sits in the middle of the measured range.
DEFAULT_RESTART_COST_S = 30.0

# Relative preference for an unchanged allocation, so that near-ties never move a job.
_KEEP_BONUS = 1e-6
# Tolerance when flooring capacity / request ratios (float resources such as 0.5 CPU).
_FIT_EPS = 1e-9
# Relative tolerance on the objective for "strictly better" in the local search and the
# optimality certificate.
_OBJ_TOL = 1e-9
# Branch and bound only runs for at most this many movable jobs.
_BNB_MAX_JOBS = 12

SpeedupFn = Callable[[np.ndarray, np.ndarray], Any]
Allocations = Dict[Hashable, List[Hashable]]


# ---------------------------------------------------------------------------------------
# Input records.

def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _is_real(value: Any) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(
        value, (bool, np.bool_))


def _check_resources(owner: str, resources: Any, need_positive: bool) -> Dict[str, float]:
    if not isinstance(resources, Mapping):
        raise ValueError(f"{owner}.resources must be a dict of resource name -> amount, "
                         f"got {type(resources).__name__}")
    out: Dict[str, float] = {}
    for name, amount in resources.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"{owner}.resources: resource names must be non-empty strings, "
                             f"got {name!r}")
        if not _is_real(amount) or not math.isfinite(float(amount)) or float(amount) < 0:
            raise ValueError(f"{owner}.resources[{name!r}] must be a finite number >= 0, "
                             f"got {amount!r}")
        out[name] = float(amount)
    if need_positive and not any(v > 0 for v in out.values()):
        raise ValueError(f"{owner}.resources must request a positive amount of at least one "
                         f"resource, got {dict(resources)!r}")
    return out


@dataclass
class JobInfo:
    """What the allocator knows about one job.

    Attributes:
        resources: resources one replica needs, e.g. ``{"CPU": 1}`` or
            ``{"GPU": 1, "CPU": 4}`` (amounts may be fractional; at least one positive).
        speedup_fn: vectorised ``f(num_nodes, num_replicas) -> speedup`` (see
            :mod:`adaptdl_core.policy.speedup`), 0 at 0 replicas.
        creation_timestamp: when the job was submitted, seconds (same clock as ``now``).
        min_replicas: fewest replicas the job may run with when it runs (``>= 0``); below
            that it waits with 0 replicas.
        max_replicas: most replicas it may use; ``None`` means only the cluster limits it.
        preemptible: ``False`` pins a running job to its current allocation and keeps it
            off preemptible nodes.
        num_restarts: checkpoint-restarts the job has gone through so far (``>= 0``).
        restart_cost_s: measured seconds one checkpoint-restart costs the job (``>= 0``);
            defaults to :data:`DEFAULT_RESTART_COST_S` when unknown.

    Raises:
        ValueError: when a field is malformed; the message names the field.
    """

    resources: Mapping[str, float]
    speedup_fn: SpeedupFn
    creation_timestamp: float
    min_replicas: int = 0
    max_replicas: Optional[int] = None
    preemptible: bool = True
    num_restarts: int = 0
    restart_cost_s: float = DEFAULT_RESTART_COST_S

    def __post_init__(self) -> None:
        self.resources = _check_resources("JobInfo", self.resources, need_positive=True)
        if not callable(self.speedup_fn):
            raise ValueError("JobInfo.speedup_fn must be callable(num_nodes, num_replicas), "
                             f"got {type(self.speedup_fn).__name__}")
        if not _is_real(self.creation_timestamp) or not math.isfinite(
                float(self.creation_timestamp)):
            raise ValueError("JobInfo.creation_timestamp must be a finite number of seconds, "
                             f"got {self.creation_timestamp!r}")
        self.creation_timestamp = float(self.creation_timestamp)
        if not _is_int(self.min_replicas) or self.min_replicas < 0:
            raise ValueError(f"JobInfo.min_replicas must be an integer >= 0, "
                             f"got {self.min_replicas!r}")
        self.min_replicas = int(self.min_replicas)
        if self.max_replicas is not None:
            if not _is_int(self.max_replicas) or self.max_replicas < 0:
                raise ValueError(f"JobInfo.max_replicas must be None or an integer >= 0, "
                                 f"got {self.max_replicas!r}")
            self.max_replicas = int(self.max_replicas)
            if self.max_replicas < self.min_replicas:
                raise ValueError(f"JobInfo.max_replicas ({self.max_replicas}) must be >= "
                                 f"min_replicas ({self.min_replicas})")
        if not isinstance(self.preemptible, (bool, np.bool_)):
            raise ValueError(f"JobInfo.preemptible must be a bool, got {self.preemptible!r}")
        self.preemptible = bool(self.preemptible)
        if not _is_int(self.num_restarts) or self.num_restarts < 0:
            raise ValueError(f"JobInfo.num_restarts must be an integer >= 0, "
                             f"got {self.num_restarts!r}")
        self.num_restarts = int(self.num_restarts)
        if self.restart_cost_s is None:
            self.restart_cost_s = DEFAULT_RESTART_COST_S
        if not _is_real(self.restart_cost_s) or not math.isfinite(
                float(self.restart_cost_s)) or self.restart_cost_s < 0:
            raise ValueError(f"JobInfo.restart_cost_s must be a finite number >= 0, "
                             f"got {self.restart_cost_s!r}")
        self.restart_cost_s = float(self.restart_cost_s)


@dataclass
class NodeInfo:
    """One node's capacity.

    Attributes:
        resources: amounts available to jobs, e.g. ``{"CPU": 32, "GPU": 4}``.
        preemptible: whether the node may disappear (spot instance); non-preemptible jobs
            are never placed on it.

    Raises:
        ValueError: when a field is malformed; the message names the field.
    """

    resources: Mapping[str, float]
    preemptible: bool = False

    def __post_init__(self) -> None:
        self.resources = _check_resources("NodeInfo", self.resources, need_positive=False)
        if not isinstance(self.preemptible, (bool, np.bool_)):
            raise ValueError(f"NodeInfo.preemptible must be a bool, got {self.preemptible!r}")
        self.preemptible = bool(self.preemptible)


def restart_penalty(job: JobInfo, now: float) -> float:
    """Factor in ``[0, 1]`` on a job's speedup when its allocation changes (Pollux).

    ``max(T - R * delta, 0) / (T + delta)`` with ``T = now - creation_timestamp`` (its age,
    seconds, floored at 0), ``R`` its restarts so far and ``delta`` its restart cost: the
    share of its life spent training if it restarts once more. A young job, or one that
    already restarted often, is expensive to move. Returns 1 when ``T + delta == 0``.
    """
    age = max(float(now) - job.creation_timestamp, 0.0)
    delta = job.restart_cost_s
    if age + delta <= 0.0:
        return 1.0
    return max(age - job.num_restarts * delta, 0.0) / (age + delta)


def power_mean(values: Sequence[float], p: float) -> float:
    """Power mean ``((1/n) sum v**p) ** (1/p)`` of non-negative values (geometric for p=0).

    With ``p <= 0`` any zero value makes the mean 0. An empty sequence gives 0.

    Raises:
        ValueError: if ``p`` is not finite or a value is negative or not finite.
    """
    p = _check_p(p)
    arr = np.asarray(list(values), dtype=np.float64)
    if arr.size == 0:
        return 0.0
    if not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise ValueError(f"values must be finite and >= 0, got {arr!r}")
    if p <= 0 and np.any(arr == 0):
        return 0.0
    if p == 0:
        return float(np.exp(np.mean(np.log(arr))))
    return float(np.mean(arr ** p) ** (1.0 / p))


def _check_p(p: Any) -> float:
    if not _is_real(p) or not math.isfinite(float(p)):
        raise ValueError(f"p must be a finite number (e.g. -1 fair, 0 geometric, 1 utilitarian), "
                         f"got {p!r}")
    return float(p)


@dataclass(frozen=True)
class AllocationResult:
    """An allocation and how good it is.

    Attributes:
        allocations: job key -> list of node keys, one entry per replica (``[]``: idle).
        speedups: job key -> effective speedup (speedup at its shape times the restart
            penalty when its allocation changed).
        fitness: power mean of ``speedups`` over all jobs (0 if a job idles and ``p <= 0``).
        num_idle: jobs with effective speedup 0.
        optimal: ``True`` when the result provably attains the best objective (it matches
            the dynamic programme's relaxation bound, or the branch and bound completed),
            up to the ``min_gain`` tolerance.
        gap: ``1 - fitness_of_running_jobs / bound``, an upper bound on the relative loss
            against the optimum (0 when optimal; ``inf`` when the relaxation runs more
            jobs; ``nan`` when the DP had to be thinned and gives no bound).
        solve_time_s: wall-clock seconds spent in the allocator.
        details: diagnostics (capacity model, DP size, stage that produced the result,
            search effort, bound and objective); the keys are not a stable API.
    """

    allocations: Allocations
    speedups: Dict[Hashable, float]
    fitness: float
    num_idle: int
    optimal: bool
    gap: float
    solve_time_s: float = 0.0
    details: Dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------
# Internal problem representation.

class _Problem:
    """Validated, index-based view of one allocation round."""

    def __init__(self, jobs: Mapping[Hashable, JobInfo], nodes: Mapping[Hashable, NodeInfo],
                 base_allocations: Optional[Mapping[Hashable, Sequence[Hashable]]],
                 p: float, now: Optional[float]) -> None:
        if not isinstance(jobs, Mapping):
            raise ValueError(f"jobs must be a dict of key -> JobInfo, got {type(jobs).__name__}")
        if not isinstance(nodes, Mapping):
            raise ValueError(f"nodes must be a dict of key -> NodeInfo, "
                             f"got {type(nodes).__name__}")
        if base_allocations is None:
            base_allocations = {}
        if not isinstance(base_allocations, Mapping):
            raise ValueError("base_allocations must be a dict of job key -> list of node keys, "
                             f"got {type(base_allocations).__name__}")
        for key, job in jobs.items():
            if not isinstance(job, JobInfo):
                raise ValueError(f"jobs[{key!r}] must be a JobInfo, got {type(job).__name__}")
        for key, node in nodes.items():
            if not isinstance(node, NodeInfo):
                raise ValueError(f"nodes[{key!r}] must be a NodeInfo, got {type(node).__name__}")
        self.p = _check_p(p)
        if now is None:
            now = time.time()
        if not _is_real(now) or not math.isfinite(float(now)):
            raise ValueError(f"now must be a finite number of seconds or None, got {now!r}")
        self.now = float(now)

        # Jobs in age order (oldest first): on exact ties the DP lets younger jobs yield.
        all_keys = list(jobs.keys())
        order = sorted(range(len(all_keys)),
                       key=lambda i: (jobs[all_keys[i]].creation_timestamp, i))
        self.job_keys: List[Hashable] = [all_keys[i] for i in order]
        self.jobs: List[JobInfo] = [jobs[k] for k in self.job_keys]
        self.node_keys: List[Hashable] = list(nodes.keys())
        self.node_index = {k: i for i, k in enumerate(self.node_keys)}
        J, M = len(self.jobs), len(self.node_keys)
        self.J, self.M = J, M

        names = sorted({r for n in nodes.values() for r in n.resources}
                       | {r for j in self.jobs for r, v in j.resources.items() if v > 0})
        self.resource_names = names
        ridx = {r: i for i, r in enumerate(names)}
        self.cap = np.zeros((M, len(names)))
        for i, key in enumerate(self.node_keys):
            for r, v in nodes[key].resources.items():
                self.cap[i, ridx[r]] = v
        self.req = np.zeros((J, len(names)))
        for j, job in enumerate(self.jobs):
            for r, v in job.resources.items():
                if v > 0:
                    self.req[j, ridx[r]] = v
        node_pre = np.array([nodes[k].preemptible for k in self.node_keys], dtype=bool)
        self.eligible = np.ones((J, M), dtype=bool)
        for j, job in enumerate(self.jobs):
            if not job.preemptible:
                self.eligible[j] = ~node_pre

        self.min_r = np.array([max(j.min_replicas, 1) for j in self.jobs], dtype=np.int64)
        self.max_r = np.array([j.max_replicas if j.max_replicas is not None else 2 ** 40
                               for j in self.jobs], dtype=np.int64)

        # Base allocations.
        self.base_list: List[List[Hashable]] = []
        self.base = np.zeros((J, M), dtype=np.int64)
        self.base_known = np.zeros(J, dtype=bool)   # non-empty and every node still exists
        for j, key in enumerate(self.job_keys):
            alloc = base_allocations.get(key, [])
            if isinstance(alloc, (str, bytes)) or not isinstance(alloc, Sequence):
                raise ValueError(f"base_allocations[{key!r}] must be a list of node keys, "
                                 f"got {alloc!r}")
            alloc = list(alloc)
            self.base_list.append(alloc)
            known = True
            for node_key in alloc:
                try:
                    idx = self.node_index.get(node_key)
                except TypeError:
                    raise ValueError(f"base_allocations[{key!r}] holds an unhashable node key "
                                     f"{node_key!r}") from None
                if idx is None:
                    known = False
                else:
                    self.base[j, idx] += 1
            self.base_known[j] = known and len(alloc) > 0
        # A job whose old nodes vanished restarts whatever we decide: no penalty then.
        self.factor = np.array([restart_penalty(job, self.now) if self.base_known[j] else 1.0
                                for j, job in enumerate(self.jobs)])

        self.pinned = np.array([(not job.preemptible) and self.base_known[j]
                                for j, job in enumerate(self.jobs)], dtype=bool)
        pinned_use = (self.base[self.pinned][:, :, None]
                      * self.req[self.pinned][:, None, :]).sum(axis=0) if self.pinned.any() \
            else np.zeros_like(self.cap)
        self.free0 = self.cap - pinned_use
        over = np.argwhere(self.free0 < -1e-6 * np.maximum(self.cap, 1.0))
        if over.size:
            n, r = over[0]
            raise ValueError(f"base_allocations: the non-preemptible (pinned) jobs need more "
                             f"{names[r]!r} than node {self.node_keys[n]!r} has")
        self.free0 = np.maximum(self.free0, 0.0)
        self._cache: List[Dict[Tuple[int, int], float]] = [dict() for _ in range(J)]
        self._fits0: Dict[int, np.ndarray] = {}
        self.calls = 0

    # -- speedups and costs -------------------------------------------------------------
    def speedup(self, j: int, n_nodes: np.ndarray, n_replicas: np.ndarray) -> np.ndarray:
        """Raw speedups of job ``j`` at the given shapes (memoised per round, validated)."""
        n_nodes = np.asarray(n_nodes, dtype=np.int64).reshape(-1)
        n_replicas = np.asarray(n_replicas, dtype=np.int64).reshape(-1)
        cache = self._cache[j]
        if n_nodes.size == 1:
            key = (int(n_nodes[0]), int(n_replicas[0]))
            v = cache.get(key)
            if v is not None:
                return np.array([v])
        # Bulk (or missing) shapes: one vectorised call, then remember every value.
        self.calls += 1
        try:
            vals = np.asarray(self.jobs[j].speedup_fn(n_nodes, n_replicas), dtype=np.float64)
            if vals.shape != n_nodes.shape:
                vals = np.broadcast_to(vals, n_nodes.shape)
        except ValueError as exc:
            raise ValueError(f"jobs[{self.job_keys[j]!r}].speedup_fn failed: {exc}") from exc
        vals = np.where(n_replicas > 0, vals, 0.0)
        if not np.all(np.isfinite(vals)) or np.any(vals < 0):
            raise ValueError(f"jobs[{self.job_keys[j]!r}].speedup_fn must return finite "
                             f"speedups >= 0, got {vals!r} for replicas {n_replicas!r}")
        cache.update(zip(zip(n_nodes.tolist(), n_replicas.tolist()), vals.tolist()))
        return vals

    def effective(self, j: int, counts: np.ndarray) -> Tuple[float, float]:
        """(speedup used by the optimiser incl. keep bonus, reported effective speedup)."""
        k = int(counts.sum())
        if k == 0:
            return 0.0, 0.0
        n = int(np.count_nonzero(counts))
        raw = float(self.speedup(j, np.array([n]), np.array([k]))[0])
        if not self.base_known[j]:
            return raw, raw
        if np.array_equal(counts, self.base[j]):
            return raw * (1.0 + _KEEP_BONUS), raw
        eff = raw * self.factor[j]
        return eff, eff

    def cost(self, s: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """Per-job cost pair (idle flag, power term) to minimise, for speedups ``s``."""
        s = np.asarray(s, dtype=np.float64)
        pos = s > 0
        p = self.p
        safe = np.where(pos, s, 1.0)
        if p > 0:
            return np.zeros_like(s), np.where(pos, -(safe ** p), 0.0)
        z = (~pos).astype(np.float64)
        if p == 0:
            return z, np.where(pos, -np.log(safe), 0.0)
        return z, np.where(pos, safe ** p, 0.0)

    def fits0(self, j: int) -> np.ndarray:
        """``fits(j, free0)``, memoised: replicas of ``j`` each node holds besides pins."""
        out = self._fits0.get(j)
        if out is None:
            out = self._fits0[j] = self.fits(j, self.free0)
        return out

    def fits(self, j: int, free: np.ndarray) -> np.ndarray:
        """Replicas of job ``j`` each node could still hold given ``free`` capacity."""
        q = self.req[j]
        nz = q > 0
        ratio = np.floor(np.min(free[:, nz] / q[nz], axis=1) + _FIT_EPS)
        return np.where(self.eligible[j], np.maximum(ratio, 0.0), 0.0).astype(np.int64)


def _better(a: Tuple[float, float], b: Tuple[float, float]) -> bool:
    """Lexicographic "strictly better" (smaller) with a relative tolerance on the 2nd part."""
    if a[0] < b[0] - 0.5:
        return True
    if a[0] > b[0] + 0.5:
        return False
    return a[1] < b[1] - _OBJ_TOL * max(1.0, abs(b[1]))


# ---------------------------------------------------------------------------------------
# Per-job option tables.

@dataclass
class _Options:
    """Candidate (replica count, kind) options of one movable job after pruning."""

    k: np.ndarray          # replica counts
    keep: np.ndarray       # True: the unchanged base allocation
    s: np.ndarray          # optimistic effective speedup (incl. penalty / keep bonus)
    n_min: np.ndarray      # fewest nodes that can hold k replicas (relaxation)
    spread: np.ndarray     # True: k replicas do better on 2 nodes than on 1


def _job_options(prob: _Problem, j: int, kcap: Optional[int] = None
                 ) -> Tuple[_Options, np.ndarray]:
    """All options of job ``j`` (unpruned, sorted by K then keep-first) and its fits.

    ``kcap`` bounds the replica count (see ``_Solver._replica_caps``)."""
    fits = prob.fits0(j)
    total = int(fits.sum())
    kmin = int(prob.min_r[j])
    kmax = int(min(prob.max_r[j], total, kcap if kcap is not None else total))
    ks = np.arange(kmin, kmax + 1, dtype=np.int64) if kmax >= kmin else np.zeros(0, np.int64)
    cum = np.cumsum(np.sort(fits)[::-1])
    n_min = np.searchsorted(cum, ks, side="left").astype(np.int64) + 1
    # The optimistic value is the best of N_min and N_min + 1 nodes: exact for speedups
    # non-increasing in N, and for the Pollux model, where N matters only as N == 1 vs N > 1
    # (its fitted inter-node sync can beat intra-node sync at large K).
    n_alt = np.minimum(n_min + 1, np.minimum(ks, np.count_nonzero(fits)))
    if ks.size:
        both = prob.speedup(j, np.concatenate([n_min, n_alt]), np.concatenate([ks, ks]))
        s_min, s_alt = both[:ks.size], both[ks.size:]
    else:
        s_min = s_alt = np.zeros(0)
    spread = (s_alt > s_min) & (n_alt > n_min) & (n_min == 1)
    s_move = np.maximum(s_min, np.where(n_alt > n_min, s_alt, 0.0)) * prob.factor[j]
    k_list = [np.zeros(1, np.int64), ks]
    keep_list = [np.zeros(1, bool), np.zeros(ks.size, bool)]
    s_list = [np.zeros(1), s_move]
    n_list = [np.zeros(1, np.int64), n_min]
    spread_list = [np.zeros(1, bool), spread]
    kb = int(prob.base[j].sum())
    if (prob.base_known[j] and kmin <= kb <= prob.max_r[j]
            and (kcap is None or kb <= kcap) and np.all(prob.base[j] <= fits)):
        nb = int(np.count_nonzero(prob.base[j]))
        s_keep = float(prob.speedup(j, np.array([nb]), np.array([kb]))[0]) * (1 + _KEEP_BONUS)
        k_list.append(np.array([kb]))
        keep_list.append(np.array([True]))
        s_list.append(np.array([s_keep]))
        n_list.append(np.array([nb]))
        spread_list.append(np.zeros(1, bool))
    k = np.concatenate(k_list)
    keep = np.concatenate(keep_list)
    s = np.concatenate(s_list)
    n = np.concatenate(n_list)
    sp = np.concatenate(spread_list)
    order = np.lexsort((~keep, k))      # by K, keep option first at equal K
    return _Options(k[order], keep[order], s[order], n[order], sp[order]), fits


def _prune(opts: _Options, weight: np.ndarray, min_gain: float) -> np.ndarray:
    """Indices of options not dominated by a lighter (or equally heavy, earlier) option.

    An option survives only if its speedup beats every lighter option's by a relative
    ``min_gain``: taking capacity for (almost) nothing is never useful, and this is what
    keeps a flat speedup curve at its smallest replica count.
    """
    order = np.lexsort((~opts.keep, opts.k, weight))
    s = opts.s[order]
    prev_best = np.concatenate([[-1.0], np.maximum.accumulate(s)[:-1]])
    survive = (prev_best < 0) | (s > prev_best * (1.0 + min_gain))
    return order[survive]


# ---------------------------------------------------------------------------------------
# The knapsack dynamic programme.

def _knapsack(weights: List[np.ndarray], z: List[np.ndarray], g: List[np.ndarray],
              cap: np.ndarray, tables: Optional[List[Tuple[np.ndarray, np.ndarray]]] = None
              ) -> Tuple[List[int], Tuple[float, float]]:
    """Pick one option per job minimising the lexicographic sum (z, g) under ``cap``.

    ``weights[j]`` is ``(m_j, d)`` integer capacity use per option; option 0 of every job
    must weigh nothing (the job idles). States are all capacity vectors ``<= cap``
    (row-major flattened); ``dp[c]`` is the best cost using at most ``c``. Exact.
    Ties (within 1e-12 relative) go to the lower option index (lighter / fewer replicas),
    and since jobs are backtracked last-first, later jobs yield on exact ties.
    If ``tables`` is a list, ``(dz, dg)`` after each job is appended to it.
    """
    cap = np.asarray(cap, dtype=np.int64)
    d = cap.size
    shape = tuple(int(c) + 1 for c in cap)
    n_states = int(np.prod(shape)) if d else 1
    strides = np.array([int(np.prod(shape[i + 1:])) for i in range(d)], dtype=np.int64)
    coords = np.indices(shape).reshape(d, -1).T if d else np.zeros((1, 0), np.int64)
    rows = np.arange(n_states)
    dz = np.zeros(n_states)
    dg = np.zeros(n_states)
    choices: List[np.ndarray] = []
    shifts: List[np.ndarray] = []
    # When no job's idle flag depends on its option, the first part is a constant.
    use_z = any(np.ptp(zj) > 0 for zj in z if len(zj))
    for w, zj, gj in zip(weights, z, g):
        w = np.asarray(w, dtype=np.int64).reshape(len(zj), d)
        shift = w @ strides
        valid = np.all(coords[:, None, :] >= w[None, :, :], axis=2) if d else np.ones(
            (n_states, len(zj)), dtype=bool)
        src = np.where(valid, rows[:, None] - shift[None, :], 0)
        G = np.where(valid, dg[src] + gj[None, :], np.inf)
        if use_z:
            Z = np.where(valid, dz[src] + zj[None, :], np.inf)
            G = np.where(Z <= Z.min(axis=1, keepdims=True) + 0.5, G, np.inf)
        gmin = G.min(axis=1, keepdims=True)
        ch = np.argmax(G <= gmin + 1e-12 * np.maximum(np.abs(gmin), 1.0), axis=1)
        dz = Z[rows, ch] if use_z else dz + (zj[0] if len(zj) else 0.0)
        dg = G[rows, ch]
        choices.append(ch.astype(np.int32))
        shifts.append(shift)
        if tables is not None:
            tables.append((dz, dg))
    state = n_states - 1
    picked = [0] * len(weights)
    for j in range(len(weights) - 1, -1, -1):
        c = int(choices[j][state])
        picked[j] = c
        state -= int(shifts[j][c])
    return picked, (float(dz[-1]), float(dg[-1]))


# ---------------------------------------------------------------------------------------
# Placement state, packing and local search.

class _State:
    """A (partial) placement: replica counts per job and node, free capacity, multi-node
    host per node (interference)."""

    def __init__(self, prob: _Problem) -> None:
        self.prob = prob
        self.free = prob.free0.copy()
        self.counts = np.zeros((prob.J, prob.M), dtype=np.int64)
        self.host = np.full(prob.M, -1, dtype=np.int64)
        self.s_opt = np.zeros(prob.J)      # speedup as optimised (keep bonus included)
        for j in np.flatnonzero(prob.pinned):
            self.counts[j] = prob.base[j]
            if np.count_nonzero(prob.base[j]) > 1:
                nodes = np.flatnonzero(prob.base[j])
                self.host[nodes[self.host[nodes] < 0]] = j
            self.s_opt[j] = prob.effective(j, prob.base[j])[0]

    def copy(self) -> "_State":
        new = object.__new__(_State)
        new.prob = self.prob
        new.free = self.free.copy()
        new.counts = self.counts.copy()
        new.host = self.host.copy()
        new.s_opt = self.s_opt.copy()
        return new

    def add(self, j: int, counts: np.ndarray, s_opt: Optional[float] = None) -> None:
        self.counts[j] = counts
        self.free -= counts[:, None] * self.prob.req[j][None, :]
        np.maximum(self.free, 0.0, out=self.free, where=self.free > -1e-9)
        nodes = np.flatnonzero(counts)
        if nodes.size > 1:
            self.host[nodes] = j
        self.s_opt[j] = self.prob.effective(j, counts)[0] if s_opt is None else s_opt

    def remove(self, j: int) -> np.ndarray:
        old = self.counts[j].copy()
        self.free += old[:, None] * self.prob.req[j][None, :]
        self.host[self.host == j] = -1
        self.counts[j] = 0
        self.s_opt[j] = 0.0
        return old

    def objective(self) -> Tuple[float, float]:
        z, g = self.prob.cost(self.s_opt)
        return float(z.sum()), float(g.sum())

    def keep_fits(self, j: int) -> bool:
        """Whether job ``j``'s base allocation can be restored right now."""
        prob = self.prob
        base = prob.base[j]
        need = base[:, None] * prob.req[j][None, :]
        if np.any(need > self.free + _FIT_EPS * np.maximum(need, 1.0)):
            return False
        nodes = np.flatnonzero(base)
        return nodes.size <= 1 or bool(np.all(self.host[nodes] < 0))

    def place(self, j: int, k: int, fits: np.ndarray,
              spread: bool = False) -> Optional[np.ndarray]:
        """Counts per node for ``k`` replicas of job ``j``, or ``None`` if they do not fit.

        Single node when possible (best fit: least room left, then the job's old nodes);
        otherwise the fewest nodes without another multi-node job (largest first, the last
        one best fit). ``spread`` asks for at least two nodes (for a job whose model runs
        faster across nodes) and falls back to the default when that is impossible.
        """
        counts = np.zeros(self.prob.M, dtype=np.int64)
        if k <= 0:
            return counts
        base = self.prob.base[j]
        if spread and k >= 2:
            got = self._place_multi(k, fits, base, min_nodes=2)
            if got is not None:
                return got
        single = np.flatnonzero(fits >= k)
        if single.size:
            order = np.lexsort((single, -base[single], fits[single] - k))
            counts[single[order[0]]] = k
            return counts
        return self._place_multi(k, fits, base, min_nodes=2)

    def _place_multi(self, k: int, fits: np.ndarray, base: np.ndarray,
                     min_nodes: int) -> Optional[np.ndarray]:
        counts = np.zeros(self.prob.M, dtype=np.int64)
        cand = np.flatnonzero((fits >= 1) & (self.host < 0))
        f = fits[cand]
        if f.sum() < k or cand.size < min_nodes:
            return None
        order = np.lexsort((cand, -base[cand], -f))
        cand, f = cand[order], f[order]
        # Node i may take at most k - (min_nodes - 1 - i) so that later nodes get >= 1.
        take = f.copy()
        for i in range(min(min_nodes - 1, cand.size)):
            take[i] = min(take[i], k - (min_nodes - 1 - i))
        cum = np.cumsum(take)
        m = max(int(np.searchsorted(cum, k, side="left")) + 1, min_nodes)
        counts[cand[:m - 1]] = take[:m - 1]
        rem = k - int(cum[m - 2])
        rest = np.arange(m - 1, cand.size)
        ok = rest[f[rest] >= rem]
        if rem <= 0 or ok.size == 0:
            return None
        pick = ok[np.lexsort((cand[ok], -base[cand[ok]], f[ok] - rem))[0]]
        counts[cand[pick]] = rem
        return counts


class _Solver:
    """One allocation round: DP relaxation, packing, certificate, local search and a
    budgeted branch and bound."""

    def __init__(self, prob: _Problem, min_gain: float, max_dp_cells: int,
                 max_search_evals: int, max_bnb_nodes: int) -> None:
        self.prob = prob
        self.min_gain = min_gain
        self.max_dp_cells = max_dp_cells
        self.max_search_evals = max_search_evals
        self.max_bnb_nodes = max_bnb_nodes
        self.evals = 0
        self.movable = [j for j in range(prob.J) if not prob.pinned[j]]
        self.details: Dict[str, Any] = {}
        self.target: Dict[int, float] = {}
        self.bound: Optional[Tuple[float, float]] = None
        # Slot case: every movable job requests the same resources per replica.
        self.slot_q: Optional[np.ndarray] = None
        if self.movable:
            q = prob.req[self.movable[0]]
            if all(np.array_equal(prob.req[j], q) for j in self.movable):
                self.slot_q = q
        kcap = self._replica_caps()
        self.capped = bool(kcap)
        self.options: Dict[int, _Options] = {}
        # Candidate options (indices, by K, keep first) for packing and the searches.
        self.cands: Dict[int, np.ndarray] = {}
        for j in self.movable:
            opts, _ = _job_options(prob, j, kcap.get(j))
            self.options[j] = opts
            # An unchanged allocation needs its own nodes, so unlike in the relaxation it
            # cannot stand in for a move of the same size: prune moves among themselves.
            moves = np.flatnonzero(~opts.keep)
            sub = _Options(opts.k[moves], opts.keep[moves], opts.s[moves], opts.n_min[moves],
                           opts.spread[moves])
            idx = np.concatenate([moves[_prune(sub, sub.k, min_gain)], np.flatnonzero(opts.keep)])
            self.cands[j] = idx[np.lexsort((~opts.keep[idx], opts.k[idx]))]
        pinned = np.flatnonzero(prob.pinned)
        z, g = prob.cost(np.array([prob.effective(j, prob.base[j])[0] for j in pinned]))
        self.pinned_cost = (float(z.sum()), float(g.sum()))
        self._setup_relaxation()

    def _slot_counts(self) -> np.ndarray:
        q = self.slot_q
        nz = q > 0
        return np.floor(np.min(self.prob.free0[:, nz] / q[nz], axis=1) + _FIT_EPS).astype(np.int64)

    def _replica_caps(self) -> Dict[int, int]:
        """Upper bounds on each job's replicas in every optimum of the relaxation (p <= 0).

        The lexicographic objective runs as many jobs as possible, so at least ``R`` jobs
        run, ``R`` being how many jobs that surely can run (positive speedup at their
        minimum) fit together at their minimum sizes; a running job therefore leaves room
        for the ``R - 1`` smallest others. This shrinks the DP (and the speedup evaluations
        of a first round) a lot when jobs outnumber or match the slots. Only the slot case.
        """
        prob = self.prob
        if prob.p > 0 or self.slot_q is None or len(self.movable) < 2:
            return {}
        cap = int(self._slot_counts().sum())
        lows: Dict[int, int] = {}
        for j in self.movable:
            fits = prob.fits0(j)
            kmin = int(prob.min_r[j])
            if kmin > min(int(prob.max_r[j]), int(fits.sum())):
                continue
            cum = np.cumsum(np.sort(fits)[::-1])
            n_min = int(np.searchsorted(cum, kmin, side="left")) + 1
            if prob.speedup(j, np.array([n_min]), np.array([kmin]))[0] * prob.factor[j] > 0:
                lows[j] = kmin
        w = np.sort(np.array(list(lows.values()), dtype=np.int64))
        csum = np.cumsum(w)
        r = int(np.searchsorted(csum, cap, side="right"))     # jobs surely running
        if r < 2:
            return {}
        sum_r, sum_r1, w_r = int(csum[r - 1]), int(csum[r - 2]), int(w[r - 1])
        caps = {}
        for j in self.movable:
            others = sum_r - lows[j] if j in lows and lows[j] <= w_r else sum_r1
            caps[j] = max(cap - others, 0)
        return caps

    # -- the relaxation ------------------------------------------------------------------
    def _setup_relaxation(self) -> None:
        """Choose the DP's capacity model: replica slots (all movable jobs request the same
        resources) or aggregate units of the most binding resource types."""
        prob = self.prob
        self.slots: Optional[np.ndarray] = None
        self.dims: List[int] = []
        self.units: List[float] = []
        self.thinned = False
        if not self.movable:
            self.cap = np.zeros(0, np.int64)
            self.weights = {}
            self.mode = "none"
            self.n_states = 1
            return
        if self.slot_q is not None:
            self.slots = self._slot_counts()
            self.cap = np.array([int(self.slots.sum())], dtype=np.int64)
            self.weights = {j: self.options[j].k[:, None] for j in self.movable}
            self.mode = "slots"
        else:
            self._setup_mixed()
            self.mode = "aggregate[" + ",".join(prob.resource_names[r] for r in self.dims) + "]"
        self.n_states = int(np.prod(self.cap + 1)) if self.cap.size else 1
        self.details.update(mode=self.mode, dp_states=self.n_states, replica_caps=self.capped)

    def _setup_mixed(self) -> None:
        prob = self.prob
        used = [r for r in range(len(prob.resource_names))
                if any(prob.req[j, r] > 0 for j in self.movable)]
        units, caps, tight = {}, {}, {}
        for r in used:
            fr = [Fraction(float(prob.req[j, r])).limit_denominator(10 ** 6)
                  for j in self.movable if prob.req[j, r] > 0]
            den = 1
            for f in fr:
                den = den * f.denominator // math.gcd(den, f.denominator)
            num = 0
            for f in fr:
                num = math.gcd(num, f.numerator * (den // f.denominator))
            units[r] = num / den
            caps[r] = int(np.floor(prob.free0[:, r] / units[r] + _FIT_EPS).sum())
            demand = sum(prob.req[j, r] * int(self.options[j].k.max()) for j in self.movable)
            tight[r] = demand / max(prob.free0[:, r].sum(), 1e-12)
        # Never-binding resources cost DP states for nothing: drop them (dropping a
        # constraint keeps the relaxation a valid bound), and keep at most the three most
        # binding ones.
        for r in sorted(used, key=lambda r: -tight[r])[:3]:
            if tight[r] > 1.0:
                self.dims.append(r)
                self.units.append(units[r])
        self.weights = {}
        for j in self.movable:
            per = np.array([int(round(prob.req[j, r] / units[r])) for r in self.dims],
                           dtype=np.int64)
            self.weights[j] = self.options[j].k[:, None] * per[None, :]
        self.cap = np.array([caps[r] for r in self.dims], dtype=np.int64)

    def _cap_index(self, free: np.ndarray) -> int:
        """Flat DP state index of the aggregate capacity left in ``free``."""
        if self.slot_q is not None:
            q = self.slot_q
            nz = q > 0
            left = np.floor(np.min(free[:, nz] / q[nz], axis=1) + _FIT_EPS)
            return int(min(np.maximum(left, 0).sum(), self.cap[0]))
        index = 0
        for r, unit, c in zip(self.dims, self.units, self.cap.tolist()):
            left = int(np.maximum(np.floor(free[:, r] / unit + _FIT_EPS), 0).sum())
            index = index * (c + 1) + min(left, c)
        return index

    def _dp_inputs(self, order: List[int], weights: Dict[int, np.ndarray],
                   fast: bool = True, ub: Optional[float] = None):
        """Per-job option weights and costs for the knapsack: pruned, reduced, thinned.

        * Pruning drops options no better than a lighter one (``min_gain``).
        * With ``fast`` and ``p <= 0``, if every job that can run fits at its lightest
          positive option, idling such a job is never optimal: those options are dropped,
          the idle count becomes a constant and the DP skips the lexicographic part.
        * With a constant idle count and one capacity dimension, Lagrangian reduced-cost
          fixing drops every option that cannot be part of a solution costing at most
          ``ub`` (default: the Lagrangian primal solution, which is feasible): exact.
        * Only if the work still exceeds ``max_dp_cells`` is each job's option list
          thinned to a geometric sample (then the DP is a heuristic; sets ``thinned``).
        """
        prob = self.prob
        idxs = [_prune(self.options[j], weights[j].sum(axis=1), self.min_gain) for j in order]
        if fast and prob.p <= 0:
            light = []
            for j, idx in zip(order, idxs):
                pos = idx[self.options[j].s[idx] > 0]
                if pos.size:
                    light.append(weights[j][pos].min(axis=0))
            if light and np.all(np.sum(light, axis=0) <= self.cap):
                idxs = [idx[self.options[j].s[idx] > 0] if np.any(self.options[j].s[idx] > 0)
                        else idx for j, idx in zip(order, idxs)]
        const_z = prob.p > 0 or all(
            np.ptp(prob.cost(self.options[j].s[idx])[0]) == 0 for j, idx in zip(order, idxs))
        if const_z and self.cap.size >= 1 and len(order) > 1:
            idxs = self._reduced_cost_fixing(order, weights, idxs, ub)
        thinned = False
        n_opts = sum(idx.size for idx in idxs)
        cap = self.cap
        if self.cap.size >= 2 and self.n_states * n_opts > self.max_dp_cells:
            # Several resource types: coarsen the largest dimensions (requests rounded up,
            # capacity down): every DP solution stays feasible, but it is no longer a bound.
            factor = np.ones(self.cap.size, dtype=np.int64)
            # (Never below 16 units per resource: the budget is then exceeded instead.)
            while (np.prod(self.cap // factor + 1) * n_opts > self.max_dp_cells
                   and np.max(self.cap // factor) > 16):
                factor[int(np.argmax(self.cap // factor))] *= 2
            cap = self.cap // factor
            weights = {j: -(-weights[j] // factor[None, :]) for j in order}
            thinned = True
            self.details["dp_coarsened_by"] = factor.tolist()
        if self.n_states * n_opts > self.max_dp_cells and self.cap.size == 1:
            thin_to = max(8, self.max_dp_cells // (self.n_states * max(len(order), 1)))
            for i, (j, idx) in enumerate(zip(order, idxs)):
                if idx.size > thin_to:
                    # Keep the lightest options, the unchanged allocation and a geometric
                    # sample of the rest.
                    pos = np.unique(np.concatenate([
                        np.arange(min(4, idx.size)),
                        np.round(np.geomspace(1, idx.size - 1, thin_to)).astype(np.int64),
                        np.flatnonzero(self.options[j].keep[idx])]))
                    idxs[i] = idx[pos]
                    thinned = True
        ws, zs, gs = [], [], []
        for j, idx in zip(order, idxs):
            z, g = prob.cost(self.options[j].s[idx])
            ws.append(weights[j][idx])
            zs.append(z)
            gs.append(g)
        self.details["dp_options"] = int(sum(idx.size for idx in idxs))
        return ws, zs, gs, idxs, thinned, cap

    def _reduced_cost_fixing(self, order: List[int], weights: Dict[int, np.ndarray],
                             idxs: List[np.ndarray], ub: Optional[float]) -> List[np.ndarray]:
        """Drop options that no solution of cost <= ``ub`` can use.

        For multipliers ``lam >= 0`` (one per capacity dimension) the Lagrangian bound is
        ``L = sum_j min_k (g_jk + lam . w_jk) - lam . C``; a solution using option ``k`` of
        job ``j`` costs at least ``L + rc_jk`` with ``rc_jk = g_jk + lam . w_jk - min_k(..)``,
        so options with ``L + rc_jk > ub`` are never in a solution that good. ``lam`` comes
        from bisection on the total weight (cyclic over dimensions when there are several);
        ``ub`` defaults to the best feasible Lagrangian primal solution seen. Exact.
        """
        prob = self.prob
        cap = self.cap.astype(np.float64)
        d = cap.size
        m = max(idx.size for idx in idxs)
        J = len(order)
        G = np.full((J, m), np.inf)
        W = np.zeros((J, m, d))
        for i, (j, idx) in enumerate(zip(order, idxs)):
            G[i, :idx.size] = prob.cost(self.options[j].s[idx])[1]
            W[i, :idx.size] = weights[j][idx]
        rows = np.arange(J)
        state = {"best_l": -math.inf, "lam": np.zeros(d), "primal": math.inf}

        def solve(lam: np.ndarray) -> np.ndarray:
            val = G + W @ lam
            pick = np.argmin(val, axis=1)
            usage = W[rows, pick].sum(axis=0)
            lval = float(val[rows, pick].sum() - lam @ cap)
            if lval > state["best_l"]:
                state["best_l"], state["lam"] = lval, lam.copy()
            if np.all(usage <= cap):
                state["primal"] = min(state["primal"], float(G[rows, pick].sum()))
            return usage

        lam = np.zeros(d)
        usage = solve(lam)
        for _ in range(4 if d > 1 else 1):
            for r in range(d):
                trial = lam.copy()
                trial[r] = 0.0
                if solve(trial)[r] <= cap[r]:
                    lam = trial
                    continue
                lo, hi = 0.0, max(lam[r], 1.0)
                while True:
                    trial[r] = hi
                    if solve(trial)[r] <= cap[r]:
                        break
                    lo, hi = hi, hi * 4.0
                    if hi > 1e18:
                        return idxs
                for _ in range(40):
                    trial[r] = 0.5 * (lo + hi)
                    if solve(trial)[r] <= cap[r]:
                        hi = trial[r]
                    else:
                        lo = trial[r]
                    if hi - lo <= 1e-12 * hi:
                        break
                lam[r] = hi
            usage = solve(lam)
            if np.all(usage <= cap):
                break
        best_l, lam_best, primal = state["best_l"], state["lam"], state["primal"]
        threshold = primal if ub is None else ub
        if not math.isfinite(threshold) or not math.isfinite(best_l):
            return idxs
        val = G + W @ lam_best
        rc = val - val.min(axis=1, keepdims=True)
        tol = 1e-9 * max(1.0, abs(threshold)) + 1e-12 * float(np.abs(G[np.isfinite(G)]).sum())
        keep = best_l + rc <= threshold + tol
        out = [idx[keep[i, :idx.size]] for i, idx in enumerate(idxs)]
        if any(o.size == 0 for o in out):        # numerical safety net; cannot happen
            return idxs
        self.details["lagrangian"] = {"lambda": lam_best.tolist(), "bound": best_l,
                                      "primal": primal}
        return out

    def _dp(self, weights: Dict[int, np.ndarray]
            ) -> Tuple[Dict[int, int], Tuple[float, float], bool]:
        """Best option per movable job under the relaxation: choices, bound, thinned?"""
        ws, zs, gs, idxs, thinned, cap = self._dp_inputs(self.movable, weights)
        picked, bound = _knapsack(ws, zs, gs, cap)
        choice = {j: int(idxs[i][picked[i]]) for i, j in enumerate(self.movable)}
        return choice, (bound[0] + self.pinned_cost[0], bound[1] + self.pinned_cost[1]), thinned

    # -- packing -------------------------------------------------------------------------
    def _pack(self, choice: Dict[int, int]) -> _State:
        prob = self.prob
        state = _State(prob)
        keeps = [j for j in self.movable if self.options[j].keep[choice[j]]]
        moves = [j for j in self.movable if not self.options[j].keep[choice[j]]]
        for j in keeps:
            if state.keep_fits(j):
                state.add(j, prob.base[j])
            else:
                moves.append(j)
        moves.sort(key=lambda j: (-int(self.options[j].k[choice[j]]),
                                  prob.jobs[j].creation_timestamp, j))
        for j in moves:
            k = int(self.options[j].k[choice[j]])
            counts = state.place(j, k, prob.fits(j, state.free),
                                 bool(self.options[j].spread[choice[j]]))
            if counts is None:
                # Fall back to the best smaller option that can be placed.
                _, counts = self._best_response(j, state, max_k=k - 1)
            state.add(j, counts)
        return state

    # -- local search --------------------------------------------------------------------
    def _best_response(self, j: int, state: _State, max_k: Optional[int] = None
                       ) -> Tuple[Tuple[float, float], np.ndarray]:
        """Best placement of job ``j`` (absent from ``state``) over its options."""
        prob = self.prob
        opts = self.options[j]
        fits = prob.fits(j, state.free)
        upper = max(int(fits.max(initial=0)), int(fits[state.host < 0].sum()))
        if max_k is not None:
            upper = min(upper, max_k)
        best_cost: Tuple[float, float] = (math.inf, math.inf)
        best_counts = np.zeros(prob.M, np.int64)
        seen_k = set()
        for i in self.cands[j].tolist():
            k = int(opts.k[i])
            if k > upper:
                break
            if opts.keep[i]:
                if not state.keep_fits(j):
                    continue
                counts = prob.base[j].copy()
            else:
                if k in seen_k:
                    continue
                seen_k.add(k)
                counts = state.place(j, k, fits, bool(opts.spread[i]))
                if counts is None:
                    continue
            self.evals += 1
            z, g = prob.cost(np.array([prob.effective(j, counts)[0]]))
            if _better((z[0], g[0]), best_cost):
                best_cost, best_counts = (z[0], g[0]), counts
        return best_cost, best_counts

    def _joint_response(self, j: int, i: int, state: _State) -> Tuple[np.ndarray, np.ndarray]:
        """Best pair of placements for jobs ``j`` and ``i`` (both absent from ``state``):
        each option of ``j`` followed by the best response of ``i``."""
        prob = self.prob
        opts = self.options[j]
        fits = prob.fits(j, state.free)
        upper = max(int(fits.max(initial=0)), int(fits[state.host < 0].sum()))
        best_cost: Tuple[float, float] = (math.inf, math.inf)
        best = (np.zeros(prob.M, np.int64), np.zeros(prob.M, np.int64))
        seen_k = set()
        for idx in self.cands[j].tolist():
            k = int(opts.k[idx])
            if k > upper:
                break
            if opts.keep[idx]:
                if not state.keep_fits(j):
                    continue
                cj = prob.base[j].copy()
            else:
                if k in seen_k:
                    continue
                seen_k.add(k)
                cj = state.place(j, k, fits, bool(opts.spread[idx]))
                if cj is None:
                    continue
            self.evals += 1
            zj, gj = prob.cost(np.array([prob.effective(j, cj)[0]]))
            state.add(j, cj)
            (zi, gi), ci = self._best_response(i, state)
            state.remove(j)
            total = (zj[0] + zi, gj[0] + gi)
            if _better(total, best_cost):
                best_cost, best = total, (cj, ci)
        return best

    def _repack_pair(self, state: _State, n1: int, n2: int) -> bool:
        """Re-pack the jobs living only on nodes ``n1`` and ``n2`` so that each sits on one
        node (slot case): a 0/1 knapsack on ``n1``'s free slots, fewest moves first.

        Fixes what best-fit packing cannot see, e.g. free slots 6 + 7 with items
        3, 2, 2, 2, 2, 2: best fit puts the 3 into the 6 and must split a 2. Keeps the
        result only if the objective improves.
        """
        prob = self.prob
        self.evals += 1
        mov = np.asarray(self.movable)
        counts = state.counts[mov]
        total = counts.sum(axis=1)
        inside = counts[:, n1] + counts[:, n2]
        items = mov[(total > 0) & (inside == total)].tolist()
        if len(items) < 2 or len(items) > 32:
            return False
        before = state.objective()
        old = {j: (state.counts[j].copy(), state.s_opt[j]) for j in items}
        for j in items:
            state.remove(j)
        q = self.slot_q
        nz = q > 0
        f1, f2 = (int(np.floor(np.min(state.free[n, nz] / q[nz]) + _FIT_EPS)) for n in (n1, n2))
        sizes = [int(old[j][0].sum()) for j in items]
        # dp[u]: fewest items moved away from their majority node with u slots used on n1.
        INF = 10 ** 9
        dp = np.full(f1 + 1, INF)
        dp[0] = 0
        take = np.zeros((len(items), f1 + 1), dtype=bool)
        for t, (j, k) in enumerate(zip(items, sizes)):
            on1 = old[j][0][n1] * 2 >= k
            stay2 = dp + (1 if on1 else 0)                 # item goes to n2
            go1 = np.full(f1 + 1, INF)
            if k <= f1:
                go1[k:] = dp[:f1 + 1 - k] + (0 if on1 else 1)
            take[t] = go1 < stay2
            dp = np.minimum(stay2, go1)
        total = sum(sizes)
        feasible = [u for u in range(f1 + 1) if dp[u] < INF and total - u <= f2]
        ok = False
        if feasible:
            u = min(feasible, key=lambda u: (dp[u], u))
            placement = {}
            for t in range(len(items) - 1, -1, -1):
                if take[t, u]:
                    placement[items[t]] = n1
                    u -= sizes[t]
                else:
                    placement[items[t]] = n2
            for j, k in zip(items, sizes):
                counts = np.zeros(prob.M, np.int64)
                counts[placement[j]] = k
                state.add(j, counts)
            self.evals += len(items)
            if _better(state.objective(), before):
                ok = True
            else:
                for j in items:
                    state.remove(j)
        if not ok:
            for j in items:
                state.add(j, old[j][0], old[j][1])
        return ok

    def _local_search(self, state: _State, deadline: float) -> _State:
        prob = self.prob
        movable = self.movable

        def out_of_budget() -> bool:
            return self.evals >= self.max_search_evals or time.perf_counter() > deadline

        improved = True
        while improved and not out_of_budget():
            improved = False
            if self.bound is not None and not _better(self.bound, state.objective()):
                break                                   # provably optimal already
            # Move 1 (slot case): re-pack two nodes around jobs that fell short of their DP
            # target (split by fragmentation).
            if self.slot_q is not None:
                short = [j for j in movable
                         if state.s_opt[j] < self.target.get(j, 0.0) * (1 - 1e-9)]
                # A short job split over two nodes: re-pack those two. A short job on one
                # node: pair it with the nodes that still have room.
                q = self.slot_q
                nz = q > 0
                room = np.floor(np.min(state.free[:, nz] / q[nz], axis=1) + _FIT_EPS) >= 1
                pairs = []
                for j in short:
                    on = np.flatnonzero(state.counts[j]).tolist()
                    if len(on) == 2:
                        pairs.append((on[0], on[1]))
                    elif len(on) == 1:
                        pairs.extend((min(on[0], n2), max(on[0], n2))
                                     for n2 in np.flatnonzero(room).tolist() if n2 != on[0])
                for n1, n2 in dict.fromkeys(pairs):
                    if out_of_budget():
                        break
                    if self._repack_pair(state, n1, n2):
                        improved = True
                        break
            if improved:
                continue
            # Move 2: re-place one job (grow into free room, consolidate, shrink).
            for j in movable:
                if out_of_budget():
                    break
                before = state.objective()
                old = state.remove(j)
                old_s = prob.effective(j, old)[0]
                _, counts = self._best_response(j, state)
                state.add(j, counts)
                if _better(state.objective(), before):
                    improved = True
                else:
                    state.remove(j)
                    state.add(j, old, old_s)
            if improved:
                continue
            # Move 3: a receiver and a donor are re-placed together: every option of the
            # receiver, each followed by the donor's best response (a greedy receiver would
            # grab everything freed and starve the donor).
            # Receivers: first the jobs that fell short of their DP target (packing losses),
            # then any job that could do better; donors: first the jobs sharing its nodes.
            z_now, g_now = prob.cost(state.s_opt)
            z_best, g_best = prob.cost(np.array([self.options[j].s.max() for j in movable]))
            potential = (z_now[movable] - z_best) * 1e6 + (g_now[movable] - g_best)
            short = np.array([state.s_opt[j] < self.target.get(j, 0.0) * (1 - 1e-9)
                              for j in movable])
            order = np.lexsort((-potential, ~short))
            receivers = [movable[i] for i in order if short[i] or potential[i] > 0]
            for j in receivers:
                mine = state.counts[j] > 0
                donors = sorted((i for i in movable if i != j and state.counts[i].any()),
                                key=lambda i: (not np.any(state.counts[i][mine] > 0),
                                               -int(state.counts[i].sum()), i))
                for i in donors:
                    if out_of_budget():
                        break
                    before = state.objective()
                    old_i, old_j = state.remove(i), state.remove(j)
                    old_si = prob.effective(i, old_i)[0]
                    old_sj = prob.effective(j, old_j)[0]
                    cj, ci = self._joint_response(j, i, state)
                    state.add(j, cj)
                    state.add(i, ci)
                    if _better(state.objective(), before):
                        improved = True
                        break
                    state.remove(i)
                    state.remove(j)
                    state.add(i, old_i, old_si)
                    state.add(j, old_j, old_sj)
                if improved or out_of_budget():
                    break
        return state

    # -- branch and bound ----------------------------------------------------------------
    def _placements(self, j: int, state: _State, static_cls: List[Tuple]
                    ) -> Tuple[List[Tuple[Tuple[float, float], np.ndarray]], bool]:
        """All placements of job ``j`` in ``state`` up to node symmetry, best first.

        Nodes are interchangeable when their free capacity, multi-node host status,
        preemptibility and base counts (of every job) agree. Returns the placements and
        whether the enumeration was exhaustive (multi-node splits are capped).
        """
        prob = self.prob
        opts = self.options[j]
        fits = prob.fits(j, state.free)
        hosted = state.host >= 0
        cls = [(tuple(np.round(state.free[n], 9)), bool(hosted[n])) + static_cls[n]
               for n in range(prob.M)]
        cls_id: Dict[Tuple, int] = {}
        ids = np.array([cls_id.setdefault(c, len(cls_id)) for c in cls], dtype=np.int64)
        upper = max(int(fits.max(initial=0)), int(fits[~hosted].sum()))
        out: Dict[Tuple, Tuple[Tuple[float, float], np.ndarray]] = {}
        exhaustive = True

        def add(counts: np.ndarray) -> None:
            nz = np.flatnonzero(counts)
            key = tuple(sorted(zip(ids[nz].tolist(), counts[nz].tolist())))
            if key not in out:
                z, g = prob.cost(np.array([prob.effective(j, counts)[0]]))
                out[key] = ((float(z[0]), float(g[0])), counts)

        # Representatives of each class (first node), for single-node placements.
        reps = {}
        for n in range(prob.M):
            reps.setdefault(int(ids[n]), n)
        multi_nodes = np.flatnonzero((fits >= 1) & ~hosted)
        groups: Dict[int, List[int]] = {}
        for n in multi_nodes.tolist():
            groups.setdefault(int(ids[n]), []).append(n)
        group_list = list(groups.values())
        for i in self.cands[j].tolist():
            k = int(opts.k[i])
            if k > upper:
                break
            if opts.keep[i]:
                if state.keep_fits(j):
                    add(prob.base[j].copy())
                continue
            counts = np.zeros(prob.M, np.int64)
            if k == 0:
                add(counts)
                continue
            for n in reps.values():
                if fits[n] >= k:
                    counts = np.zeros(prob.M, np.int64)
                    counts[n] = k
                    add(counts)
            # Multi-node splits: per class, a non-increasing tuple of per-node counts.
            if int(fits[multi_nodes].sum()) < k or multi_nodes.size < 2:
                continue
            caps = [int(fits[g[0]]) for g in group_list]
            room = np.cumsum([len(g) * c for g, c in zip(group_list, caps)][::-1])[::-1]
            room = np.append(room, 0).tolist()     # room[gi]: capacity of groups gi..
            budget = {"visits": 0, "produced": 0}

            def rec(gi: int, left: int, used: int, counts: np.ndarray) -> None:
                nonlocal exhaustive
                budget["visits"] += 1
                if budget["visits"] > 4000 or budget["produced"] >= 64:
                    exhaustive = False
                    return
                if left == 0:
                    if used >= 2:
                        budget["produced"] += 1
                        add(counts.copy())
                    return
                if gi == len(group_list) or room[gi] < left:
                    return
                members, cap_n = group_list[gi], caps[gi]

                def fill(mi: int, hi: int, left2: int, used2: int) -> None:
                    # Members mi.. of this group take at most hi each (non-increasing).
                    if (len(members) - mi) * hi + room[gi + 1] < left2:
                        return
                    for c in range(min(hi, left2), 0, -1):
                        counts[members[mi]] = c
                        if mi + 1 < len(members) and left2 > c:
                            fill(mi + 1, c, left2 - c, used2 + 1)
                        else:
                            rec(gi + 1, left2 - c, used2 + 1, counts)
                        counts[members[mi]] = 0
                        if not exhaustive:
                            return
                    rec(gi + 1, left2, used2, counts)      # the rest of this group unused

                fill(0, cap_n, left, used)

            rec(0, k, 0, np.zeros(prob.M, np.int64))
        return sorted(out.values(), key=lambda t: _Key(t[0])), exhaustive

    def _branch_and_bound(self, incumbent: _State, bound: Tuple[float, float],
                          deadline: float) -> Tuple[_State, bool]:
        """Depth-first branch and bound over jobs' placements, pruned by DP suffix bounds.

        Returns the best state found and whether the search completed (then it is optimal).
        """
        prob = self.prob
        order = sorted(self.movable, key=lambda j: (-int(incumbent.counts[j].sum()),
                                                    prob.jobs[j].creation_timestamp, j))
        T = len(order)
        inc = incumbent.objective()
        if abs(inc[0] - bound[0]) < 0.5:
            # Any better solution idles no more jobs than the relaxation: the suffix DPs may
            # forbid idling runnable jobs and drop options that cannot beat the incumbent.
            ws, zs, gs, _, thinned, _ = self._dp_inputs(order[::-1], self.weights, fast=True,
                                                        ub=inc[1] - self.pinned_cost[1])
        else:
            ws, zs, gs, _, thinned, _ = self._dp_inputs(order[::-1], self.weights, fast=False)
        if thinned:
            return incumbent, False
        tables: List[Tuple[np.ndarray, np.ndarray]] = []
        _knapsack(ws, zs, gs, self.cap, tables)
        n_states = tables[0][0].size if tables else 1
        # suffix[t]: best relaxation cost of jobs order[t:] given capacity state.
        suffix = [tables[T - 1 - t] for t in range(T)] + [(np.zeros(n_states),) * 2]
        static_cls = [(bool(prob.eligible[:, n].all()),) + tuple(prob.base[:, n].tolist())
                      for n in range(prob.M)]
        best_obj = incumbent.objective()
        best_counts = incumbent.counts.copy()
        state = _State(prob)
        stats = {"nodes": 0, "aborted": False, "exhaustive": True}

        def dfs(t: int, acc: Tuple[float, float]) -> None:
            nonlocal best_obj, best_counts
            stats["nodes"] += 1
            if stats["nodes"] > self.max_bnb_nodes or (
                    stats["nodes"] % 64 == 0 and time.perf_counter() > deadline):
                stats["aborted"] = True
                return
            idx = self._cap_index(state.free)
            bound = (acc[0] + suffix[t][0][idx], acc[1] + suffix[t][1][idx])
            if not _better(bound, best_obj):
                return
            if t == T:
                best_obj, best_counts = state.objective(), state.counts.copy()
                return
            j = order[t]
            placements, exhaustive = self._placements(j, state, static_cls)
            if not exhaustive:
                stats["exhaustive"] = False
            for cost, counts in placements:
                state.add(j, counts)
                dfs(t + 1, (acc[0] + cost[0], acc[1] + cost[1]))
                state.remove(j)
                if stats["aborted"]:
                    return

        dfs(0, self.pinned_cost)
        self.details.update(bnb_nodes=stats["nodes"], bnb_complete=not stats["aborted"])
        out = _State(prob)
        for j in self.movable:
            if best_counts[j].any():
                out.add(j, best_counts[j])
        return out, not stats["aborted"] and stats["exhaustive"]

    # -- main ----------------------------------------------------------------------------
    def solve(self, time_limit_s: Optional[float]) -> Tuple[_State, bool, float]:
        prob = self.prob
        start = time.perf_counter()
        deadline = start + (time_limit_s if time_limit_s is not None else math.inf)
        if not self.movable:
            return _State(prob), True, 0.0
        choice, bound, thinned = self._dp(self.weights)
        exact_bound = not thinned
        self.thinned = thinned
        self.target = {j: float(self.options[j].s[choice[j]]) for j in self.movable}
        self.bound = bound if exact_bound else None
        state = self._pack(choice)
        obj = state.objective()
        # The bound is a valid lower bound on the cost, so "not worse" means optimal.
        certified = exact_bound and not _better(bound, obj)
        self.details["stage"] = "dp"
        if not certified:
            candidates = [state]
            if self.slots is not None:
                # Second DP: a multi-node shape is charged the whole nodes it spans, so the
                # counts it picks leave no slivers that single-node jobs cannot use.
                top = np.cumsum(np.sort(self.slots)[::-1])
                wn = {}
                for j in self.movable:
                    opts = self.options[j]
                    w = np.where(opts.n_min <= 1, opts.k,
                                 top[np.minimum(np.maximum(opts.n_min, 1), top.size) - 1])
                    wn[j] = np.minimum(np.maximum(w, opts.k), self.cap[0])[:, None]
                candidates.append(self._pack(self._dp(wn)[0]))
            # Status quo: every running job keeps its allocation, the others are placed
            # one by one. Guards against a heuristic round moving jobs for nothing.
            quo = _State(prob)
            for j in self.movable:
                if prob.base_known[j] and quo.keep_fits(j) and np.any(self.options[j].keep):
                    quo.add(j, prob.base[j])
            for j in self.movable:
                if not quo.counts[j].any():
                    quo.add(j, self._best_response(j, quo)[1])
            candidates.append(quo)
            state = min(candidates, key=lambda s: _Key(s.objective()))
            state = self._local_search(state, deadline)
            obj = state.objective()
            certified = exact_bound and not _better(bound, obj)
            self.details["stage"] = "local_search"
            # The tree search can only finish on small instances; larger ones keep the
            # local-search result (its gap is reported).
            if not certified and exact_bound and self.max_bnb_nodes > 0 and len(
                    self.movable) <= _BNB_MAX_JOBS:
                state, certified = self._branch_and_bound(state, bound, deadline)
                obj = state.objective()
                # Replica caps only hold for solutions running as many jobs as the
                # relaxation; otherwise the search may have missed larger counts.
                if self.capped and abs(obj[0] - bound[0]) > 0.5:
                    certified = False
                self.details["stage"] = "branch_and_bound"
        if certified:
            gap = 0.0
        elif not exact_bound:
            gap = math.nan
        elif bound[0] < obj[0] - 0.5:
            gap = math.inf
        else:
            # Express the gap on the power mean of the running jobs: 1 - fitness / bound.
            n_active = prob.J - int(round(obj[0])) if prob.p <= 0 else prob.J
            gap = max(0.0, 1.0 - _mean_from_cost(obj[1], n_active, prob.p)
                      / max(_mean_from_cost(bound[1], n_active, prob.p), 1e-300))
        self.details.update(bound=bound, objective=obj, search_evals=self.evals,
                            speedup_calls=prob.calls)
        return state, certified, gap


def _mean_from_cost(g: float, n: int, p: float) -> float:
    """Power mean of ``n`` speedups whose summed cost term (see ``_Problem.cost``) is ``g``."""
    if n <= 0:
        return 0.0
    if p > 0:
        return max(-g / n, 0.0) ** (1.0 / p)
    if p == 0:
        return math.exp(-g / n)
    return (g / n) ** (1.0 / p) if g > 0 else 0.0


class _Key:
    """Sort key wrapping the lexicographic objective with tolerance."""

    def __init__(self, obj: Tuple[float, float]) -> None:
        self.obj = obj

    def __lt__(self, other: "_Key") -> bool:
        return _better(self.obj, other.obj)


# ---------------------------------------------------------------------------------------
# Public entry points.

def _to_allocations(prob: _Problem, state: _State) -> Allocations:
    out: Allocations = {}
    for j, key in enumerate(prob.job_keys):
        counts = state.counts[j]
        if prob.base_known[j] and np.array_equal(counts, prob.base[j]):
            out[key] = list(prob.base_list[j])      # unchanged: keep the caller's order
            continue
        nodes = np.flatnonzero(counts)
        nodes = nodes[np.lexsort((nodes, -counts[nodes]))]
        out[key] = [prob.node_keys[n] for n in nodes for _ in range(int(counts[n]))]
    return out


def _counts_from(prob: _Problem, allocations: Mapping[Hashable, Sequence[Hashable]],
                 what: str = "allocations") -> np.ndarray:
    if not isinstance(allocations, Mapping):
        raise ValueError(f"{what} must be a dict of job key -> list of node keys")
    counts = np.zeros((prob.J, prob.M), dtype=np.int64)
    for j, key in enumerate(prob.job_keys):
        alloc = allocations.get(key, [])
        if isinstance(alloc, (str, bytes)) or not isinstance(alloc, Sequence):
            raise ValueError(f"{what}[{key!r}] must be a list of node keys, got {alloc!r}")
        for node_key in alloc:
            idx = prob.node_index.get(node_key)
            if idx is None:
                raise ValueError(f"{what}[{key!r}] names unknown node {node_key!r}")
            counts[j, idx] += 1
    return counts


class PolluxPolicy:
    """Configured Pollux allocator (see the module docstring for the method).

    Args:
        p: power-mean exponent of the fitness (finite): -1 fair (default), 0 geometric
            mean, 1 utilitarian.
        min_gain: relative speedup gain below which an extra replica is not taken
            (default 1e-6: only floating-point noise is ignored).
        max_dp_cells: work budget of the dynamic programme (capacity states x options
            summed over jobs, after the exact reductions). Beyond it the DP sees a subset
            of replica counts (or coarser units with mixed requests) and certifies nothing.
        max_search_evals: budget of candidate placements the local search may evaluate.
        max_bnb_nodes: budget of search-tree nodes for the branch and bound that runs when
            the DP bound is not attained, for at most 12 movable jobs (0 disables it).
            Small instances complete and are then certified optimal; larger ones keep the
            local-search result. With the defaults a round whose DP bound is attained takes
            milliseconds to ~0.2 s (256 jobs); one that is not, up to a few 100 ms more.
        time_limit_s: optional wall-clock limit for the local search and branch and bound
            (``None``: only the budgets apply, which keeps results deterministic).

    Raises:
        ValueError: for malformed arguments (the message names them).
    """

    def __init__(self, p: float = -1.0, *, min_gain: float = 1e-6,
                 max_dp_cells: int = 8_000_000, max_search_evals: int = 2_000,
                 max_bnb_nodes: int = 2_000, time_limit_s: Optional[float] = None) -> None:
        self.p = _check_p(p)
        if not _is_real(min_gain) or not (0 <= float(min_gain) < 1):
            raise ValueError(f"min_gain must be a number in [0, 1), got {min_gain!r}")
        self.min_gain = float(min_gain)
        if not _is_int(max_dp_cells) or max_dp_cells < 1:
            raise ValueError(f"max_dp_cells must be a positive integer, got {max_dp_cells!r}")
        self.max_dp_cells = int(max_dp_cells)
        if not _is_int(max_search_evals) or max_search_evals < 0:
            raise ValueError(f"max_search_evals must be an integer >= 0, "
                             f"got {max_search_evals!r}")
        self.max_search_evals = int(max_search_evals)
        if not _is_int(max_bnb_nodes) or max_bnb_nodes < 0:
            raise ValueError(f"max_bnb_nodes must be an integer >= 0, got {max_bnb_nodes!r}")
        self.max_bnb_nodes = int(max_bnb_nodes)
        if time_limit_s is not None and (not _is_real(time_limit_s) or time_limit_s <= 0):
            raise ValueError(f"time_limit_s must be None or > 0, got {time_limit_s!r}")
        self.time_limit_s = None if time_limit_s is None else float(time_limit_s)

    def allocate(self, jobs: Mapping[Hashable, JobInfo], nodes: Mapping[Hashable, NodeInfo],
                 base_allocations: Optional[Mapping[Hashable, Sequence[Hashable]]] = None,
                 *, now: Optional[float] = None) -> AllocationResult:
        """Solve one allocation round and report the allocation with its quality.

        Args:
            jobs: job key -> :class:`JobInfo`.
            nodes: node key -> :class:`NodeInfo`.
            base_allocations: job key -> current allocation (list of node keys, one per
                replica); missing jobs have none. Keys of jobs not in ``jobs`` are ignored
                (finished jobs). A job whose base names a node not in ``nodes`` lost that
                node: it is placed afresh, without restart penalty.
            now: current time in seconds (same clock as ``creation_timestamp``); defaults to
                ``time.time()``.

        Returns:
            :class:`AllocationResult`; ``allocations`` has an entry for every job.

        Raises:
            ValueError: malformed input (names the argument), pinned non-preemptible jobs
                exceeding a node's capacity, or a speedup function returning negative or
                non-finite values.
        """
        t0 = time.perf_counter()
        prob = _Problem(jobs, nodes, base_allocations, self.p, now)
        if prob.J == 0:
            return AllocationResult({}, {}, 0.0, 0, True, 0.0, time.perf_counter() - t0)
        solver = _Solver(prob, self.min_gain, self.max_dp_cells, self.max_search_evals,
                         self.max_bnb_nodes)
        state, optimal, gap = solver.solve(self.time_limit_s)
        allocations = _to_allocations(prob, state)
        speedups = {key: prob.effective(j, state.counts[j])[1]
                    for j, key in enumerate(prob.job_keys)}
        values = [speedups[k] for k in jobs]
        return AllocationResult(
            allocations={k: allocations[k] for k in jobs},
            speedups={k: speedups[k] for k in jobs},
            fitness=power_mean(values, self.p),
            num_idle=int(sum(1 for v in values if v <= 0)),
            optimal=bool(optimal), gap=float(gap),
            solve_time_s=time.perf_counter() - t0, details=solver.details)

    def optimize(self, jobs: Mapping[Hashable, JobInfo], nodes: Mapping[Hashable, NodeInfo],
                 base_allocations: Optional[Mapping[Hashable, Sequence[Hashable]]] = None,
                 *, now: Optional[float] = None) -> Allocations:
        """Like :meth:`allocate` but return only job key -> list of node keys."""
        return self.allocate(jobs, nodes, base_allocations, now=now).allocations


def optimize(jobs: Mapping[Hashable, JobInfo], nodes: Mapping[Hashable, NodeInfo],
             base_allocations: Optional[Mapping[Hashable, Sequence[Hashable]]] = None, *,
             p: float = -1.0, now: Optional[float] = None, min_gain: float = 1e-6,
             max_dp_cells: int = 8_000_000, max_search_evals: int = 2_000,
             max_bnb_nodes: int = 2_000, time_limit_s: Optional[float] = None) -> Allocations:
    """Allocate replicas to jobs maximising ``FITNESS_p`` (see :class:`PolluxPolicy`).

    Returns job key -> list of node keys (one entry per replica; ``[]`` = idle) for every
    job in ``jobs``.

    Raises:
        ValueError: malformed input; the message names the argument.
    """
    policy = PolluxPolicy(p, min_gain=min_gain, max_dp_cells=max_dp_cells,
                          max_search_evals=max_search_evals, max_bnb_nodes=max_bnb_nodes,
                          time_limit_s=time_limit_s)
    return policy.optimize(jobs, nodes, base_allocations, now=now)


def effective_speedups(jobs: Mapping[Hashable, JobInfo], nodes: Mapping[Hashable, NodeInfo],
                       allocations: Mapping[Hashable, Sequence[Hashable]],
                       base_allocations: Optional[Mapping[Hashable, Sequence[Hashable]]] = None,
                       *, now: Optional[float] = None) -> Dict[Hashable, float]:
    """Effective speedup of each job under ``allocations``: speedup at its
    ``(num_nodes, num_replicas)`` times :func:`restart_penalty` if it differs from its base
    allocation (no penalty for a job without one, or whose base names a vanished node).

    Combine with :func:`power_mean` to get the fitness of any allocation.

    Raises:
        ValueError: malformed input or an allocation naming an unknown node.
    """
    prob = _Problem(jobs, nodes, base_allocations, 1.0, now)
    counts = _counts_from(prob, allocations)
    return {key: prob.effective(j, counts[j])[1] for j, key in enumerate(prob.job_keys)}


def check_allocations(jobs: Mapping[Hashable, JobInfo], nodes: Mapping[Hashable, NodeInfo],
                      allocations: Mapping[Hashable, Sequence[Hashable]],
                      base_allocations: Optional[Mapping[Hashable, Sequence[Hashable]]] = None
                      ) -> None:
    """Check every constraint the allocator guarantees; raise on the first violation.

    Checks: known job and node keys; replica count 0 or within ``[min_replicas,
    max_replicas]``; per-node capacity of every resource; non-preemptible jobs keep a
    (known) base allocation and never use preemptible nodes otherwise; at most one
    multi-node job per node (pinned jobs' own overlaps excepted).

    Raises:
        ValueError: describing the violated constraint.
    """
    prob = _Problem(jobs, nodes, base_allocations, 1.0, 0.0)
    for key in allocations:
        if key not in jobs:
            raise ValueError(f"allocations names unknown job {key!r}")
    counts = _counts_from(prob, allocations)
    for j, key in enumerate(prob.job_keys):
        k = int(counts[j].sum())
        job = prob.jobs[j]
        if prob.pinned[j]:
            if not np.array_equal(counts[j], prob.base[j]):
                raise ValueError(f"non-preemptible job {key!r} was moved from its base "
                                 "allocation")
            continue
        if k and (k < job.min_replicas or (job.max_replicas is not None
                                           and k > job.max_replicas)):
            raise ValueError(f"job {key!r} has {k} replicas outside "
                             f"[{job.min_replicas}, {job.max_replicas}]")
        if k and np.any(counts[j][~prob.eligible[j]] > 0):
            raise ValueError(f"non-preemptible job {key!r} placed on a preemptible node")
    use = np.einsum("jn,jr->nr", counts.astype(np.float64), prob.req)
    over = np.argwhere(use > prob.cap + 1e-9 * np.maximum(prob.cap, 1.0))
    if over.size:
        n, r = over[0]
        raise ValueError(f"node {prob.node_keys[n]!r} over capacity in "
                         f"{prob.resource_names[r]!r}: {use[n, r]} > {prob.cap[n, r]}")
    multi = (np.count_nonzero(counts, axis=1) > 1)
    for n in range(prob.M):
        on = np.flatnonzero(multi & (counts[:, n] > 0) & ~prob.pinned)
        pinned_on = np.flatnonzero(multi & (counts[:, n] > 0) & prob.pinned)
        if on.size + min(pinned_on.size, 1) > 1:
            names = [prob.job_keys[j] for j in np.concatenate([on, pinned_on])]
            raise ValueError(f"node {prob.node_keys[n]!r} hosts several multi-node jobs "
                             f"{names!r}")
