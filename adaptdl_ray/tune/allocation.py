"""From trials' scheduler hints to the policy's jobs (pure functions, no Ray calls).

Each trial becomes a :class:`~adaptdl_core.policy.JobInfo`: its speedup function comes
from the goodput model in its hints (or the linear prior before it has one; with the sync
cost of replicas not measured yet taken as zero, Pollux's prior-driven exploration), its replica
bounds from the trainable's :class:`~adaptdl_ray.tune.resources.ReplicaSpec`, the cluster,
and bounded exploration (at most twice the largest replica count it has been profiled at,
so an extrapolated model is never trusted far beyond what was measured).
"""

from __future__ import annotations

import logging
from typing import Any, Mapping

from adaptdl_core.goodput import GoodputFunction, PerfParams
from adaptdl_core.policy import JobInfo, LinearSpeedup, NodeInfo, SpeedupFunction
from adaptdl_core.sched_hints import SchedHints
from adaptdl_ray.tune.resources import ReplicaSpec, cluster_capacity

LOG = logging.getLogger(__name__)

__all__ = ["speedup_from_hints", "job_info", "exploration_cap"]


def speedup_from_hints(hints: Mapping[str, Any] | None) -> Any:
    """The speedup function for a trial's hints: Pollux's goodput-based one when the hints
    hold a throughput fit and gradient statistics, else :class:`LinearSpeedup`."""
    if not hints:
        return LinearSpeedup(0)
    try:
        parsed = SchedHints.from_dict(hints)
    except ValueError as exc:
        LOG.warning("ignoring malformed scheduler hints (%s); using the linear prior", exc)
        return LinearSpeedup(0)
    goodput = parsed.goodput_function()
    if goodput is None:
        return LinearSpeedup(parsed.max_profiled_replicas)
    if parsed.max_profiled_replicas <= 1:
        goodput = _exploring(parsed)
    try:
        return SpeedupFunction(goodput, parsed.max_batch_size, parsed.local_bsz_bounds,
                               parsed.gradient_accumulation)
    except ValueError as exc:
        LOG.warning("goodput model unusable (%s); using the linear prior", exc)
        return LinearSpeedup(parsed.max_profiled_replicas)


def _exploring(hints: SchedHints) -> GoodputFunction:
    """Pollux's prior-driven exploration: a job measured on one replica only has no
    measured gradient-sync cost, and the fit's stand-in for it is a guess; take it as zero
    instead, so that a job with idle room next to it tries a second replica (its growth is
    bounded by :func:`exploration_cap`, and it must pay for its resize). Once it has run on
    several replicas, the fitted sync cost decides."""
    p = hints.perf_params
    optimistic = PerfParams(p.alpha_c, p.beta_c, p.alpha_n, p.beta_n, 0.0, 0.0, p.gamma)
    return GoodputFunction(optimistic, hints.grad_params, hints.init_batch_size)


def exploration_cap(hints: Mapping[str, Any] | None) -> int:
    """Most replicas a trial may get next: twice the largest count it was profiled at, and
    1 for a trial not profiled yet (it grows once its first measurements say it pays);
    the same bound as the linear prior's cap."""
    return LinearSpeedup(max(int((hints or {}).get("max_profiled_replicas") or 0), 0)).cap


def job_info(spec: ReplicaSpec, nodes: Mapping[Any, NodeInfo], *, created: float,
             hints: Mapping[str, Any] | None, restarts: int = 0,
             restart_cost_s: float | None = None, current_replicas: int = 0) -> JobInfo:
    """One trial as a policy job.

    Args:
        spec: the trainable's replica spec.
        nodes: the cluster (to bound ``max_replicas`` by what fits at all).
        created: when the trial was added (seconds).
        hints: its latest scheduler hints, or ``None``.
        restarts, restart_cost_s: for the restart penalty (``None``: the policy default).
        current_replicas: replicas it runs with now (exploration never shrinks it below).

    Raises:
        ValueError: if the cluster cannot hold ``spec.min_replicas`` replicas at all (the
            message says what is missing).
    """
    capacity = cluster_capacity(spec, nodes)
    if capacity < spec.min_replicas:
        raise ValueError(
            f"the trial needs at least min_replicas={spec.min_replicas} replicas of "
            f"{dict(spec.resources)} but the whole cluster holds {capacity}: lower "
            "min_replicas or the resources per worker, or add nodes")
    upper = max(exploration_cap(hints), current_replicas, spec.min_replicas)
    upper = min(upper, capacity)
    if spec.max_replicas is not None:
        upper = min(upper, spec.max_replicas)
    return JobInfo(resources=spec.resources, speedup_fn=speedup_from_hints(hints),
                   creation_timestamp=created, min_replicas=spec.min_replicas,
                   max_replicas=upper, num_restarts=restarts,
                   restart_cost_s=restart_cost_s)
