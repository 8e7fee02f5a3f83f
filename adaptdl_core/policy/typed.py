"""Allocation on a cluster of several accelerator types: which type, how many replicas, where.

Each job runs on nodes of one type at a time (:attr:`NodeInfo.accelerator_type`) and has
a speedup function per type in one common unit (:attr:`JobInfo.type_speedups`). A round
maximises the same power-mean fitness as Pollux (:mod:`.fitness`: lexicographic for
``p < 0``, first run as many jobs as possible), now over a choice of ``(type, replicas)``
per job:

1. **Options.** For every job and type, the replica counts (every count up to two nodes'
   worth, then whole nodes: :func:`candidate_counts`) whose speedup beats every smaller
   count's (a flat or falling speedup is never worth the capacity), valued at the
   job's speedup there on the fewest nodes of that type that hold them (or one more, if
   faster), over its speedup at its fair share of the cluster (an even share of every
   type; with ``fair_share``) and scaled by its weight; a change from the job's current
   type or size pays the restart penalty (:func:`.fitness.restart_penalty`), an unchanged
   allocation wins near-ties.
2. **Choice.** One option per job, at most each type's replica slots: a multiple-choice
   knapsack with one capacity per type. Up to ``max_exact_options`` options it is solved
   exactly as a 0-1 program (``scipy.optimize.milp``, HiGHS); beyond, by Lagrangian prices
   per type (each job then picks its best option at those prices, found by bisection
   sweeps over the types) followed by best responses that fill what the prices left free.
3. **Counts and placement per type.** The jobs given each type are then allocated by the
   Pollux allocator (:class:`.allocator.PolluxPolicy`) on that type's nodes with their
   speedups there in the same units (fair share and weight): its dynamic programme sets
   the counts exactly for that type, its packing places them (a job keeps its nodes when
   its size is unchanged). A job the choice left idle although it could run goes to the
   type with most room per job, where the allocator runs as many jobs as fit.

Capacity is counted in replica slots, so every movable job must request the same
resources per replica (the case of a Tune experiment and of the simulator);
:func:`typed_round_applies` says when this module applies.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, replace
from typing import Dict, Hashable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from .allocator import PolluxPolicy
from .fitness import _KEEP_BONUS, _cost_terms, power_mean
from .problem import _Problem
from .records import AllocationResult, Allocations, JobInfo, NodeInfo

__all__ = ["TypedAllocator", "typed_round_applies", "node_types", "mixed_types",
           "placement_type", "common_type", "nodes_off_type", "knows_types", "type_unaware_note", "warn_if_type_unaware"]

LOG = logging.getLogger(__name__)
# Whether warn_if_type_unaware has warned in this process.
_warned = False

# Cost of an idle job in the Lagrangian and exact programs, relative to the largest
# running cost: large enough that running one more job always wins (lexicographic).
_IDLE_FACTOR = 1e6


def node_types(nodes: Mapping[Hashable, NodeInfo]) -> List[Optional[str]]:
    """The distinct accelerator types of ``nodes`` (``None``: unknown), in first-seen
    order."""
    return list(dict.fromkeys(n.accelerator_type for n in nodes.values()))


def mixed_types(nodes: Mapping[Hashable, NodeInfo]) -> bool:
    """Whether ``nodes`` carry more than one known accelerator type (nodes of no known
    type, e.g. CPU-only ones, do not make a cluster mixed)."""
    return len([t for t in node_types(nodes) if t is not None]) >= 2


def common_type(nodes: Mapping[Hashable, NodeInfo],
                placement: Sequence[Hashable]) -> Optional[str]:
    """The one accelerator type of the nodes in ``placement`` (node ids), as ``nodes``
    tells: ``None`` for an empty placement, a node not in ``nodes``, a node of no known
    type, or nodes of several types."""
    if not placement or any(n not in nodes for n in placement):
        return None
    kinds = {nodes[n].accelerator_type for n in placement}
    kind = kinds.pop() if len(kinds) == 1 else None
    return kind if isinstance(kind, str) and kind else None


def placement_type(nodes: Mapping[Hashable, NodeInfo],
                   placement: Sequence[Hashable]) -> Optional[str]:
    """The one accelerator type of the nodes in ``placement`` (node ids, one per replica)
    on a cluster of several types (:func:`mixed_types`): the type a solve chose for a job,
    which its replicas are then placed on. ``None`` on a cluster of one type or none, and
    wherever :func:`common_type` is (nothing to ask for: the replicas go wherever they
    fit)."""
    return common_type(nodes, placement) if mixed_types(nodes) else None


def nodes_off_type(nodes: Mapping[Hashable, NodeInfo], node_ids: Sequence[Hashable],
                   accelerator_type: Optional[str]) -> set:
    """The nodes of ``node_ids`` (where replicas run) that are not of
    ``accelerator_type``, as ``nodes`` (the cluster) tells: a node it does not list
    counts as off the type. None when no type is asked for."""
    if accelerator_type is None:
        return set()
    return {n for n in node_ids
            if n not in nodes or nodes[n].accelerator_type != accelerator_type}


def knows_types(policy: object) -> bool:
    """Whether ``policy`` weighs accelerator types: it is a :class:`TypedAllocator`, has
    one (the ``adaptdl`` policy's ``typed``), or says so with a true ``knows_types``
    attribute."""
    return isinstance(policy, TypedAllocator) or \
        isinstance(getattr(policy, "typed", None), TypedAllocator) or \
        getattr(policy, "knows_types", False) is True


def type_unaware_note(policy: object, nodes: Mapping[Hashable, NodeInfo]) -> Optional[str]:
    """One line saying that ``nodes`` mix accelerator types which ``policy`` ignores, and
    how to choose the policy that weighs them; ``None`` when the cluster is not mixed or
    the policy knows types."""
    if not mixed_types(nodes) or knows_types(policy):
        return None
    kinds = ", ".join(t for t in node_types(nodes) if t is not None)
    name = getattr(policy, "name", None) or \
        ("pollux" if isinstance(policy, PolluxPolicy) else type(policy).__name__)
    return (f"the cluster mixes accelerator types ({kinds}) but the allocation policy "
            f"{name} ignores them (it counts GPUs, not types, and places replicas on any "
            "node); choose the type-aware policy: `adaptdl-ray start --policy adaptdl` for "
            "the cluster allocator, AdaptDLScheduler(policy=\"adaptdl\") for one experiment")


def warn_if_type_unaware(policy: object, nodes: Mapping[Hashable, NodeInfo]) -> bool:
    """Log :func:`type_unaware_note` as a warning, once per process (the first time it
    applies). Returns whether it logged now."""
    global _warned
    if _warned:
        return False
    note = type_unaware_note(policy, nodes)
    if note is None:
        return False
    _warned = True
    LOG.warning(note)
    return True


def typed_round_applies(jobs: Mapping[Hashable, JobInfo],
                        nodes: Mapping[Hashable, NodeInfo]) -> bool:
    """Whether a round is one for :class:`TypedAllocator`: the nodes carry more than one
    known accelerator type (:func:`mixed_types`) and every job requests the same
    resources per replica."""
    if not mixed_types(nodes) or not jobs:
        return False
    first = None
    for job in jobs.values():
        req = dict(job.resources)
        if first is None:
            first = req
        elif req != first:
            return False
    return True


@dataclass
class _Options:
    """All options of the movable jobs, padded into ``J x O`` arrays (idle is option 0)."""

    kind: np.ndarray      # type index per option (-1: idle, padding)
    k: np.ndarray         # replicas
    s: np.ndarray         # value (scaled speedup incl. penalty / keep bonus)
    keep: np.ndarray      # the unchanged allocation
    valid: np.ndarray     # real option (not padding)


class TypedAllocator:
    """One allocation round over types (see the module doc).

    Args:
        p: power-mean exponent (< 0).
        fair_share: normalise each job's speedups by its speedup at its fair share.
        min_gain: relative speedup gain below which more replicas are not taken.
        max_exact_options: most options (jobs x options) solved exactly; beyond, the
            Lagrangian method.
        exact_time_limit_s: wall-clock limit of the exact solver (then its best so far).
        packer_options: keyword arguments of the per-type :class:`PolluxPolicy`.
    """

    def __init__(self, p: float = -1.0, *, fair_share: bool = True, min_gain: float = 1e-6,
                 max_exact_options: int = 1500, exact_time_limit_s: float = 5.0,
                 **packer_options) -> None:
        if not p < 0:
            raise ValueError(f"p must be < 0 for the typed allocator, got {p!r}")
        self.p = float(p)
        self.fair_share = bool(fair_share)
        self.min_gain = float(min_gain)
        self.max_exact_options = int(max_exact_options)
        self.exact_time_limit_s = float(exact_time_limit_s)
        packer_options.pop("fair_share", None)
        # Within a type the allocator's searches rarely pay for their time here (the types
        # are chosen already): keep them short (benchmarks/policy_round_time_mixed.py).
        packer_options.setdefault("max_bnb_nodes", 100)
        packer_options.setdefault("max_search_evals", 300)
        self.packer = PolluxPolicy(self.p, min_gain=min_gain, **packer_options)
        self._curves: Dict[tuple, _Curve] = {}

    # -- public --------------------------------------------------------------------------
    def allocate(self, jobs: Mapping[Hashable, JobInfo], nodes: Mapping[Hashable, NodeInfo],
                 base_allocations: Optional[Mapping[Hashable, Sequence[Hashable]]] = None,
                 *, now: Optional[float] = None) -> AllocationResult:
        """Solve one round (same arguments and result as :meth:`PolluxPolicy.allocate`;
        ``details`` adds ``types`` (job key -> type chosen), ``method`` and ``dual_gap``).

        Raises:
            ValueError: malformed input (named), or jobs requesting different resources
                per replica (see :func:`typed_round_applies`).
        """
        t0 = time.perf_counter()
        prob = _Problem(jobs, nodes, base_allocations, self.p, now)
        if prob.J == 0:
            return AllocationResult({}, {}, 0.0, 0, True, 0.0, time.perf_counter() - t0)
        if not typed_round_applies(jobs, nodes):
            raise ValueError("the typed allocator needs nodes of several known accelerator "
                             "types and jobs that all request the same resources per replica")
        view = _TypedView(prob, nodes, self.fair_share, self._curves, self.min_gain)
        movable = [j for j in range(prob.J) if not prob.pinned[j]]
        opts = view.options(movable)
        # Curves of jobs or types no longer in the round are dropped.
        self._curves = {k: v for k, v in self._curves.items() if k in view.seen}
        n_opts = int(opts.valid.sum())
        if n_opts <= self.max_exact_options:
            pick, method = self._exact(opts, view.capacity), "exact"
        else:
            pick, method = None, "lagrangian"
        if pick is None:
            pick, method = _lagrangian(opts, view.capacity, self.p), method if \
                method == "lagrangian" else "lagrangian-fallback"
        chosen_type = _types_of(opts, pick, movable, view.capacity)
        allocations = self._place(prob, view, chosen_type, now=prob.now)
        speedups, types_out = {}, {}
        for j, key in enumerate(prob.job_keys):
            alloc = allocations.get(key, [])
            if not alloc:
                speedups[key] = 0.0
                continue
            t = view.type_of(alloc)
            types_out[key] = view.types[t]
            speedups[key] = view.effective(j, t, alloc)
        values = [speedups[k] for k in jobs]
        return AllocationResult(
            allocations={k: list(allocations.get(k, [])) for k in jobs},
            speedups={k: speedups[k] for k in jobs},
            fitness=power_mean(values, self.p),
            num_idle=int(sum(1 for v in values if v <= 0)),
            optimal=False, gap=math.nan, solve_time_s=time.perf_counter() - t0,
            details={"method": method, "types": types_out, "options": n_opts})

    # -- stages ------------------------------------------------------------------------
    def _exact(self, opts: _Options, capacity: np.ndarray) -> Optional[np.ndarray]:
        """Best option per row by a 0-1 program, or ``None`` if the solver gave none."""
        from scipy.optimize import Bounds, LinearConstraint, milp

        cost = _option_costs(opts, self.p)
        rows, cols = np.nonzero(opts.valid & (opts.k > 0))
        if rows.size == 0:
            return np.zeros(opts.k.shape[0], dtype=np.int64)
        idle = _idle_cost(cost, opts)
        c = cost[rows, cols] - idle
        J, T = opts.k.shape[0], capacity.size
        a = np.zeros((J + T, rows.size))
        a[rows, np.arange(rows.size)] = 1.0
        a[J + opts.kind[rows, cols], np.arange(rows.size)] = opts.k[rows, cols]
        res = milp(c, constraints=LinearConstraint(a, np.zeros(J + T),
                                                   np.concatenate([np.ones(J), capacity])),
                   integrality=np.ones(rows.size), bounds=Bounds(0, 1),
                   options={"time_limit": self.exact_time_limit_s, "mip_rel_gap": 1e-9})
        if res.x is None:
            return None
        pick = np.zeros(J, dtype=np.int64)
        on = res.x > 0.5
        pick[rows[on]] = cols[on]
        return pick

    def _place(self, prob: _Problem, view: "_TypedView", chosen_type: Dict[int, int],
               now: float) -> Allocations:
        """Per type, its jobs' counts and places by the Pollux allocator (module doc)."""
        out: Allocations = {}
        for t, name in enumerate(view.types):
            node_keys = [prob.node_keys[n] for n in view.nodes_of[t]]
            if not node_keys:
                continue
            jobs_t: Dict[Hashable, JobInfo] = {}
            base_t: Dict[Hashable, List[Hashable]] = {}
            for j, key in enumerate(prob.job_keys):
                job = prob.jobs[j]
                on_t = prob.base_known[j] and view.base_type[j] == t
                if not (on_t if prob.pinned[j] else chosen_type.get(j) == t):
                    continue
                # Its speedup on the type in the round's units (fair share and weight),
                # so that the per-type solve weighs jobs as the choice of types did.
                jobs_t[key] = replace(job, speedup_fn=_Scaled(view.fn(j, t), view.scale[j]),
                                      type_speedups=None, weight=1.0,
                                      max_replicas=int(prob.max_r[j]))
                if on_t:
                    base_t[key] = list(prob.base_list[j])
            if not jobs_t:
                continue
            sub_nodes = {k: view.nodes[k] for k in node_keys}
            result = self.packer.allocate(jobs_t, sub_nodes, base_t, now=now)
            for key, alloc in result.allocations.items():
                if alloc:
                    out[key] = list(alloc)
        return out


@dataclass
class _Curve:
    """One job's speedups on one type at its candidate counts (cached across rounds while
    its speedup function, count range and the type's node layout are the same)."""

    fn: object
    key: tuple
    ks: np.ndarray        # candidate counts, ascending
    raw: np.ndarray       # speedup at each (unscaled)
    useful: np.ndarray    # indices of the counts that beat every smaller one


def candidate_counts(kmin: int, kmax: int, node_size: int) -> np.ndarray:
    """Replica counts a job is considered at on one type: every count up to two nodes'
    worth, then whole nodes (what a larger job would spread over anyway), and ``kmax``."""
    low = np.arange(kmin, min(kmax, 2 * node_size) + 1)
    whole = np.arange(3 * node_size, kmax + 1, node_size)
    return np.unique(np.concatenate([low, whole, [kmax]])).astype(np.int64)


class _TypedView:
    """A round's jobs and nodes seen by type: capacities, fair-share scales, options."""

    def __init__(self, prob: _Problem, nodes: Mapping[Hashable, NodeInfo],
                 fair_share: bool, cache: Dict[tuple, _Curve], min_gain: float) -> None:
        self.prob = prob
        self.nodes = nodes
        self.types = node_types(nodes)
        self.min_gain = min_gain
        index = {t: i for i, t in enumerate(self.types)}
        self.node_type = np.array([index[nodes[k].accelerator_type] for k in prob.node_keys])
        T = len(self.types)
        self.nodes_of = [np.flatnonzero(self.node_type == t) for t in range(T)]
        # Slots per node (every job requests the same per replica): a preemptible job's.
        ref = int(np.flatnonzero(~prob.pinned)[0]) if (~prob.pinned).any() else 0
        q = prob.req[ref]
        nz = q > 0
        slots = np.floor(np.min(prob.free0[:, nz] / q[nz], axis=1) + 1e-9).astype(np.int64)
        self.slots = np.maximum(slots, 0)
        self.capacity = np.array([self.slots[self.nodes_of[t]].sum() for t in range(T)],
                                 dtype=np.float64)
        self._cum = [np.cumsum(np.sort(self.slots[self.nodes_of[t]])[::-1]) for t in range(T)]
        self._layout = [hash(c.tobytes()) for c in self._cum]
        self._node_size = [int(self.slots[self.nodes_of[t]].max(initial=1)) or 1
                           for t in range(T)]
        # The type of each job's current allocation (-1: none, or spanning types).
        self.base_type = np.full(prob.J, -1, dtype=np.int64)
        for j in np.flatnonzero(prob.base_known):
            kinds = np.unique(self.node_type[np.flatnonzero(prob.base[j])])
            if kinds.size == 1:
                self.base_type[j] = int(kinds[0])
        self._fns: Dict[Tuple[int, int], object] = {}
        self._cache = cache
        self.seen: set = set()
        self.scale = np.ones(prob.J)
        weights = np.array([job.weight for job in prob.jobs])
        total = float(self.capacity.sum())
        fair = max(int(math.ceil(total / prob.J - 1e-9)), 1)
        for j in range(prob.J):
            base = 0.0
            if fair_share and total > 0:
                for t in range(T):
                    curve = self.curve(j, t)
                    if curve is None or self.capacity[t] <= 0:
                        continue
                    pos = min(int(np.searchsorted(curve.ks, min(fair, self.capacity[t]),
                                                  side="right")) - 1, curve.ks.size - 1)
                    if pos >= 0:
                        base += self.capacity[t] / total * float(curve.raw[pos])
            scale = 1.0 / base if base > 0 else 1.0
            self.scale[j] = scale * weights[j] ** (1.0 / prob.p)

    def fn(self, j: int, t: int):
        """Job ``j``'s speedup function on type ``t`` (``None``: it cannot run there)."""
        key = (j, t)
        if key not in self._fns:
            job = self.prob.jobs[j]
            if job.type_speedups is None:
                self._fns[key] = job.speedup_fn
            else:
                self._fns[key] = job.type_speedups.get(self.types[t])
        return self._fns[key]

    def n_min(self, t: int, k: np.ndarray) -> np.ndarray:
        """Fewest nodes of type ``t`` holding ``k`` replicas."""
        return np.searchsorted(self._cum[t], k, side="left").astype(np.int64) + 1

    def _value(self, j: int, t: int, ks: np.ndarray) -> np.ndarray:
        """Unscaled speedup of job ``j`` at ``ks`` replicas on type ``t``: the best of
        the fewest nodes that hold them and one node more."""
        fn = self.fn(j, t)
        n1 = self.n_min(t, ks)
        n2 = np.minimum(n1 + 1, np.minimum(ks, np.count_nonzero(self.slots[self.nodes_of[t]])))
        vals = np.asarray(fn(np.concatenate([n1, n2]), np.concatenate([ks, ks])),
                          dtype=np.float64).reshape(-1)
        if not np.all(np.isfinite(vals)) or np.any(vals < 0):
            raise ValueError(f"jobs[{self.prob.job_keys[j]!r}]: the speedup function of type "
                             f"{self.types[t]!r} must return finite speedups >= 0")
        return np.maximum(vals[:ks.size], np.where(n2 > n1, vals[ks.size:], 0.0))

    def curve(self, j: int, t: int) -> Optional[_Curve]:
        """Job ``j``'s speedups on type ``t`` at its candidate counts (``None``: it cannot
        run there), from the cache when its inputs are unchanged."""
        fn = self.fn(j, t)
        prob = self.prob
        kmin = int(prob.min_r[j])
        kmax = int(min(prob.max_r[j], self.capacity[t]))
        if fn is None or kmax < kmin:
            return None
        ckey = (prob.job_keys[j], self.types[t])
        self.seen.add(ckey)
        key = (kmin, kmax, self._layout[t])
        curve = self._cache.get(ckey)
        if curve is None or curve.fn is not fn or curve.key != key:
            ks = candidate_counts(kmin, kmax, self._node_size[t])
            raw = self._value(j, t, ks)
            best = np.concatenate([[-1.0], np.maximum.accumulate(raw)[:-1]])
            useful = np.flatnonzero((raw > 0) & ((best < 0) | (raw > best * (1.0 + self.min_gain))))
            curve = self._cache[ckey] = _Curve(fn, key, ks, raw, useful)
        return curve

    def type_of(self, alloc: Sequence[Hashable]) -> int:
        """The type index of an allocation's (first) node."""
        return int(self.node_type[self.prob.node_index[alloc[0]]])

    def effective(self, j: int, t: int, alloc: Sequence[Hashable]) -> float:
        """Reported effective speedup of job ``j`` on ``alloc`` (type ``t``): its speedup
        there, times the restart penalty if it changed."""
        prob = self.prob
        counts = np.zeros(prob.M, dtype=np.int64)
        for key in alloc:
            counts[prob.node_index[key]] += 1
        k, n = int(counts.sum()), int(np.count_nonzero(counts))
        raw = float(np.asarray(self.fn(j, t)(np.array([n]), np.array([k]))).reshape(-1)[0])
        if prob.base_known[j] and not np.array_equal(counts, prob.base[j]):
            raw *= prob.factor[j]
        return raw

    def options(self, movable: Sequence[int]) -> _Options:
        """The options of the ``movable`` jobs (module doc, step 1)."""
        prob = self.prob
        per_job = []
        for j in movable:
            kinds, ks, vals, keeps = [np.array([-1])], [np.array([0])], [np.array([0.0])], \
                [np.array([False])]
            factor = self.scale[j] * (prob.factor[j] if prob.base_known[j] else 1.0)
            for t in range(len(self.types)):
                curve = self.curve(j, t)
                if curve is None or not curve.useful.size:
                    continue
                kinds.append(np.full(curve.useful.size, t))
                ks.append(curve.ks[curve.useful])
                vals.append(curve.raw[curve.useful] * factor)
                keeps.append(np.zeros(curve.useful.size, bool))
            t0 = int(self.base_type[j])
            if t0 >= 0 and self.fn(j, t0) is not None:
                kb = int(prob.base[j].sum())
                nb = int(np.count_nonzero(prob.base[j]))
                if prob.min_r[j] <= kb:
                    v = float(np.asarray(self.fn(j, t0)(np.array([nb]), np.array([kb])))
                              .reshape(-1)[0]) * self.scale[j] * (1.0 + _KEEP_BONUS)
                    if v > 0:
                        kinds.append(np.array([t0]))
                        ks.append(np.array([kb]))
                        vals.append(np.array([v]))
                        keeps.append(np.array([True]))
            per_job.append((np.concatenate(kinds), np.concatenate(ks), np.concatenate(vals),
                            np.concatenate(keeps)))
        width = max((x[0].size for x in per_job), default=1)
        J = len(per_job)
        out = _Options(np.full((J, width), -1, np.int64), np.zeros((J, width), np.int64),
                       np.zeros((J, width)), np.zeros((J, width), bool),
                       np.zeros((J, width), bool))
        for r, (kinds, ks, vals, keeps) in enumerate(per_job):
            m = kinds.size
            out.kind[r, :m] = kinds
            out.k[r, :m] = ks
            out.s[r, :m] = vals
            out.keep[r, :m] = keeps
            out.valid[r, :m] = True
        return out


class _Scaled:
    """``factor`` times a speedup function (keeps its ``max_useful_replicas``)."""

    def __init__(self, fn, factor: float) -> None:
        self.fn, self.factor = fn, float(factor)
        self.max_useful_replicas = getattr(fn, "max_useful_replicas", None)

    def __call__(self, num_nodes, num_replicas):
        return self.factor * np.asarray(self.fn(num_nodes, num_replicas), dtype=np.float64)


def _types_of(opts: _Options, pick: np.ndarray, movable: Sequence[int],
              capacity: np.ndarray) -> Dict[int, int]:
    """Job index -> the type of its picked option; a job left idle while it has options
    goes to the type with most slots left per job already there (the per-type solve then
    runs as many jobs as fit, first)."""
    out: Dict[int, int] = {}
    load = np.zeros(capacity.size)
    idle = []
    for row, j in enumerate(movable):
        o = int(pick[row])
        if opts.k[row, o] > 0:
            out[j] = int(opts.kind[row, o])
            load[out[j]] += 1
        elif (opts.valid[row] & (opts.k[row] > 0)).any():
            idle.append((row, j))
    for row, j in idle:
        kinds = np.unique(opts.kind[row][opts.valid[row] & (opts.k[row] > 0)])
        t = int(kinds[np.argmax(capacity[kinds] / (load[kinds] + 1.0))])
        out[j] = t
        load[t] += 1
    return out


def _option_costs(opts: _Options, p: float) -> np.ndarray:
    """Power term of every option (padding and idle: 0; see :func:`.fitness._cost_terms`)."""
    _, g = _cost_terms(np.where(opts.valid, opts.s, 0.0), p)
    return np.where(opts.valid & (opts.k > 0), g, 0.0)


def _idle_cost(cost: np.ndarray, opts: _Options) -> float:
    """What leaving a job idle costs in the single-part objective (module doc)."""
    running = cost[opts.valid & (opts.k > 0)]
    return _IDLE_FACTOR * (1.0 + float(running.max(initial=0.0)))


def _lagrangian(opts: _Options, capacity: np.ndarray, p: float) -> np.ndarray:
    """Best option per row at Lagrangian prices per type, then best responses filling
    what is left (module doc, step 2). Always within capacity."""
    J, O = opts.k.shape
    T = capacity.size
    cost = _option_costs(opts, p)
    idle = _idle_cost(cost, opts)
    base = np.where(opts.valid, np.where(opts.k > 0, cost, idle), np.inf)
    kind = np.where(opts.kind >= 0, opts.kind, 0)
    onehot = (kind[..., None] == np.arange(T)) & (opts.k > 0)[..., None] & opts.valid[..., None]
    use = onehot * opts.k[..., None]                        # J x O x T
    rows = np.arange(J)

    def respond(lam: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        val = base + use @ lam
        pick = np.argmin(val, axis=1)
        return pick, use[rows, pick].sum(axis=0)

    lam = np.zeros(T)
    pick, demand = respond(lam)
    scale = float(np.abs(cost[opts.valid]).max(initial=1.0)) + 1.0
    for _ in range(4):
        if np.all(demand <= capacity + 1e-9):
            break
        for t in range(T):
            trial = lam.copy()
            if respond(trial)[1][t] <= capacity[t]:
                # Lower the price as far as the type stays within its capacity.
                lo, hi = 0.0, trial[t]
            else:
                lo, hi = trial[t], max(trial[t], scale * 1e-6)
                while True:
                    trial[t] = hi
                    if respond(trial)[1][t] <= capacity[t] or hi > scale * 1e9:
                        break
                    lo, hi = hi, hi * 4.0
            for _ in range(30):
                trial[t] = 0.5 * (lo + hi)
                if respond(trial)[1][t] <= capacity[t]:
                    hi = trial[t]
                else:
                    lo = trial[t]
                if hi - lo <= 1e-9 * max(hi, 1e-300):
                    break
            lam[t] = hi
        pick, demand = respond(lam)
    # Repair: while a type is over capacity, move the job whose cheapest alternative that
    # fits costs least per slot freed.
    pick = pick.copy()
    demand = use[rows, pick].sum(axis=0)
    while np.any(demand > capacity + 1e-9):
        t = int(np.argmax(demand - capacity))
        on = np.flatnonzero(use[rows, pick, t] > 0)
        best = None
        for r in on:
            cur = int(pick[r])
            free_after = capacity - demand + use[r, cur]
            fits = opts.valid[r] & _fits(use[r], free_after) & (use[r, :, t] < use[r, cur, t])
            if not fits.any():
                continue
            cand = np.flatnonzero(fits)
            o = int(cand[np.argmin(base[r, cand])])
            per_slot = (base[r, o] - base[r, cur]) / max(use[r, cur, t] - use[r, o, t], 1)
            if best is None or per_slot < best[0]:
                best = (per_slot, r, o)
        if best is None:
            break
        _, r, o = best
        demand += use[r, o] - use[r, pick[r]]
        pick[r] = o
    return _best_responses(pick, base, use, capacity)


def _fits(use: np.ndarray, free: np.ndarray) -> np.ndarray:
    """Which options (rows of ``use``, slots per type) fit in ``free`` (types an option
    does not use may be over)."""
    return np.all((use == 0) | (use <= free + 1e-9), axis=1)


def _best_responses(pick: np.ndarray, base: np.ndarray, use: np.ndarray,
                    capacity: np.ndarray, max_passes: int = 8) -> np.ndarray:
    """Each job in turn takes its best option within what the others leave free, until
    no job improves (or ``max_passes``)."""
    J = pick.size
    rows = np.arange(J)
    demand = use[rows, pick].sum(axis=0)
    for _ in range(max_passes):
        changed = False
        order = np.argsort(base[rows, pick] - base.min(axis=1))[::-1]
        for r in order:
            cur = int(pick[r])
            free = capacity - demand + use[r, cur]
            fits = _fits(use[r], free) & np.isfinite(base[r])
            o = int(np.flatnonzero(fits)[np.argmin(base[r, fits])])
            if base[r, o] < base[r, cur] - 1e-12 * max(1.0, abs(base[r, cur])):
                demand += use[r, o] - use[r, cur]
                pick[r] = o
                changed = True
        if not changed:
            break
    return pick
