"""AdaptDL's own policy: Pollux's allocator, weighted by how much work each job has left.

Pollux (:class:`~adaptdl_core.policy.PolluxPolicy`, ``p = -1`` over speedups normalised
at each job's fair share) is blind to remaining work. Ordering by remaining work
(shortest first) lowers the average job completion time, because every second a short job
finishes earlier is a second less for it *and* frees its GPUs sooner; pure shortest-first
starves long jobs. :class:`RemainingWorkPolicy` keeps Pollux's fair objective and tilts it:

* **Weights** (:func:`remaining_weights`, pure): each job's power term is multiplied by
  ``w = (R_ref / R) ** alpha``, ``R`` its estimated seconds left (``JobInfo.remaining_s``,
  what the front-end estimates from the job's own history) and ``R_ref`` the median over
  the round's jobs with an estimate, clipped to ``[1 / max_weight, max_weight]``. With
  ``p = -1`` a job's share grows about as ``sqrt(w)``, so the clip bounds how far a long
  job's share can shrink: once its weight is at ``1 / max_weight`` it shrinks no further
  however many shorter jobs arrive. A job without an estimate (before its first epoch)
  weighs 1.
* **Rounding** (optional, ``quantize``): weights rounded to powers of two, meant to keep
  estimates drifting between rounds from moving jobs; measured, it restarted jobs no less
  often and changed the results within noise, so it is off by default.
* **Ageing** (tail guard): a job's weight is at least ``min(age / patience_s,
  ageing_cap)``, so a long job that has been in the cluster ``patience_s`` seconds is
  weighed like Pollux weighs it again, whatever its remaining work; with ``ageing_cap``
  above 1 (default 1) its weight goes on growing with its age up to that cap: the longer
  a job has been in the cluster, the more it weighs (the mixed-cluster default, see
  :class:`RemainingWorkPolicy`).
* **Exploration** (``exploration_factor``, default 4): a job may be grown to four times
  the largest replica count it has been profiled at, where Pollux allows twice. Pollux's
  bound makes a job that scales climb 1, 2, 4, 8, 16 replicas over five or more rounds
  (each a restart) while GPUs stand idle. Measured in the simulator, the shorter climb
  gives most of this policy's gain at half load and the weights most at full load, and
  jobs restart less often than under Pollux (``benchmarks/README.md``). A job that does
  not scale is shrunk back at a later round once its profile at the larger count says so.
  The decision core reads the attribute (:func:`adaptdl_core.decision.exploration_cap`).
  It widens the bound of jobs with a fitted throughput model; a job without one keeps
  the linear prior, whose speedup is flat beyond twice its profiled count, so it still
  doubles. (The simulator's autoscaler sizes the cluster with Pollux's bound.)
* **Admission** (:func:`admission_order`, pure): when the jobs' minimum sizes do not all
  fit, Pollux's lexicographic objective would idle the job with the largest power term,
  which is the *heaviest*; here the jobs that run are chosen in order of weight instead
  (a running job counts ``running_bonus`` times its weight, against churn; ties by age),
  and the rest wait with no replicas.

Everything it uses a real front-end knows: the estimate, the job's age, and the speedup
models Pollux already uses. With all weights 1 and nothing to admit it is Pollux.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from typing import Any, Dict, Hashable, List, Mapping, Optional, Sequence

import numpy as np

from adaptdl_core import validation

from .allocator import AllocationResult, JobInfo, NodeInfo, PolluxPolicy, power_mean
from .typed import TypedAllocator, mixed_types, typed_round_applies

LOG = logging.getLogger(__name__)

__all__ = ["POLICY_NAMES", "RemainingWorkPolicy", "admission_order", "policy_by_name",
           "remaining_weights"]


def _check_seconds_or_inf(name: str, value: Any) -> float:
    """``value`` as seconds > 0, where ``inf`` means never."""
    if isinstance(value, float) and value == math.inf:
        return value
    return validation.number(name, value, 0.0, low_open=True,
                             what="a number of seconds (or inf)")


def remaining_weights(jobs: Mapping[Hashable, JobInfo], now: float, *, alpha: float = 1.0,
                      max_weight: float = 4.0, patience_s: float = math.inf,
                      quantize: bool = False, ageing_cap: float = 1.0
                      ) -> Dict[Hashable, float]:
    """Each job's weight in the fitness (see the module doc); pure.

    Args:
        jobs: the round's jobs; ``remaining_s`` ``None`` means unknown (weight 1 before
            ageing).
        now: the policy's clock, seconds (``creation_timestamp``'s clock).
        alpha: how strongly remaining work tilts the weights (0: all 1, Pollux).
        max_weight: weights are clipped to ``[1 / max_weight, max_weight]`` (>= 1).
        patience_s: seconds of age after which a job weighs at least 1 (``inf``: never).
        ageing_cap: the most that ageing lifts a weight to (``1 <= ageing_cap <=
            max_weight``): a job weighs at least ``min(age / patience_s, ageing_cap)``.
        quantize: round each weight (before ageing) to the nearest power of two.

    Returns:
        job key -> weight (> 0).

    Raises:
        ValueError: a malformed argument (named).
    """
    validation.number("alpha", alpha, 0.0)
    validation.number("max_weight", max_weight, 1.0)
    patience_s = _check_seconds_or_inf("patience_s", patience_s)
    validation.number("ageing_cap", ageing_cap, 1.0, float(max_weight))
    known = [j.remaining_s for j in jobs.values() if j.remaining_s is not None]
    # A job estimated to be done weighs the most; one second stands in for zero.
    ref = max(float(np.median(known)), 1.0) if known else None
    out = {}
    for key, job in jobs.items():
        w = 1.0
        if ref is not None and job.remaining_s is not None and alpha > 0:
            w = (ref / max(job.remaining_s, 1.0)) ** alpha
            w = min(max(w, 1.0 / max_weight), max_weight)
            if quantize:
                w = 2.0 ** round(math.log2(w))
        if w < ageing_cap and math.isfinite(patience_s):
            age = max(float(now) - job.creation_timestamp, 0.0)
            w = max(w, min(age / patience_s, ageing_cap))
        out[key] = w
    return out


def admission_order(jobs: Mapping[Hashable, JobInfo], weights: Mapping[Hashable, float],
                    running: Sequence[Hashable] = (), *, running_bonus: float = 2.0
                    ) -> List[Hashable]:
    """The jobs in the order they are let run when not all fit (pure): pinned
    (non-preemptible running) jobs first, then by weight (a running job's weight times
    ``running_bonus``), then oldest first, then by key order as given."""
    run = set(running)
    keys = list(jobs)

    def rank(i: int):
        key = keys[i]
        job = jobs[key]
        pinned = key in run and not job.preemptible
        prio = weights[key] * (running_bonus if key in run else 1.0)
        return (not pinned, -prio, job.creation_timestamp, i)

    return [keys[i] for i in sorted(range(len(keys)), key=rank)]


class RemainingWorkPolicy:
    """Pollux weighted by remaining work, with ageing and admission by weight (see the
    module doc). Same interface as :class:`PolluxPolicy` (``allocate``/``optimize``).

    The defaults (``alpha=1, max_weight=4, patience_s=2 h, exploration_factor=4``) were
    chosen by ``benchmarks/sim_cluster.py`` over the Pollux paper's workloads
    (``benchmarks/README.md``).

    On a cluster of several accelerator types (:func:`.typed.mixed_types`) the weights
    take ``mixed_alpha`` and ``mixed_ageing_cap`` instead (defaults 0 and 4: no tilt by
    remaining work, old jobs first). A job runs on one type at a time, so the
    job left last can use one type's GPUs at most, while the rest stand idle; ordering by
    remaining work leaves the longest jobs for last, and there it cost the p99 and the
    makespan more than it bought on the average, where ageing past 1 did not
    (``benchmarks/sim_hetero.py``, ``benchmarks/README.md``).

    Args:
        p: power-mean exponent (< 0; -1 as Pollux).
        alpha, max_weight, patience_s, quantize, ageing_cap: see
            :func:`remaining_weights`.
        mixed_alpha, mixed_ageing_cap: ``alpha`` and ``ageing_cap`` on a cluster of
            several types (``mixed_ageing_cap <= max_weight``).
        running_bonus: see :func:`admission_order` (>= 1).
        exploration_factor: a job may be grown to this many times the largest replica
            count it has been profiled at (an integer >= 2; Pollux's is 2).
        **pollux_options: passed to :class:`PolluxPolicy` (``fair_share`` is always on).

    Raises:
        ValueError: a malformed argument (named).
    """

    name = "adaptdl"

    def __init__(self, p: float = -1.0, *, alpha: float = 1.0, max_weight: float = 4.0,
                 patience_s: float = 2 * 3600.0, running_bonus: float = 2.0,
                 quantize: bool = False, exploration_factor: int = 4,
                 ageing_cap: float = 1.0, mixed_alpha: float = 0.0,
                 mixed_ageing_cap: float = 4.0, **pollux_options) -> None:
        pollux_options.pop("fair_share", None)
        self.pollux = PolluxPolicy(p, fair_share=True, **pollux_options)
        #: Rounds on nodes of several accelerator types (see :mod:`.typed`).
        self.typed = TypedAllocator(p, fair_share=True, **pollux_options)
        if not self.pollux.p < 0:
            raise ValueError(f"p must be < 0 for RemainingWorkPolicy (weights scale speedups "
                             f"as w ** (1/p)), got {p!r}; use -1")
        remaining_weights({}, 0.0, alpha=alpha, max_weight=max_weight, patience_s=patience_s,
                          ageing_cap=ageing_cap)
        self.ageing_cap = float(ageing_cap)
        validation.number("mixed_alpha", mixed_alpha, 0.0)
        validation.number("mixed_ageing_cap", mixed_ageing_cap, 1.0, float(max_weight))
        self.mixed_alpha, self.mixed_ageing_cap = float(mixed_alpha), float(mixed_ageing_cap)
        validation.number("running_bonus", running_bonus, 1.0)
        self.alpha, self.max_weight = float(alpha), float(max_weight)
        self.patience_s, self.running_bonus = float(patience_s), float(running_bonus)
        if not isinstance(quantize, (bool, int, float)):
            raise ValueError(f"quantize must be True or False, got {quantize!r}")
        self.quantize = bool(quantize)
        if isinstance(exploration_factor, float) and exploration_factor.is_integer():
            exploration_factor = int(exploration_factor)  # from a KEY=NUMBER command line
        #: Read by the decision core: how far beyond its profile a job may be grown.
        self.exploration_factor = validation.integer("exploration_factor",
                                                     exploration_factor, 2)

    @property
    def p(self) -> float:
        """The power-mean exponent."""
        return self.pollux.p

    def weights(self, jobs: Mapping[Hashable, JobInfo], now: float, *,
                mixed: bool = False) -> Dict[Hashable, float]:
        """:func:`remaining_weights` with this policy's settings (``mixed``: those of a
        cluster of several types)."""
        return remaining_weights(jobs, now, alpha=self.mixed_alpha if mixed else self.alpha,
                                 max_weight=self.max_weight, patience_s=self.patience_s,
                                 quantize=self.quantize,
                                 ageing_cap=self.mixed_ageing_cap if mixed else self.ageing_cap)

    def admitted(self, jobs: Mapping[Hashable, JobInfo], nodes: Mapping[Hashable, NodeInfo],
                 base: Mapping[Hashable, Sequence[Hashable]],
                 weights: Mapping[Hashable, float]) -> List[Hashable]:
        """The jobs that may run this round: all when their minimum sizes fit the
        cluster's totals, else the longest prefix of :func:`admission_order` that does
        (a job that does not fit is skipped, smaller ones after it may still run)."""
        totals: Dict[str, float] = {}
        for node in nodes.values():
            for name, amount in node.resources.items():
                totals[name] = totals.get(name, 0.0) + amount

        def need(job: JobInfo, count: int) -> Dict[str, float]:
            return {name: amount * count for name, amount in job.resources.items()}

        running = [k for k in jobs if base.get(k)]
        used: Dict[str, float] = {}
        for key, job in jobs.items():
            for name, amount in need(job, max(job.min_replicas, 1)).items():
                used[name] = used.get(name, 0.0) + amount
        if all(v <= totals.get(name, 0.0) + 1e-9 for name, v in used.items()):
            return list(jobs)
        out, used = [], {}
        for key in admission_order(jobs, weights, running, running_bonus=self.running_bonus):
            job = jobs[key]
            count = len(base[key]) if key in running and not job.preemptible \
                else max(job.min_replicas, 1)
            extra = need(job, count)
            if all(used.get(n, 0.0) + v <= totals.get(n, 0.0) + 1e-9
                   for n, v in extra.items()):
                out.append(key)
                for n, v in extra.items():
                    used[n] = used.get(n, 0.0) + v
        return out

    def allocate(self, jobs: Mapping[Hashable, JobInfo], nodes: Mapping[Hashable, NodeInfo],
                 base_allocations: Optional[Mapping[Hashable, Sequence[Hashable]]] = None,
                 *, now: Optional[float] = None) -> AllocationResult:
        """Solve one round (see :meth:`PolluxPolicy.allocate`; same arguments and result,
        ``details["weights"]`` holds the weights used).

        Raises:
            ValueError: malformed input (from :class:`PolluxPolicy`, named).
        """
        t0 = time.perf_counter()
        if not isinstance(jobs, Mapping):
            raise ValueError(f"jobs must be a dict of key -> JobInfo, got {type(jobs).__name__}")
        now = time.time() if now is None else now
        base = dict(base_allocations or {})
        weights = self.weights(jobs, now, mixed=mixed_types(nodes))
        admitted = self.admitted(jobs, nodes, base, weights)
        if len(admitted) < len(jobs):
            LOG.debug("%d of %d jobs fit at their minimum size; waiting by weight: %s",
                      len(admitted), len(jobs), sorted(set(jobs) - set(admitted), key=str))
        weighted = {k: jobs[k] if weights[k] == 1.0 else
                    dataclasses.replace(jobs[k], weight=weights[k] * jobs[k].weight)
                    for k in admitted}
        solver = self.typed if typed_round_applies(weighted, nodes) else self.pollux
        result = solver.allocate(weighted, nodes, base, now=now)
        allocations = {k: list(result.allocations.get(k, [])) for k in jobs}
        speedups = {k: float(result.speedups.get(k, 0.0)) for k in jobs}
        values = list(speedups.values())
        details = dict(result.details)
        details["weights"] = weights
        details["admitted"] = len(admitted)
        return AllocationResult(allocations=allocations, speedups=speedups,
                                fitness=power_mean(values, self.p),
                                num_idle=int(sum(1 for v in values if v <= 0)),
                                optimal=result.optimal and len(admitted) == len(jobs),
                                gap=result.gap, solve_time_s=time.perf_counter() - t0,
                                details=details)

    def optimize(self, jobs: Mapping[Hashable, JobInfo], nodes: Mapping[Hashable, NodeInfo],
                 base_allocations: Optional[Mapping[Hashable, Sequence[Hashable]]] = None,
                 *, now: Optional[float] = None) -> Dict[Hashable, List[Hashable]]:
        """Like :meth:`allocate` but return only job key -> list of node keys."""
        return self.allocate(jobs, nodes, base_allocations, now=now).allocations


#: Names :func:`policy_by_name` knows: the faithful Pollux and this module's policy.
POLICY_NAMES = ("pollux", "adaptdl")


def policy_by_name(name: str, p: float = -1.0, **options):
    """The allocation policy called ``name``: ``"pollux"`` (``PolluxPolicy(p,
    fair_share=True)``, Pollux as published) or ``"adaptdl"``
    (:class:`RemainingWorkPolicy`); ``options`` go to its constructor.

    Raises:
        ValueError: an unknown name (the message lists the known ones), or bad options.
    """
    if name == "pollux":
        options.pop("fair_share", None)
        return PolluxPolicy(p, fair_share=True, **options)
    if name == "adaptdl":
        return RemainingWorkPolicy(p, **options)
    raise ValueError(f"policy must be one of {', '.join(POLICY_NAMES)}, got {name!r}")
