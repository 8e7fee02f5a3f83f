"""How much training a job has left, from what a front-end measures (pure).

A front-end does not know a job's future; it knows how many of its planned epochs it has
finished and for how long it has trained (restarts and resizes included). The estimate
every front-end hands the core (``JobProgress.remaining_s``) is that history extrapolated:
the seconds per epoch so far times the epochs left. It is wrong in the ways a real estimate
is: it lags a change of allocation or batch size, and it knows nothing before the first
epoch ends.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Optional

from .core import JobProgress

__all__ = ["estimate_remaining_s", "progress_from_status"]


def estimate_remaining_s(epochs_done: float, epochs_total: float,
                         trained_s: float) -> Optional[float]:
    """Seconds of training left: ``trained_s / epochs_done * (epochs_total - epochs_done)``.

    Args:
        epochs_done: epochs finished so far (>= 0).
        epochs_total: epochs the job plans (> 0).
        trained_s: seconds it has trained so far, restarts included (>= 0).

    Returns:
        The estimate (>= 0), or ``None`` when there is no history to go by (no epoch
        finished, no planned epochs, or an input not a finite number >= 0).
    """
    values = (epochs_done, epochs_total, trained_s)
    if any(isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
           or v < 0 for v in values):
        return None
    if epochs_done <= 0 or epochs_total <= 0:
        return None
    return float(trained_s) / epochs_done * max(epochs_total - epochs_done, 0.0)


def _number(value: Any, minimum: float = 0.0) -> Optional[float]:
    """``value`` as a float if it is a finite number ``>= minimum``, else ``None``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not math.isfinite(value) or value < minimum:
        return None
    return float(value)


def progress_from_status(status: Mapping[str, Any], *, trained_s: Any,
                         resize_cost_s: Any = None, launch_s: Any = None) -> JobProgress:
    """What the core hears of a job's progress, from what its rank 0 reports
    (``adaptdl_core.torch``'s training status: ``epochs_done``, ``epochs``, ``restarts``)
    and what its front-end measured: ``trained_s`` seconds of training so far (restarts
    included), the latest resize's cost and the latest launch's time to its first step
    (seconds). A value that is missing or not a finite number ``>= 0`` is not known
    (``None``) in the result, so a malformed report changes nothing."""
    restarts = status.get("restarts")
    done, total = _number(status.get("epochs_done")), _number(status.get("epochs"))
    trained = _number(trained_s)
    return JobProgress(
        remaining_s=None if None in (done, total, trained)
        else estimate_remaining_s(done, total, trained),
        restarts=restarts if isinstance(restarts, int) and not isinstance(restarts, bool)
        and restarts >= 0 else None,
        resize_cost_s=_number(resize_cost_s), launch_s=_number(launch_s))
