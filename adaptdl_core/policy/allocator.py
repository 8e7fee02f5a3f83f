"""Pollux cluster allocation: which job gets how many replicas on which nodes.

Given :class:`~.records.JobInfo` per job and :class:`~.records.NodeInfo` per node (see
:mod:`.records`), the allocator maximises the power-mean fitness of the jobs' effective
speedups (``p = -1`` fair, ``p = 1`` utilitarian; lexicographic for ``p <= 0``: first run
as many jobs as possible), defined in :mod:`.fitness`.

Constraints, all hard: node capacity for every resource type; a job runs ``0`` replicas
or between ``min_replicas`` and ``max_replicas``; a non-preemptible job that is running
keeps exactly its base allocation (and a non-preemptible job is never placed on a
preemptible node); at most one multi-node job (replicas on more than one node) per node.
:func:`check_allocations` checks them.

How a round is solved (:class:`_Solver`), and what is exact:

1. *Counts by dynamic programming* (:mod:`.replica_counts`): a knapsack DP over a
   relaxation gives the best replica count per job and a lower bound on the cost, exact
   unless the DP had to be thinned to stay within ``max_dp_cells``.
2. *Packing* (:mod:`.placement`): the replicas are placed on nodes, unchanged allocations
   first, then the largest jobs.
3. *Certificate.* If the packed allocation attains the DP bound it is **optimal**
   (``AllocationResult.optimal``). Otherwise the better of three starts (this packing, the
   packing of a second DP that charges multi-node shapes the whole nodes they span, and
   the status quo) is improved by a bounded local search (:mod:`.local_search`), and for
   at most 12 movable jobs a branch and bound (:mod:`.branch_and_bound`) runs within
   ``max_bnb_nodes``; when it completes the result is **optimal**. Otherwise the result is
   **heuristic** and ``AllocationResult.gap`` bounds its loss against the relaxation.
   "Optimal" is up to the ``min_gain`` rule below (relative 1e-6).

Hysteresis falls out of the penalty: moving a running job only pays when the fitness gain
beats its restart cost. In addition an unchanged allocation wins near-ties (a relative
``1e-6`` preference) and an extra replica is only taken for a relative speedup gain above
``min_gain``, so floating-point noise never moves or grows a job.
"""

from __future__ import annotations

import math
import time
from typing import Dict, Hashable, Mapping, Optional, Sequence, Tuple

import numpy as np

from adaptdl_core import validation

from .branch_and_bound import _BNB_MAX_JOBS, _BranchAndBound
from .fitness import _better, _check_p, _Key, _mean_from_cost, power_mean, restart_penalty
from .local_search import _LocalSearch
from .placement import _State
from .problem import _Problem
from .records import (
    DEFAULT_RESTART_COST_S,
    AllocationResult,
    Allocations,
    JobInfo,
    NodeInfo,
)

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


class _Solver(_LocalSearch, _BranchAndBound):
    """One allocation round: DP relaxation, packing, certificate, local search and a
    budgeted branch and bound."""

    def __init__(self, prob: _Problem, min_gain: float, max_dp_cells: int,
                 max_search_evals: int, max_bnb_nodes: int) -> None:
        # What the search stages share (the relaxation sets up the rest).
        self.max_search_evals = max_search_evals
        self.max_bnb_nodes = max_bnb_nodes
        self.evals = 0
        self.target: Dict[int, float] = {}
        self.bound: Optional[Tuple[float, float]] = None
        super().__init__(prob, min_gain, max_dp_cells)

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
            candidates = [state, self._pack_minimums_first(choice)]
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
            local-search result. ``benchmarks/policy.py`` times rounds of 16 to 256 jobs
            with the defaults.
        time_limit_s: optional wall-clock limit for the local search and branch and bound
            (``None``: only the budgets apply, which keeps results deterministic).
        fair_share: maximise the power mean of each job's speedup relative to its speedup
            at its fair share of the cluster (the cluster split evenly among the round's
            jobs by dominant resource; Pollux's normalisation, see ``docs/algorithms.md`` 5)
            instead of relative to one replica. With ``p != 1`` this decides how jobs are
            weighed against each other: a job that would gain much from its fair share
            counts for more. Reported speedups keep the speedup functions' own units.

    Raises:
        ValueError: for malformed arguments (the message names them).
    """

    def __init__(self, p: float = -1.0, *, min_gain: float = 1e-6,
                 max_dp_cells: int = 8_000_000, max_search_evals: int = 2_000,
                 max_bnb_nodes: int = 2_000, time_limit_s: Optional[float] = None,
                 fair_share: bool = False) -> None:
        if not isinstance(fair_share, bool):
            raise ValueError(f"fair_share must be True or False, got {fair_share!r}")
        self.fair_share = fair_share
        self.p = _check_p(p)
        self.min_gain = validation.number("min_gain", min_gain, 0.0, 1.0, high_open=True)
        self.max_dp_cells = validation.integer("max_dp_cells", max_dp_cells, 1)
        self.max_search_evals = validation.integer("max_search_evals", max_search_evals, 0)
        self.max_bnb_nodes = validation.integer("max_bnb_nodes", max_bnb_nodes, 0)
        self.time_limit_s = None if time_limit_s is None else validation.number(
            "time_limit_s", time_limit_s, 0.0, low_open=True,
            what="None or a finite number of seconds")

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
        prob = _Problem(jobs, nodes, base_allocations, self.p, now, fair_share=self.fair_share)
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
