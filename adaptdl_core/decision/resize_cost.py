"""What the next resize of a job will cost, from what resizes measurably cost here.

A resize (checkpoint, Tune relaunch, new replica processes, first step) costs what the
machine makes it cost: seconds on a quiet host, ten times that on a loaded one, and more
for a growth that starts more processes. So the estimate comes from measurements taken
on this cluster, not from a fixed figure:

* the resizes already measured of the job itself and of the jobs of its profile group
  (they train the same model, so their relaunches cost alike), those to the same replica
  count first; the median of the most recent few, so that it follows the load as it
  changes and one outlier does not decide it;
* before any resize was measured: the prior (the policy's restart cost), raised to the
  longest start-up measured in the job or its group (a resize includes a start-up).

Pure arithmetic (no clock of its own, no Ray); :meth:`DecisionCore.resize_cost` gathers
the samples from its records.
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any, Iterable, Mapping

from adaptdl_core import validation

__all__ = ["CostSample", "ResizeCostEstimate", "estimate_resize_cost", "describe_resize",
           "RECENT_RESIZES"]

#: How many of the most recent measured resizes the estimate is the median of.
RECENT_RESIZES = 3


@dataclasses.dataclass(frozen=True)
class CostSample:
    """One measured resize.

    Attributes:
        time: when it began (seconds, any clock common to all samples).
        to: the replica count it resized to.
        seconds: what it cost, from the pause request to the first step after it.
        own: it was the job's own (else another job's of its profile group).
    """

    time: float
    to: int
    seconds: float
    own: bool


@dataclasses.dataclass(frozen=True)
class ResizeCostEstimate:
    """The answer of :func:`estimate_resize_cost`.

    Attributes:
        seconds: the predicted cost of the next resize.
        basis: what it rests on, in a few words (for logs and ``resize_log``).
    """

    seconds: float
    basis: str


def estimate_resize_cost(samples: Iterable[CostSample], *, target: int | None = None,
                         launches_s: Iterable[float] = (), prior_s: float,
                         recent: int = RECENT_RESIZES) -> ResizeCostEstimate:
    """Predict the cost of the next resize of a job.

    Args:
        samples: measured resizes of the job and of its profile group (any order).
        target: the replica count of the resize to predict (``None``: any); measured
            resizes to this count are used when there are any.
        launches_s: start-up times (launch to first step, seconds) measured in the job
            and its group; used only while no resize was measured.
        prior_s: the cost assumed before anything was measured.
        recent: how many of the most recent matching samples the median is taken over.

    Returns:
        the estimate and its basis.

    Raises:
        ValueError: a non-finite or negative prior, sample or launch time, or
            ``recent < 1``.
    """
    validation.number("prior_s", prior_s, 0.0, what="a finite number of seconds")
    validation.integer("recent", recent, 1)
    samples = list(samples)
    launches = list(launches_s)
    for value in [s.seconds for s in samples] + launches:
        validation.number("measured seconds", value, 0.0, what="a finite number")
    same = [s for s in samples if target is not None and s.to == target]
    pool = same or samples
    if pool:
        latest = sorted(pool, key=lambda s: s.time)[-recent:]
        own = sum(s.own for s in latest)
        where = "this job" if own == len(latest) else \
            "its profile group" if own == 0 else "this job and its profile group"
        kind = f"to {target} replicas" if same else "of any size"
        return ResizeCostEstimate(float(statistics.median(s.seconds for s in latest)),
                                  f"median of the last {len(latest)} measured resizes "
                                  f"{kind} ({where})")
    longest = max(launches, default=0.0)
    if longest > prior_s:
        return ResizeCostEstimate(float(longest), "no resize measured yet: the longest "
                                                  "start-up measured")
    return ResizeCostEstimate(float(prior_s), "no resize measured yet: the prior")


def describe_resize(job_id: Any, entry: Mapping[str, Any], kind: str = "job") -> str:
    """One line for a resize of ``job_id``: from -> to replicas, why, the predicted saving,
    the predicted cost (and its basis), then the measured cost.

    Args:
        job_id: the job's id.
        kind: what the front-end calls a job, first word of the line (Tune: ``"trial"``).
        entry: its ``resize_log`` entry (``from``, ``to``, ``reason``, ``saved_s``,
            ``cost_s``, optional ``cost_basis`` and ``measured_s``).
    """
    saved = entry.get("saved_s")
    basis = entry.get("cost_basis")
    measured = entry.get("measured_s")
    return (f"{kind} {job_id} resized {entry['from']} -> {entry['to']} replicas "
            f"({entry['reason']}); predicted saving "
            f"{'n/a' if saved is None else f'{saved:.1f} s'}, predicted cost "
            f"{entry['cost_s']:.1f} s{f' ({basis})' if basis else ''}, measured cost "
            f"{'not measured' if measured is None else f'{measured:.1f} s'}")
