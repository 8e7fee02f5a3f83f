"""Step profiling, throughput-model fitting and scheduler hints for one job.

The adaptive data loader reports the wall time of every micro-batch under the job's
current shape ``(nodes, replicas, local batch)``; AdaptiveDataParallel reports the time
its last gradient synchronisation kept the step waiting and the gradient statistics.
From these this module fits the throughput model (cheaply, and first after a handful of
steps rather than after tens of seconds), builds the goodput function that chooses the
batch size, and publishes the scheduler hints. Everything lives in one checkpointed
State (JSON), so the profile, the fitted model and the measured restart cost survive
restarts and resizes.
"""

from __future__ import annotations

import logging
import time
from typing import IO, Any

import numpy as np

from adaptdl_core import checkpoint, context
from adaptdl_core.goodput import GoodputFunction, GradParams, PerfParams, fit_perf_params
from adaptdl_core.sched_hints import SchedHints

LOG = logging.getLogger(__name__)

# Refit after this many new optimizer steps have been profiled...
REFIT_EVERY_STEPS = 10
# ...but never more often than this (a fit costs tens of milliseconds:
# benchmarks/step_overhead.py reports the fits' count and mean time per run)...
REFIT_MIN_INTERVAL_S = 2.0
# ...and only if some profiled step time moved by more than this fraction since the last
# fit (the profile holds running means: once they settle a refit would find the same
# model, at the same cost).
REFIT_MIN_CHANGE = 0.02
# First fit as soon as this many steps are profiled.
FIRST_FIT_STEPS = 3


class _Metrics(checkpoint.State):
    """The job's profile and models (replica 0's copy is the one saved)."""

    def __init__(self) -> None:
        super().__init__("adaptdl-metrics")
        # "nodes,replicas,local_bsz" -> sums of measured times and counts.
        self.profile: dict[str, dict[str, float]] = {}
        self.perf_params: PerfParams | None = None
        self.grad_params: GradParams | None = None
        self.init_batch_size: int | None = None
        self.max_batch_size: int | None = None
        self.local_bsz_bounds: tuple[int | None, int | None] | None = None
        self.gradient_accumulation = False
        self.restart_cost_s: float | None = None
        self.checkpoint_walltime: float | None = None
        # Statistical progress in steps at the initial batch size (M0-equivalent steps).
        self.progress = 0.0
        # Not saved: bookkeeping of this run.
        self.steps_since_fit = 0
        self.last_fit_time = 0.0
        self.fits = 0  # throughput fits in this run (a new fit is worth a new decision)
        # The profile the last fit saw: configuration -> (compute, optimizer step) seconds.
        self.fitted_times: dict[str, tuple[float, float]] | None = None
        self.restored = False
        self.pending_sync_s: float | None = None  # the last step's sync wait, if timed
        self.progress_from_gain = False  # AdaptiveDataParallel counts progress by gain
        self.first_step_walltime: float | None = None  # this run's first optimizer step

    def save(self, fileobj: IO[bytes]) -> None:
        checkpoint.dump_json({
            "profile": self.profile,
            "perf_params": list(self.perf_params) if self.perf_params else None,
            "grad_params": list(self.grad_params) if self.grad_params else None,
            "init_batch_size": self.init_batch_size,
            "max_batch_size": self.max_batch_size,
            "local_bsz_bounds": list(self.local_bsz_bounds) if self.local_bsz_bounds else None,
            "gradient_accumulation": self.gradient_accumulation,
            "restart_cost_s": self.restart_cost_s,
            "progress": self.progress,
            "checkpoint_walltime": time.time(),
        }, fileobj)

    def load(self, fileobj: IO[bytes]) -> None:
        data = checkpoint.load_json(fileobj)
        self.profile = data["profile"]
        self.perf_params = PerfParams(*data["perf_params"]) if data["perf_params"] else None
        self.grad_params = GradParams(*data["grad_params"]) if data["grad_params"] else None
        self.init_batch_size = data["init_batch_size"]
        self.max_batch_size = data["max_batch_size"]
        bounds = data["local_bsz_bounds"]
        self.local_bsz_bounds = tuple(bounds) if bounds else None  # type: ignore[assignment]
        self.gradient_accumulation = bool(data["gradient_accumulation"])
        self.restart_cost_s = data["restart_cost_s"]
        self.checkpoint_walltime = data["checkpoint_walltime"]
        self.progress = float(data["progress"])
        self.restored = True


class _HintsState(checkpoint.State):
    """The scheduler hints as a JSON file of every checkpoint (``sched-hints.json``), so a
    scheduler can read them without torch."""

    def __init__(self) -> None:
        super().__init__("sched-hints.json")

    def save(self, fileobj: IO[bytes]) -> None:
        # The model is refitted during training; a checkpoint must stay fast, so it
        # publishes the latest fit rather than fitting again here.
        hints = sched_hints()
        fileobj.write((hints.to_json() if hints else "null").encode("utf-8"))

    def load(self, fileobj: IO[bytes]) -> None:
        pass  # Derived from adaptdl-metrics; nothing to restore.


def metrics() -> _Metrics:
    """The job's metrics State (held by the job context), created and restored on first
    use."""
    ctx = context.current()
    if ctx.metrics is None:
        ctx.metrics = _Metrics()
        _HintsState()
        checkpoint.load_state(ctx.metrics)
    return ctx.metrics


def _key(nodes: int, replicas: int, local_bsz: int) -> str:
    return f"{nodes},{replicas},{local_bsz}"


def set_batch_size_limits(init_batch_size: int, max_batch_size: int | None,
                          local_bsz_bounds: tuple[int | None, int | None] | None,
                          gradient_accumulation: bool) -> None:
    """Record the training loader's batch size settings (for goodput and hints)."""
    m = metrics()
    m.init_batch_size = int(init_batch_size)
    m.max_batch_size = max_batch_size
    m.local_bsz_bounds = local_bsz_bounds
    m.gradient_accumulation = bool(gradient_accumulation)


def record_sync_time(seconds: float) -> None:
    """Called by AdaptiveDataParallel: seconds the last step waited for gradient sync
    (only on the steps it times: with several replicas, those that measure the noise)."""
    metrics().pending_sync_s = float(seconds)


def record_grad_params(grad_params: GradParams) -> None:
    """Called by AdaptiveDataParallel after every optimizer step with fresh estimates."""
    metrics().grad_params = grad_params


def add_progress(gain: float) -> None:
    """Called by AdaptiveDataParallel after each optimizer step: the step advanced the
    training by ``gain`` steps at the initial batch size (the AdaScale gain)."""
    m = metrics()
    m.progress_from_gain = True
    m.progress += float(gain)


def advance_progress_without_model(scale: float) -> None:
    """Count progress by samples (``scale`` = batch / initial batch) when no
    AdaptiveDataParallel measures the gain, so that epochs still end."""
    m = metrics()
    if not m.progress_from_gain:
        m.progress += float(scale)


def profile_micro_batch(seconds: float, local_bsz: int, optimizer_step: bool,
                        world: tuple[int, int, int]) -> None:
    """Record one training micro-batch that took ``seconds`` of wall time.

    Arguments:
        seconds: time from handing out the batch to the next batch boundary.
        local_bsz: the batch's per-replica size.
        optimizer_step: True if the micro-batch ended an optimizer step (with gradient
            sync), False for a gradient accumulation micro-batch.
        world: ``(nodes, replicas, rank)`` of this process (the loader reads them once).
    """
    m = metrics()
    if m.restored and m.checkpoint_walltime is not None:
        # First step after a restart: how long the whole restart took, checkpoint to here.
        cost = max(time.time() - m.checkpoint_walltime, 0.0)
        m.restart_cost_s = cost if m.restart_cost_s is None else 0.5 * (m.restart_cost_s + cost)
        m.restored = False
        LOG.info("measured restart cost: %.1f s", cost)
    nodes, replicas, rank = world
    entry = m.profile.setdefault(_key(nodes, replicas, local_bsz),
                                 {"accum_n": 0, "accum_t": 0.0, "optim_n": 0, "optim_t": 0.0,
                                  "sync_t": 0.0, "sync_n": 0})
    if optimizer_step:
        if m.first_step_walltime is None:
            m.first_step_walltime = time.time()
        entry["optim_n"] += 1
        entry["optim_t"] += seconds
        if m.pending_sync_s is not None:
            entry["sync_t"] += min(m.pending_sync_s, seconds)
            # (setdefault: profiles saved before sync_n timed every step)
            entry["sync_n"] = entry.setdefault("sync_n", entry["optim_n"] - 1) + 1
            m.pending_sync_s = None
        m.steps_since_fit += 1
        if rank == 0:
            maybe_refit()
    else:
        entry["accum_n"] += 1
        entry["accum_t"] += seconds


def _profile_times(profile: dict[str, dict[str, float]]) -> dict[str, tuple[float, float]]:
    """Mean (compute, optimizer step) seconds of every configuration with a step."""
    times = {}
    for key, e in profile.items():
        if e["optim_n"] == 0:
            continue
        optim = e["optim_t"] / e["optim_n"]
        if e["accum_n"] > 0:
            compute = e["accum_t"] / e["accum_n"]
        else:
            # No accumulation measured: compute time is the step minus its sync wait.
            sync = e["sync_t"] / max(e.get("sync_n", e["optim_n"]), 1)
            compute = max(optim - sync, 0.5 * optim)
        times[key] = (compute, optim)
    return times


def _profile_arrays(times: dict[str, tuple[float, float]]) -> tuple[np.ndarray, ...]:
    """``fit_perf_params``'s arrays (nodes, replicas, local batch, compute, optim)."""
    rows = [tuple(int(v) for v in key.split(",")) + t for key, t in times.items()]
    return tuple(np.array(col) for col in zip(*rows)) if rows else ()


def _moved(times: dict[str, tuple[float, float]],
           fitted: dict[str, tuple[float, float]] | None) -> bool:
    """Whether the profile differs from the one last fitted: another set of
    configurations, or a step time changed by more than ``REFIT_MIN_CHANGE``."""
    if fitted is None or times.keys() != fitted.keys():
        return True
    return any(abs(new / old - 1.0) > REFIT_MIN_CHANGE
               for key, pair in times.items() for new, old in zip(pair, fitted[key]))


def maybe_refit(force: bool = False) -> bool:
    """Refit the throughput model if enough new steps were profiled since the last fit
    and the profile moved (or if ``force``, whenever there is a profile).

    Returns:
        True if a new model was fitted.
    """
    m = metrics()
    due = (m.perf_params is None and m.steps_since_fit >= FIRST_FIT_STEPS) or \
        (m.steps_since_fit >= REFIT_EVERY_STEPS
         and time.monotonic() - m.last_fit_time >= REFIT_MIN_INTERVAL_S)
    if not (due or force):
        return False
    times = _profile_times(m.profile)
    if not times:
        return False
    if not force and m.perf_params is not None and not _moved(times, m.fitted_times):
        # (Checked again after as many steps and seconds.)
        m.steps_since_fit = 0
        m.last_fit_time = time.monotonic()
        return False
    # Same configurations as last time: the optimum moved little, start from it (several
    # times cheaper than a fit from scratch).
    same_keys = m.fitted_times is not None and times.keys() == m.fitted_times.keys()
    initial = m.perf_params if same_keys else None
    try:
        m.perf_params = fit_perf_params(*_profile_arrays(times), initial=initial)
        m.fitted_times = times
    except ValueError as exc:  # e.g. a degenerate profile; keep the previous model
        LOG.debug("throughput fit skipped: %s", exc)
        return False
    m.steps_since_fit = 0
    m.last_fit_time = time.monotonic()
    m.fits += 1
    return True


def first_step_walltime() -> float | None:
    """Wall-clock time of this process's first profiled optimizer step (``None`` before
    it, or when no job state exists yet); launchers use it to time restarts."""
    m = context.current().metrics
    return None if m is None else m.first_step_walltime


def goodput_fn() -> GoodputFunction | None:
    """The job's current goodput model, or None before it has both a throughput fit and
    gradient statistics."""
    m = metrics()
    if m.perf_params is None or m.grad_params is None or m.init_batch_size is None:
        return None
    return GoodputFunction(m.perf_params, m.grad_params, m.init_batch_size)


def sched_hints() -> SchedHints | None:
    """What this job tells a scheduler (None before the training loader is known)."""
    m = metrics()
    if m.init_batch_size is None:
        return None
    shapes = [tuple(int(v) for v in key.split(",")) for key, e in m.profile.items()
              if e["optim_n"] > 0]
    return SchedHints(
        perf_params=m.perf_params,
        grad_params=m.grad_params,
        init_batch_size=m.init_batch_size,
        max_batch_size=m.max_batch_size,
        local_bsz_bounds=m.local_bsz_bounds,
        gradient_accumulation=m.gradient_accumulation,
        max_profiled_replicas=max((s[1] for s in shapes), default=0),
        max_profiled_nodes=max((s[0] for s in shapes), default=0),
        restart_cost_s=m.restart_cost_s,
    )


def describe() -> dict[str, Any]:
    """A flat summary for logs and reporters (fitted model presence, steps profiled)."""
    m = metrics()
    return {"profiled_shapes": len(m.profile), "fitted": m.perf_params is not None,
            "restart_cost_s": m.restart_cost_s}
