"""One allocation round as arrays: the validated, index-based view every stage works on.

:class:`_Problem` checks the inputs of a round, orders the jobs oldest first, turns
resources into a node x resource capacity matrix and a job x resource request matrix and
base allocations into replica counts per node, and derives what every stage shares: which
jobs are pinned (non-preemptible and running), the capacity those leave, which nodes each
job may use, and each job's restart penalty. It memoises speedup evaluations and gives a
placement's effective speedup and objective cost (see :mod:`.fitness`).
"""

from __future__ import annotations

import math
import time
from typing import Dict, Hashable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from adaptdl_core import validation

from .fitness import _cost_one, _KEEP_BONUS, _check_p, _cost_terms, restart_penalty
from .records import JobInfo, NodeInfo

# Tolerance when flooring capacity / request ratios (float resources such as 0.5 CPU).
_FIT_EPS = 1e-9


class _Problem:
    """Validated, index-based view of one allocation round."""

    def __init__(self, jobs: Mapping[Hashable, JobInfo], nodes: Mapping[Hashable, NodeInfo],
                 base_allocations: Optional[Mapping[Hashable, Sequence[Hashable]]],
                 p: float, now: Optional[float], fair_share: bool = False) -> None:
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
        self.now = validation.number("now", now, what="a finite number of seconds or None")

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
        # Bounded by what each job can use, never by node capacity (the option tables and
        # the DP's capacity scale with these counts); a running job may keep its size.
        self.max_r = np.array(
            [max(job.replica_bound(), min(int(self.base[j].sum()), job.max_replicas
                                          if job.max_replicas is not None else 2 ** 40))
             for j, job in enumerate(self.jobs)], dtype=np.int64)
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
        # What the optimiser maximises is each job's speedup over its speedup at its fair
        # share (Pollux: a job's goodput at the fair share counts as 1); see fair_scale().
        self.scale = np.ones(J)
        if fair_share and J:
            for j in range(J):
                nodes_f, replicas_f = self.fair_share(j)
                base = float(self._call_speedup_fn(j, np.array([nodes_f]),
                                                   np.array([replicas_f]))[0])
                if math.isfinite(base) and base > 0:
                    self.scale[j] = 1.0 / base
        # A job's weight w multiplies its power term: w * S**p == (w**(1/p) * S)**p, so it
        # is a factor on its (normalised) speedup; reported speedups divide it out again.
        weights = np.array([job.weight for job in self.jobs], dtype=np.float64)
        if J and np.any(weights != 1.0):
            if self.p == 0:
                raise ValueError("job weights other than 1 need p != 0 (the geometric mean "
                                 "has no weighted form here): use p = -1 or set weight=1")
            self.scale = self.scale * weights ** (1.0 / self.p)

    def fair_share(self, j: int) -> Tuple[int, int]:
        """``(nodes, replicas)`` of job ``j``'s fair share of the cluster: the cluster
        divided evenly among the round's jobs by the job's dominant resource (the resource
        it asks the largest share of), at least one replica, on as few nodes as that
        share of the cluster spans."""
        total = self.cap.sum(axis=0)
        asked = self.req[j] > 0
        if not asked.any() or np.any(total[asked] <= 0):
            return 1, 1
        dominant = float(np.max(self.req[j][asked] / total[asked]))
        replicas = max(int(math.ceil(1.0 / dominant / self.J - _FIT_EPS)), 1)
        nodes = min(max(int(math.ceil(self.M * dominant - _FIT_EPS)), 1), replicas)
        return nodes, replicas

    # -- speedups and costs -------------------------------------------------------------
    def speedup(self, j: int, n_nodes: np.ndarray, n_replicas: np.ndarray) -> np.ndarray:
        """Speedups of job ``j`` at the given shapes, over its fair-share speedup when the
        round normalises (memoised per round, validated)."""
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
        vals = self._call_speedup_fn(j, n_nodes, n_replicas)
        vals = np.where(n_replicas > 0, vals, 0.0)
        if not np.all(np.isfinite(vals)) or np.any(vals < 0):
            raise ValueError(f"jobs[{self.job_keys[j]!r}].speedup_fn must return finite "
                             f"speedups >= 0, got {vals!r} for replicas {n_replicas!r}")
        if self.scale[j] != 1.0:
            vals = vals * self.scale[j]
        cache.update(zip(zip(n_nodes.tolist(), n_replicas.tolist()), vals.tolist()))
        return vals

    def _call_speedup_fn(self, j: int, n_nodes: np.ndarray, n_replicas: np.ndarray
                         ) -> np.ndarray:
        """Job ``j``'s speedup function at the shapes, as a float array of their shape.

        Raises:
            ValueError: whatever the user's function raised (``ZeroDivisionError``,
                ``TypeError``...) or a result of the wrong shape, naming the job; the
                original error is chained.
        """
        try:
            vals = np.asarray(self.jobs[j].speedup_fn(n_nodes, n_replicas), dtype=np.float64)
            if vals.shape != n_nodes.shape:
                vals = np.broadcast_to(vals, n_nodes.shape)
        except MemoryError:
            raise
        except Exception as exc:  # any bug in the user's function: name the job
            raise ValueError(f"jobs[{self.job_keys[j]!r}].speedup_fn failed at num_nodes="
                             f"{n_nodes.tolist()[:8]}, num_replicas={n_replicas.tolist()[:8]}"
                             f": {type(exc).__name__}: {exc}") from exc
        return vals

    def effective(self, j: int, counts: np.ndarray) -> Tuple[float, float]:
        """(speedup used by the optimiser incl. keep bonus, reported effective speedup)."""
        k = int(counts.sum())
        if k == 0:
            return 0.0, 0.0
        n = int(np.count_nonzero(counts))
        # The memo is checked first: building arrays for one cached value costs more than
        # the lookup, and the searches ask for the same few shapes many times.
        raw = self._cache[j].get((n, k))
        if raw is None:
            raw = float(self.speedup(j, np.array([n]), np.array([k]))[0])
        # Reported speedups stay in the speedup function's own units.
        unit = 1.0 / self.scale[j]
        if not self.base_known[j]:
            return raw, raw * unit
        if np.array_equal(counts, self.base[j]):
            return raw * (1.0 + _KEEP_BONUS), raw * unit
        eff = raw * self.factor[j]
        return eff, eff * unit

    def cost(self, s: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """Per-job cost pair (idle flag, power term) to minimise, for speedups ``s``."""
        return _cost_terms(s, self.p)

    def cost_one(self, s: float) -> Tuple[float, float]:
        """:meth:`cost` of a single speedup, as plain floats (the searches' inner loop)."""
        return _cost_one(s, self.p)

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
