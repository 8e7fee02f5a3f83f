"""What a job takes alone: the job model's epoch times at the fastest configuration.

* :func:`epoch_seconds`: seconds per epoch on a number of GPUs packed on the fewest nodes,
  at a fixed total batch or at the fastest configuration any agent could choose (the sweep's
  makespan bounds use it);
* :func:`alone_seconds`: a job's training time alone on a share of the cluster that may be
  fractional (the finish-time fairness of :mod:`adaptdl_core.sim.fairness` uses it).
"""

from __future__ import annotations

import functools
import math
from typing import Optional

import numpy as np

from .baselines import packed_placement
from .job_model import Application, fixed_batch_config

__all__ = ["epoch_seconds", "alone_seconds"]


def epoch_seconds(app: Application, gpus: int, gpus_per_node: int,
                   batch: Optional[int] = None) -> np.ndarray:
    """Seconds each epoch of a trial takes on ``gpus`` GPUs packed on the fewest nodes:
    at the total ``batch`` (the static arm's configuration), or, with ``batch=None``, at
    the fastest configuration the model allows in that epoch (every micro-batch in the
    model's bounds and every accumulation count, so no agent can choose a faster one).

    Raises:
        ValueError: no configuration fits ``gpus`` within the model's batch limits, or the
            traces do not reach that placement."""
    placement = packed_placement(gpus, gpus_per_node)
    work = np.array([app.epoch_progress(e + 1) - app.epoch_progress(e)
                     for e in range(app.max_epochs)])
    sizes = np.array(app.batch_sizes, dtype=float)
    # The job model's gradient statistics are linear in the batch between validated runs.
    stats = np.array([[app.grad_stats(float(b), e) for b in sizes]
                      for e in range(app.max_epochs)])  # epoch x size x (sqr, var)
    if batch is not None:
        atomic, accum = fixed_batch_config(app, gpus, batch)
        configs = [(atomic, accum)]
    else:
        configs = [(a, s) for a in range(app.min_local_bsz, app.max_local_bsz + 1)
                   for s in range(0, app.max_batch_size // (gpus * a))
                   if app.init_batch_size <= gpus * a * (s + 1) <= app.max_batch_size]
    if not configs:
        raise ValueError(f"no configuration of {app.name} fits {gpus} GPUs within its "
                         f"batch limits")
    atomic = np.array([c[0] for c in configs], dtype=float)
    accum = np.array([c[1] for c in configs], dtype=float)
    total = gpus * atomic * (accum + 1)
    times = {}
    for a in np.unique(atomic):
        times[a] = app.step_time(placement, float(a))
    step = np.array([times[a][0] for a in atomic])
    sync = np.array([times[a][1] for a in atomic])
    iteration = step + (step - sync) * accum
    scale = total / app.init_batch_size
    out = np.empty(app.max_epochs)
    for e in range(app.max_epochs):
        sqr = np.interp(total, sizes, stats[e, :, 0])
        var = np.interp(total, sizes, stats[e, :, 1])
        rate = (var + sqr) / (var / scale + sqr) / iteration  # progress per second
        out[e] = work[e] / rate.max()
    return out


@functools.lru_cache(maxsize=None)
def _best_totals(app: Application, gpus_per_node: int, most: int) -> tuple:
    """Fastest training seconds on at most g GPUs, for g = 1..most (index g - 1)."""
    out = []
    best = math.inf
    for g in range(1, most + 1):
        try:
            best = min(best, float(epoch_seconds(app, g, gpus_per_node).sum()))
        except ValueError:  # no configuration or no traces at g: fewer GPUs do better
            pass
        out.append(best)
    return tuple(out)


def alone_seconds(app: Application, gpus: float, gpus_per_node: int) -> float:
    """Seconds ``app``'s job trains alone on a share of ``gpus`` GPUs, each epoch at the
    fastest configuration on at most that many GPUs packed on the fewest nodes (no
    restarts). A share below one GPU time-slices one GPU (``T(1) / gpus``); between two
    whole numbers the time is interpolated linearly.

    Raises:
        ValueError: ``gpus`` not a finite number ``> 0``, or no configuration of the model
            fits even one GPU.
    """
    if not (isinstance(gpus, (int, float)) and math.isfinite(gpus) and gpus > 0):
        raise ValueError(f"gpus must be a finite number > 0, got {gpus!r}")
    totals = _best_totals(app, int(gpus_per_node), max(1, math.ceil(gpus)))
    if not math.isfinite(totals[0]):
        raise ValueError(f"{app.name}: no configuration fits one GPU")
    if gpus <= 1:
        return totals[0] / gpus
    lo, hi = math.floor(gpus), math.ceil(gpus)
    frac = gpus - lo
    return totals[lo - 1] * (1.0 - frac) + totals[hi - 1] * frac
