"""The Sia baseline: Sia's scheduling formulation (SOSP'23) as a plain simulator policy.

Written from the paper's formulation and its artifact's simulator constants (no code of
it), so that Sia, Pollux and AdaptDL's own policy are compared in one simulator. Each round:

1. **Configurations** per GPU type ``t`` with ``g`` GPUs per node: 1, 2, 4, ... GPUs up to
   ``g`` on one node, then whole nodes (``2g``, ``3g``, ... up to the type's nodes, at most
   as many as its traces cover).
2. **Goodput** of every job in every configuration of every type, from the job's
   throughput fit on that type (its agent keeps one per type it ran on); for a type it has
   not run on, the fit of a type it has, scaled by the ratio of the model's one-GPU
   throughput on the two types (Sia profiles every job on one GPU of each type when it
   arrives; here the ratio comes from the traces). A job with no fit at all gets value 1 on
   one GPU of every type. A fit from one replica only takes its intra-node sync as free
   (:func:`~adaptdl_core.decision.jobs.exploring_params`, the rule adaptdl's policy uses
   too; Sia's own fit leaves sync terms it has not measured at about zero), so a new job
   is valued higher on two GPUs than on one. Configurations are capped at twice the most
   replicas the job has run at on any type (and by its largest batch). Values are
   normalised by the job's smallest, then multiplied by Pollux's restart factor ``max(age -
   R*delta, 0) / (age + delta)`` for every configuration but the one it has now (``delta``
   its restart cost, ``R`` its restarts; no factor while ``age < delta``).
3. **Mixed-integer program** (``scipy.optimize.milp``): choose at most one configuration
   per job, at most each type's GPUs, minimising ``sum x * round(v ** p, 2) +
   lambda_n * (jobs without a configuration)`` (``p = -0.5``, values clipped at 3000,
   ``lambda_n = 1.1``: every job that can run does). A job still paying its restart keeps
   its configuration.
4. **Placement** within each type: a job whose type and size are unchanged keeps its GPUs;
   the others, largest first, take whole free nodes for whole-node sizes and the fullest
   node that fits otherwise, spilling over nodes when no single one does.

ncf keeps one GPU at a fixed batch, as in both papers.
"""

from __future__ import annotations

import logging
from typing import Dict, List, Mapping, Tuple

import numpy as np

from adaptdl_core import validation
from adaptdl_core.decision.jobs import exploring_params
from adaptdl_core.goodput import GoodputFunction

from .gpu_types import TRACED_NODES, ClusterSpec
from .job_model import SimJob

__all__ = ["SiaPolicy", "sia_configs"]

LOG = logging.getLogger(__name__)

#: Largest value of a configuration's cost term (the artifact's clip).
_CLIP = 3000.0


def sia_configs(gpus_per_node: int, nodes: int) -> List[Tuple[int, int]]:
    """``(nodes, GPUs)`` configurations of one type: powers of two up to a node, then
    whole nodes."""
    out, k = [], 1
    while k < gpus_per_node:
        out.append((1, k))
        k *= 2
    out.append((1, gpus_per_node))
    out += [(n, n * gpus_per_node) for n in range(2, nodes + 1)]
    return out


def _restart_factor(job: SimJob, now: float) -> float:
    age = max(now - job.submission_time, 0.0)
    delta = job.restart_s
    if age < delta:
        return 1.0
    return max(age - (job.num_restarts or 0) * delta, 0.0) / (age + delta)


class SiaPolicy:
    """Sia (see the module doc) for :func:`adaptdl_core.sim.cluster.simulate`.

    Args:
        spec: the typed cluster.
        p: fairness exponent (< 0).
        lambda_n: cost of a job without a configuration (> 1: more than any running one).
        interval: seconds per round (unused: the simulator calls every round).
        max_replicas: most GPUs a job may get.
        mip_rel_gap: relative optimality gap the solver may stop at.

    Raises:
        ValueError: malformed arguments (named).
    """

    name = "sia"
    type_aware = True

    def __init__(self, spec: ClusterSpec, *, p: float = -0.5, lambda_n: float = 1.1,
                 interval: float = 60.0, max_replicas: int = 64,
                 mip_rel_gap: float = 1e-4) -> None:
        self.p = validation.number("p", p, high=0.0, high_open=True)
        self.lambda_n = validation.number("lambda_n", lambda_n, 1.0, low_open=True)
        self.max_replicas = validation.integer("max_replicas", max_replicas, 1)
        self.mip_rel_gap = validation.number("mip_rel_gap", mip_rel_gap, 0.0)
        self.interval = interval
        self.spec = spec
        self._types = spec.node_types()
        self._node_gpus = spec.node_gpus()
        self.configs: List[Tuple[str, int, int]] = []   # (type, nodes, GPUs)
        for t in spec.types:
            sizes = [g.gpus_per_node for g in spec.groups if g.gpu_type == t]
            count = sum(g.count for g in spec.groups if g.gpu_type == t)
            nodes = min(count, TRACED_NODES.get(t, count))
            self.configs += [(t, n, k) for n, k in sia_configs(max(sizes), nodes)]
        self._capacity = spec.gpus_by_type()
        self._previous: Dict[str, int] = {}       # job -> config index
        self.solve_status: List[int] = []

    # -- goodputs ---------------------------------------------------------------------
    def _values(self, job: SimJob) -> np.ndarray:
        """Normalised goodput per configuration (0: not allowed), before restarts."""
        vals = np.zeros(len(self.configs))
        if job.target_batch_size is not None:
            # Fixed-batch jobs (ncf) run on one GPU at their batch: their throughput.
            for i, (t, n, k) in enumerate(self.configs):
                if k == 1:
                    vals[i] = job.apps_by_type[t].one_gpu_throughput()
            return vals / vals[vals > 0].min()
        fits = job.fits_by_type()
        most = max((r for _, r in fits.values()), default=0)
        limit = min(max(2 * most, 1), self.max_replicas,
                    job.app.max_batch_size // job.app.min_local_bsz)
        if not fits or job.grad_params is None:
            for i, (t, n, k) in enumerate(self.configs):
                vals[i] = 1.0 if k == 1 else 0.0
            return vals
        source = next(iter(sorted(fits)))
        for t in self.spec.types:
            idx = [i for i, c in enumerate(self.configs) if c[0] == t and c[2] <= limit]
            if not idx:
                continue
            if t in fits:
                model_type, scale = t, 1.0
            else:
                model_type = source
                scale = (job.apps_by_type[t].one_gpu_throughput()
                         / job.apps_by_type[source].one_gpu_throughput())
            app = job.apps_by_type[model_type]
            fn = GoodputFunction(exploring_params(*fits[model_type]), job.grad_params,
                                 app.init_batch_size)
            gpn = max(g.gpus_per_node for g in self.spec.groups if g.gpu_type == model_type)
            ks = np.array([self.configs[i][2] for i in idx])
            ns = np.where(model_type == t, [self.configs[i][1] for i in idx],
                          np.ceil(ks / gpn)).astype(int)
            goodput = fn.optimize(ns, ks, app.max_batch_size,
                                  (app.min_local_bsz, app.max_local_bsz),
                                  accumulation=True)[0]
            vals[idx] = np.where(np.isfinite(goodput), np.maximum(goodput, 0.0), 0.0) * scale
        pos = vals > 0
        if not pos.any():
            vals[[i for i, c in enumerate(self.configs) if c[2] == 1]] = 1.0
            return vals
        return vals / vals[pos].min()

    # -- the round ----------------------------------------------------------------------
    def decide(self, now: float, jobs: Mapping[str, SimJob],
               allocations: Mapping[str, List[int]], nodes: Mapping[int, int]
               ) -> Dict[str, List[int]]:
        """New allocations (job -> node ids, one per GPU, all of one type)."""
        from scipy.optimize import Bounds, LinearConstraint, milp

        names = list(jobs)
        self._previous = {k: v for k, v in self._previous.items()
                          if k in jobs and allocations.get(k)}
        if not names:
            return {}
        cost_rows, fixed = [], {}
        for j, name in enumerate(names):
            job = jobs[name]
            vals = self._values(job)
            prev = self._previous.get(name)
            if prev is not None:
                keep = vals[prev]
                vals = vals * _restart_factor(job, now)
                vals[prev] = keep
                if job.rescale_left > 0:      # still restoring: keeps its configuration
                    fixed[j] = prev
            with np.errstate(divide="ignore"):
                a = np.where(vals > 0, np.round(np.minimum(vals ** self.p, _CLIP), 2), np.inf)
            cost_rows.append(a)
        A = np.array(cost_rows)                       # J x C, inf: not allowed
        allowed = np.isfinite(A)
        var_j, var_c = np.nonzero(allowed)
        # minimise sum x (A - lambda_n) (+ constant lambda_n * J)
        c = A[var_j, var_c] - self.lambda_n
        n = var_j.size
        rows, lo, hi = [], [], []
        one_per_job = np.zeros((len(names), n))
        one_per_job[var_j, np.arange(n)] = 1.0
        rows.append(one_per_job)
        lo += [0.0] * len(names)
        hi += [1.0] * len(names)
        types = self.spec.types
        use = np.zeros((len(types), n))
        for ti, t in enumerate(types):
            sel = np.array([self.configs[ci][0] == t for ci in var_c])
            use[ti, sel] = [self.configs[ci][2] for ci in var_c[sel]]
        rows.append(use)
        lo += [0.0] * len(types)
        hi += [float(self._capacity[t]) for t in types]
        lb = np.zeros(n)
        for j, ci in fixed.items():
            lb[(var_j == j) & (var_c == ci)] = 1.0
        res = milp(c, constraints=LinearConstraint(np.vstack(rows), lo, hi),
                   integrality=np.ones(n), bounds=Bounds(lb, np.ones(n)),
                   options={"mip_rel_gap": self.mip_rel_gap})
        self.solve_status.append(int(res.status))
        if res.x is None:
            LOG.warning("sia: the solver found no allocation (%s); keeping the current one",
                        res.message)
            return {k: list(v) for k, v in allocations.items() if k in jobs}
        chosen = {names[var_j[i]]: int(var_c[i]) for i in np.flatnonzero(res.x > 0.5)}
        out = self._place(chosen, allocations)
        self._previous = chosen
        return out

    def _place(self, chosen: Mapping[str, int], allocations: Mapping[str, List[int]]
               ) -> Dict[str, List[int]]:
        free = dict(self._node_gpus)
        out: Dict[str, List[int]] = {}
        todo = []
        for name, ci in chosen.items():
            t, _, k = self.configs[ci]
            old = allocations.get(name) or []
            if len(old) == k and old and self._types[old[0]] == t:
                out[name] = list(old)
                for node in old:
                    free[node] -= 1
            else:
                todo.append((name, t, k))
        todo.sort(key=lambda x: -x[2])
        for name, t, k in todo:
            room = {node: g for node, g in free.items() if self._types[node] == t and g > 0}
            out[name] = _take(k, room, max(self._node_gpus[node] for node in self._node_gpus
                                          if self._types[node] == t))
            for node in out[name]:
                free[node] -= 1
        return out


def _take(k: int, room: Dict[int, int], node_size: int) -> List[int]:
    """``k`` GPUs from ``room`` (node -> free GPUs of one type): on the fullest node that
    holds them all; else whole free nodes first, then the nodes with most room.

    Raises:
        RuntimeError: fewer than ``k`` free GPUs (the program's capacity rows forbid it)."""
    if sum(room.values()) < k:
        raise RuntimeError(f"sia: {k} GPUs asked, {sum(room.values())} free")
    fits = [n for n, g in room.items() if g >= k]
    if fits:
        node = min(fits, key=lambda n: (room[n] - k, n))
        return [node] * k
    out: List[int] = []
    for node in sorted(room, key=lambda n: (-(room[n] == node_size), -room[n], n)):
        take = min(room[node], k - len(out))
        out += [node] * take
        if len(out) == k:
            break
    return sorted(out)
