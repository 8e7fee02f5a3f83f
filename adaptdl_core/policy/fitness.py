"""The objective: restart penalty, power-mean fitness and its internal cost encoding.

The allocator maximises the power-mean fitness (Pollux)::

    FITNESS_p(A) = ((1/J) * sum_j S_j(A_j) ** p) ** (1/p)      (p = 0: geometric mean)

where ``S_j`` is the job's speedup at the ``(num_nodes, num_replicas)`` shape of ``A_j``,
multiplied by the re-allocation penalty of :func:`restart_penalty` when ``A_j`` differs
from the job's current ("base") allocation. ``p = -1`` (harmonic mean, the default) is
fair; more negative is fairer; ``p = 1`` maximises the plain sum (utilitarian).

For ``p <= 0`` a job with speedup 0 makes the power mean 0 whatever the others get, so the
objective is made lexicographic (the limit of letting idle jobs' speedups tend to 0):
first run as many jobs as possible, then maximise the power mean of the running ones.
Internally every job contributes a cost pair (idle flag, power term) that the stages sum
and minimise (:func:`_cost_terms`); :func:`_better` compares two such sums with a
tolerance, and :func:`_mean_from_cost` turns a sum back into a power mean.
"""

from __future__ import annotations

import math
from typing import Any, Sequence, Tuple

import numpy as np

from adaptdl_core import validation

from .records import JobInfo

__all__ = [
    "restart_penalty",
    "power_mean",
]

# Relative preference for an unchanged allocation, so that near-ties never move a job.
_KEEP_BONUS = 1e-6
# Relative tolerance on the objective for "strictly better" in the local search and the
# optimality certificate.
_OBJ_TOL = 1e-9


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
    return validation.number(
        "p", p, what="a finite number (e.g. -1 fair, 0 geometric, 1 utilitarian)")


def _cost_terms(s: np.ndarray, p: float) -> Tuple[np.ndarray, np.ndarray]:
    """Per-job cost pair (idle flag, power term) to minimise, for speedups ``s``."""
    s = np.asarray(s, dtype=np.float64)
    pos = s > 0
    safe = np.where(pos, s, 1.0)
    if p > 0:
        return np.zeros_like(s), np.where(pos, -(safe ** p), 0.0)
    z = (~pos).astype(np.float64)
    if p == 0:
        return z, np.where(pos, -np.log(safe), 0.0)
    return z, np.where(pos, safe ** p, 0.0)


def _power(s: float, p: float) -> float:
    # numpy computes these exponents by reciprocal, sqrt and square; doing the same keeps
    # _cost_one bit-identical to _cost_terms.
    if p == -1.0:
        return 1.0 / s
    if p == 0.5:
        return math.sqrt(s)
    if p == 2.0:
        return s * s
    return s ** p


def _cost_one(s: float, p: float) -> Tuple[float, float]:
    """:func:`_cost_terms` of one speedup, as plain floats (same values)."""
    if s > 0:
        if p > 0:
            return 0.0, -_power(s, p)
        if p == 0:
            return 0.0, -math.log(s)
        return 0.0, _power(s, p)
    return (0.0 if p > 0 else 1.0), 0.0


def _better(a: Tuple[float, float], b: Tuple[float, float]) -> bool:
    """Lexicographic "strictly better" (smaller) with a relative tolerance on the 2nd part."""
    if a[0] < b[0] - 0.5:
        return True
    if a[0] > b[0] + 0.5:
        return False
    return a[1] < b[1] - _OBJ_TOL * max(1.0, abs(b[1]))


def _mean_from_cost(g: float, n: int, p: float) -> float:
    """Power mean of ``n`` speedups whose summed cost term (see :func:`_cost_terms`) is ``g``."""
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
