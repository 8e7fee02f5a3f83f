"""Why a job runs below its maximum while the cluster has room for more of it.

A user who sees a job on one replica beside idle CPUs wants the reason, not "no change".
After a solve, for each job the policy kept below the maximum its owner allowed while the
nodes still hold room for one of its replicas, :func:`held_reasons` says which of these
kept it there, in one line for its log and for ``adaptdl-ray ls``:

* **nearly finished**: less training left than a few resize costs pins it where it is;
* **bounded exploration**: a job grows at most ``exploration_factor`` times past the
  largest size its throughput model has measured (Pollux's rule; it rises as it measures);
* **no predicted gain**: its throughput model predicts no speedup from more replicas (on
  a machine with fewer cores than logical CPUs, the usual case);
* **the restart penalty**: a young job, or one restarted often, keeps only a share of a
  new size's speedup (Pollux's ``(T - R*delta) / (T + delta)``), and the gain does not make
  up for it;
* otherwise, the policy's choice over all jobs (fairness, placement).

Pure functions over a solve's inputs and result (no clock, no Ray).
"""

from __future__ import annotations

from typing import Hashable, Mapping, Sequence

import numpy as np

from adaptdl_core.policy import JobInfo, NodeInfo, restart_penalty

__all__ = ["held_reasons", "held_reason", "spare_replicas"]

# A relative speedup change below this is "no gain".
_GAIN = 1e-3
# Sizes looked at above a job's own (one vectorised evaluation of its speedup function).
_MOST_SIZES = 64


def spare_replicas(resources: Mapping[str, float], nodes: Mapping[Hashable, NodeInfo],
                   used: Mapping[Hashable, Mapping[str, float]]) -> int:
    """How many more replicas of ``resources`` fit in what ``used`` leaves of ``nodes``."""
    total = 0
    for key, node in nodes.items():
        taken = used.get(key, {})
        fits = [int((float(node.resources.get(k, 0.0)) - float(taken.get(k, 0.0)) + 1e-9)
                    // float(v)) for k, v in resources.items() if float(v) > 0]
        total += max(min(fits, default=0), 0)
    return total


def held_reason(info: JobInfo, *, replicas: int, num_nodes: int, spare: int,
                allowed: int | None, now: float, profiled: int = 0,
                exploration_factor: int = 2) -> str | None:
    """Why a job the policy gave ``replicas`` (on ``num_nodes`` nodes) is not larger, or
    ``None`` when nothing needs saying: it is at the maximum its owner allowed
    (``allowed``; ``None``: no maximum), or no room is left for one more replica
    (``spare``, replicas of it that still fit).

    Args:
        info: the job as the policy saw it (``max_replicas`` is its bound after
            exploration and the cluster).
        profiled: the largest replica count its throughput model covers (0: none).
        exploration_factor: how far past that it may grow.
    """
    if spare < 1 or replicas < 1 or (allowed is not None and replicas >= allowed):
        return None
    if not info.preemptible:
        return ("nearly finished: less training left than a few resize costs, so it is "
                "left as it is")
    if info.max_replicas is not None and replicas >= info.max_replicas:
        if profiled:
            return (f"exploring step by step: its throughput model covers up to {profiled} "
                    f"replica(s), so it may try up to {exploration_factor * profiled} until "
                    "it has measured more")
        return "its throughput model is not fitted yet: it grows once it has measured steps"
    upper = replicas + min(spare, _MOST_SIZES)
    if info.max_replicas is not None:
        upper = min(upper, info.max_replicas)
    if upper <= replicas:
        return None
    sizes = np.arange(replicas, upper + 1)
    speedups = np.asarray(info.speedup_fn(np.full(len(sizes), max(num_nodes, 1)), sizes),
                          dtype=float).reshape(-1)
    now_speedup = float(speedups[0])
    best = int(np.argmax(speedups[1:])) + 1
    best_size, best_speedup = int(sizes[best]), float(speedups[best])
    ratio = best_speedup / now_speedup if now_speedup > 0 else float("inf")
    if ratio <= 1.0 + _GAIN:
        return (f"its throughput model predicts no gain from more replicas (x{ratio:.2f} at "
                f"{best_size}; on CPUs, more replicas than cores slow each step)")
    penalty = restart_penalty(info, now)
    if best_speedup * penalty <= now_speedup:
        age = max(float(now) - info.creation_timestamp, 0.0)
        return (f"a resize does not pay yet: x{ratio:.2f} predicted at {best_size} replicas, "
                f"but at {age:.0f} s old with {info.num_restarts} restart(s) of "
                f"{info.restart_cost_s:.1f} s it would keep {penalty:.0%} of that (Pollux's "
                "restart penalty; it fades as the job ages)")
    return f"the policy gave the room to other jobs (x{ratio:.2f} predicted at {best_size})"


def held_reasons(infos: Mapping[Hashable, JobInfo],
                 nodes: Mapping[Hashable, NodeInfo],
                 allocations: Mapping[Hashable, Sequence[Hashable]], now: float, *,
                 allowed: Mapping[Hashable, int | None],
                 profiled: Mapping[Hashable, int],
                 exploration_factor: int = 2) -> dict[Hashable, str]:
    """:func:`held_reason` of every job of a solve that has one.

    Args:
        infos: the jobs as the policy saw them.
        nodes: the capacity it divided.
        allocations: its answer (job -> node ids, one per replica).
        allowed: each job's own maximum (``JobSpec.max_replicas``; ``None``: none).
        profiled: each job's largest profiled replica count.
    """
    used: dict[Hashable, dict[str, float]] = {}
    for job_id, placement in allocations.items():
        info = infos.get(job_id)
        if info is None:
            continue
        for key in placement:
            room = used.setdefault(key, {})
            for name, amount in info.resources.items():
                room[name] = room.get(name, 0.0) + float(amount)
    reasons = {}
    spare: dict[tuple, int] = {}  # per replica shape: most jobs of a cluster share a few
    for job_id, info in infos.items():
        placement = list(allocations.get(job_id, []))
        cap = allowed.get(job_id)
        if not placement or (cap is not None and len(placement) >= cap):
            continue
        shape = tuple(sorted(info.resources.items()))
        if shape not in spare:
            spare[shape] = spare_replicas(info.resources, nodes, used)
        reason = held_reason(
            info, replicas=len(placement), num_nodes=len(set(placement)), spare=spare[shape],
            allowed=cap, now=now, profiled=profiled.get(job_id, 0),
            exploration_factor=exploration_factor)
        if reason is not None:
            reasons[job_id] = reason
    return reasons
