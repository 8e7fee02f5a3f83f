"""Finish-time fairness of a simulated schedule (Mahajan et al., Themis, NSDI'20).

A job's finish-time fairness ratio is its JCT under the schedule over its JCT alone on an
equal share of the cluster: ``G / N`` GPUs, where ``G`` is the cluster's GPUs and ``N`` the
average number of jobs in the system (submitted and not finished, itself included) over
the job's lifetime in that schedule. A ratio above 1 means the job did worse than an even
split would have given it; the schedule's figure is the largest ratio over its jobs.

:func:`contention` and :func:`finish_time_fairness` are the arithmetic; :func:`of_run`
applies them to a :func:`adaptdl_core.sim.cluster.simulate` result, with the JCT alone
being the wait for the first round, one start (``restart_s``) and the job's training at
the fastest configuration on at most its share (:func:`adaptdl_core.sim.ideal.alone_seconds`):
the same yardstick for every policy, whether its jobs adapt their batch or not.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable, Dict, Mapping, Optional, Sequence, Tuple, Union

__all__ = ["contention", "finish_time_fairness", "of_run"]

Span = Tuple[float, float]


def contention(spans: Mapping[str, Span]) -> Dict[str, float]:
    """Per job, the average number of jobs in the system over its lifetime: for job ``i``
    with ``spans[i] = (submitted, finished)``, the sum over every job ``j`` (``i``
    included) of the time ``j`` was in the system during ``i``'s lifetime, over that
    lifetime. A job of zero lifetime counts the jobs in the system at its submission.

    Raises:
        ValueError: a span that ends before it starts, or a bound that is not finite.
    """
    for name, (s, f) in spans.items():
        if not (math.isfinite(s) and math.isfinite(f)) or f < s:
            raise ValueError(f"spans[{name!r}] must be (submitted, finished) with "
                             f"submitted <= finished, both finite; got {(s, f)!r}")
    out = {}
    for name, (s, f) in spans.items():
        if f == s:
            out[name] = float(sum(1 for a, b in spans.values() if a <= s < b or (a, b) == (s, f)))
            continue
        shared = sum(max(0.0, min(f, b) - max(s, a)) for a, b in spans.values())
        out[name] = shared / (f - s)
    return out


def finish_time_fairness(spans: Mapping[str, Span], alone: Callable[[str, float], float],
                         gpus: int) -> dict:
    """The finish-time fairness of a schedule.

    Args:
        spans: job -> (submitted, finished) in the schedule (finished jobs only).
        alone: ``alone(job, share)``: seconds from submission to completion of the job
            alone on a share of ``share`` GPUs (may be fractional).
        gpus: GPUs in the cluster.

    Returns:
        ``{"max": largest ratio, "worst": its job, "mean": mean ratio, "ratios": job ->
        JCT / JCT alone, "shares": job -> G / N}`` (``max``/``mean`` ``None`` and
        ``worst`` ``None`` when ``spans`` is empty).

    Raises:
        ValueError: ``gpus`` < 1, a malformed span (see :func:`contention`), or an
            ``alone`` time that is not a finite number ``> 0``.
    """
    if not isinstance(gpus, int) or gpus < 1:
        raise ValueError(f"gpus must be an integer >= 1, got {gpus!r}")
    counts = contention(spans)
    ratios, shares = {}, {}
    for name, (s, f) in spans.items():
        shares[name] = gpus / counts[name]
        t = alone(name, shares[name])
        if not (math.isfinite(t) and t > 0):
            raise ValueError(f"alone({name!r}, {shares[name]:g}) must be a finite number of "
                             f"seconds > 0, got {t!r}")
        ratios[name] = (f - s) / t
    if not ratios:
        return {"max": None, "worst": None, "mean": None, "ratios": {}, "shares": {}}
    worst = max(ratios, key=ratios.get)
    return {"max": ratios[worst], "worst": worst,
            "mean": sum(ratios.values()) / len(ratios), "ratios": ratios, "shares": shares}


def of_run(result: Mapping, rows: Sequence, traces: Optional[Union[str, Path]] = None) -> dict:
    """:func:`finish_time_fairness` of a :func:`~adaptdl_core.sim.cluster.simulate`
    ``result`` of the workload ``rows`` (:class:`~adaptdl_core.sim.cluster.WorkloadJob`
    rows), on its cluster and settings. A job's JCT alone is the wait from its submission
    to the first round at or after it (rounds every ``interval`` from ``interval`` on, as
    in the simulator), one start (``restart_s``) and its training alone on its share.

    Raises:
        ValueError: a job of ``result`` missing from ``rows``.
    """
    from .ideal import alone_seconds
    from .job_model import get_application

    st = result["settings"]
    interval, restart_s = float(st["interval"]), float(st["restart_s"])
    per_node = int(st["gpus_per_node"])
    by_name = {r.name: r for r in rows}
    missing = [k for k in result["jcts"] if k not in by_name]
    if missing:
        raise ValueError(f"rows lack the jobs {missing[:5]} of the result: pass the "
                         "workload the result was simulated on")
    spans = {k: (by_name[k].time, by_name[k].time + v) for k, v in result["jcts"].items()}

    def alone(name: str, share: float) -> float:
        row = by_name[name]
        first = max(interval, math.ceil(row.time / interval) * interval)
        app = get_application(row.application, traces)
        return first - row.time + restart_s + alone_seconds(app, share, per_node)

    return finish_time_fairness(spans, alone, int(st["nodes"]) * per_node)
