"""Trace-driven model of one training job, for the cluster and sweep simulators.

Two layers:

* :class:`Application`: what the real traces say about one model (``data/traces/<name>``):
  step and sync time of an optimizer step for a placement and per-replica batch
  (:meth:`Application.step_time`: measured where measured, interpolated elsewhere), the true
  gradient statistics per epoch and batch size from ``validation-*.csv``
  (:meth:`Application.grad_stats`), and how much statistical progress one epoch is
  (:meth:`Application.epoch_progress`). Loaded once per name by :func:`get_application`.
* :class:`SimJob`: one job running on that model. Time is advanced by :meth:`SimJob.advance`;
  an allocation is changed by :meth:`SimJob.reallocate` (every start or change costs
  ``restart_s`` seconds without progress). An *adaptive* job behaves like this library's
  agent: it profiles every configuration it runs, refits its throughput model
  (:func:`adaptdl_core.goodput.fit_perf_params`, warm-started, only when a new configuration
  is measured) and re-chooses its batch with :meth:`GoodputFunction.optimize`. A *fixed* job
  keeps a target total batch (the workload's TunedJobs configuration).

Progress is counted in steps at the model's initial batch size ``M0``: a step at total batch
``M`` advances ``gain = (var + sqr) / (var * M0 / M + sqr)`` of them (AdaScale), with the
true ``sqr``/``var`` of the current epoch. An epoch ends at the progress the validation
traces record for one pass, and a job ends after :data:`EPOCHS` of its model.
"""

from __future__ import annotations

import csv
import functools
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Mapping, Optional, Sequence, Tuple

import numpy as np

from adaptdl_core import validation

from ..goodput import GoodputFunction, PerfParams, fit_perf_params
from ..sched_hints import SchedHints
from .gpu_types import TRACE_SUFFIX

__all__ = [
    "DATA_DIR",
    "TRACES_DIR",
    "EPOCHS",
    "MAX_LOCAL_BSZ",
    "APPLICATION_NAMES",
    "Application",
    "get_application",
    "canonical_placement",
    "SimJob",
]

logger = logging.getLogger(__name__)

#: The vendored data (traces, workloads, published results); see ``data/README.md``.
DATA_DIR = Path(__file__).resolve().parent / "data"
#: Default traces folder: one sub-folder per model.
TRACES_DIR = DATA_DIR / "traces"
#: Epochs each model trains for (the Pollux paper's cluster workloads).
EPOCHS: Dict[str, int] = {"bert": 2, "cifar10": 100, "ncf": 10, "imagenet": 90,
                          "deepspeech2": 80, "yolov3": 50}
#: Per-replica micro-batch limits narrower than the traces' range (yolov3 runs out of
#: GPU memory above 8 images per T4).
MAX_LOCAL_BSZ: Dict[str, int] = {"yolov3": 8}
#: Per-replica micro-batch limits below a typed trace's largest (DeepSpeech2 runs out of
#: the RTX 2080Ti's memory above 57 samples).
TYPED_MAX_LOCAL_BSZ: Dict[Tuple[str, str], int] = {("deepspeech2", "rtx"): 57}
#: The six models of the traces.
APPLICATION_NAMES: Tuple[str, ...] = tuple(sorted(EPOCHS))

_EPS = 1e-8  # keeps ceil() of an exact quotient from rounding up on float noise
# Fits shared between jobs with the same profile history (see SimJob._record), oldest
# dropped first beyond the size.
_FIT_MEMO: Dict[tuple, PerfParams] = {}
_FIT_MEMO_SIZE = 200_000


def canonical_placement(placement: Sequence[int]) -> Tuple[int, ...]:
    """The placement (replicas per node, zeros dropped) as its lexicographically smallest
    rotation, the form the traces index measurements by.

    Raises:
        ValueError: if an entry is negative or no replica is placed.
    """
    p = tuple(int(v) for v in placement if int(v) != 0)
    if any(v < 0 for v in p) or not p:
        raise ValueError(f"placement must list replicas per node (>= 0, at least one > 0), "
                         f"got {tuple(placement)!r}")
    return min(p[i:] + p[:i] for i in range(len(p)))


def _read_csv(path: Path) -> Dict[str, list]:
    with open(path, newline="", encoding="utf-8") as f:
        try:
            rows = list(csv.DictReader(f))
        except (UnicodeDecodeError, csv.Error) as e:
            raise ValueError(f"trace file {str(path)!r} is not a UTF-8 CSV file ({e}); check "
                             "the traces folder") from None
    if not rows:
        raise ValueError(f"{path}: no rows")
    return {k: [r[k] for r in rows] for k in rows[0]}


@dataclass(frozen=True)
class _Validation:
    progress: np.ndarray   # progress (M0-steps) at the end of each epoch
    iteration: np.ndarray  # optimizer steps at the end of each epoch
    metric: np.ndarray
    grad_sqr: np.ndarray
    grad_var: np.ndarray


class Application:
    """The measured behaviour of one model, from its traces folder.

    Args:
        trace_dir: folder with ``placements.csv``, ``scalability.csv`` and
            ``validation-<B>.csv`` (see ``data/README.md``); its name is the model's name.
        max_epochs: epochs a job of this model trains for (default :data:`EPOCHS`).
        max_local_bsz: largest per-replica micro-batch (default: the traces' largest, or
            :data:`MAX_LOCAL_BSZ`).

    Attributes:
        name: the model's name.
        init_batch_size: ``M0``, the smallest validated total batch.
        max_batch_size: the largest validated total batch.
        min_local_bsz, max_local_bsz: per-replica micro-batch bounds.
        max_epochs: epochs to completion.
        batch_sizes: the validated total batch sizes, ascending.

    Raises:
        FileNotFoundError: a trace file is missing.
        ValueError: the files are malformed or ``max_epochs`` exceeds the traces.
    """

    def __init__(self, trace_dir: Path | str, max_epochs: Optional[int] = None,
                 max_local_bsz: Optional[int] = None, gpu_type: Optional[str] = None) -> None:
        trace_dir = Path(trace_dir)
        self.name = trace_dir.name
        if gpu_type is not None and gpu_type not in TRACE_SUFFIX:
            raise ValueError(f"gpu_type {gpu_type!r} has no traces; use one of "
                             f"{', '.join(TRACE_SUFFIX)} or None")
        self.gpu_type = gpu_type
        suffix = f"-{TRACE_SUFFIX[gpu_type]}" if gpu_type and TRACE_SUFFIX[gpu_type] else ""
        vals: Dict[int, _Validation] = {}
        for path in sorted(trace_dir.glob("validation-*.csv")):
            bsz = int(path.stem.split("-")[-1])
            cols = _read_csv(path)
            vals[bsz] = _Validation(*(np.array(cols[c], dtype=float) for c in
                                      ("progress", "iteration", "metric", "grad_sqr",
                                       "grad_var")))
        if not vals:
            raise FileNotFoundError(f"{trace_dir}: no validation-<batch>.csv files")
        self._val = dict(sorted(vals.items()))
        self.batch_sizes = tuple(self._val)
        self._bsz_arr = np.array(self.batch_sizes, dtype=float)

        pl = _read_csv(trace_dir / f"placements{suffix}.csv")
        self._pl_key = [str(p).strip() for p in pl["placement"]]
        self._pl_bsz = np.array(pl["local_bsz"], dtype=float)
        self._pl_step = np.array(pl["step_time"], dtype=float)
        self._pl_sync = np.array(pl["sync_time"], dtype=float)
        # Per measured placement: rows sorted by local batch, for 1-D interpolation.
        self._by_placement: Dict[str, Tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        for key in sorted(set(self._pl_key)):
            idx = [i for i, k in enumerate(self._pl_key) if k == key]
            order = np.argsort(self._pl_bsz[idx], kind="stable")
            sel = np.array(idx)[order]
            self._by_placement[key] = (self._pl_bsz[sel], self._pl_step[sel],
                                       self._pl_sync[sel])
        self._sc = _read_csv(trace_dir / f"scalability{suffix}.csv")
        self._nd_interp = None  # built on first use (a scipy Delaunay triangulation)
        self._type_model: Optional[GoodputFunction] = None  # typed: beyond the hull

        self.init_batch_size = int(self.batch_sizes[0])
        self.max_batch_size = int(self.batch_sizes[-1])
        self.min_local_bsz = int(self._pl_bsz.min())
        if max_local_bsz is None:
            # Untyped: the Pollux artifact's limits; typed: the traces' own (as the Sia
            # artifact), with its one memory limit below them.
            max_local_bsz = (MAX_LOCAL_BSZ.get(self.name, self._pl_bsz.max()) if gpu_type is None
                             else TYPED_MAX_LOCAL_BSZ.get((self.name, gpu_type),
                                                          self._pl_bsz.max()))
        self.max_local_bsz = int(max_local_bsz)
        # Typed: per replica count, the largest local batch its placements were measured at.
        self._max_local_at: Dict[int, int] = {}
        if gpu_type is not None:
            for key, b in zip(self._pl_key, self._pl_bsz):
                k = sum(int(c) for c in key)
                self._max_local_at[k] = max(self._max_local_at.get(k, 0), int(b))
        n_epochs = min(len(v.progress) for v in self._val.values())
        self.max_epochs = int(max_epochs if max_epochs is not None
                              else EPOCHS.get(self.name, n_epochs))
        if not 1 <= self.max_epochs <= n_epochs:
            raise ValueError(f"max_epochs must be in [1, {n_epochs}] for {self.name}, "
                             f"got {self.max_epochs}")
        # Progress at the end of each epoch: the smallest any validated batch recorded.
        self._epoch_end = np.min(np.stack([v.progress[:n_epochs] for v in self._val.values()]),
                                 axis=0)
        self._step_cache: Dict[Tuple[Tuple[int, ...], float], Tuple[float, float]] = {}

    def max_local_bsz_at(self, num_replicas: int) -> int:
        """Largest per-replica batch on ``num_replicas`` replicas: :attr:`max_local_bsz`,
        and on a typed application at most the largest measured at that replica count
        (the traces stop where the GPU's memory did)."""
        return min(self.max_local_bsz, self._max_local_at.get(int(num_replicas),
                                                              self.max_local_bsz))

    def __repr__(self) -> str:
        return (f"Application({self.name!r}, M0={self.init_batch_size}, "
                f"max_batch={self.max_batch_size}, local=[{self.min_local_bsz}, "
                f"{self.max_local_bsz}], epochs={self.max_epochs})")

    # -- statistical side ---------------------------------------------------------------
    def epoch_progress(self, epoch: int) -> float:
        """Progress (``M0``-equivalent steps) at the end of ``epoch`` epochs (0 for 0).

        Raises:
            ValueError: ``epoch`` outside ``[0, max_epochs]``.
        """
        if not 0 <= epoch <= len(self._epoch_end):
            raise ValueError(f"epoch must be in [0, {len(self._epoch_end)}], got {epoch}")
        return 0.0 if epoch == 0 else float(self._epoch_end[epoch - 1])

    def _bracket(self, batch_size: float) -> Tuple[int, int, float]:
        if not self.batch_sizes[0] - _EPS <= batch_size <= self.batch_sizes[-1] + _EPS:
            raise ValueError(f"batch_size {batch_size} of {self.name} is outside the validated "
                             f"range [{self.batch_sizes[0]}, {self.batch_sizes[-1]}]")
        hi = int(np.searchsorted(self._bsz_arr, batch_size - _EPS, side="left"))
        hi = min(hi, len(self.batch_sizes) - 1)
        if self._bsz_arr[hi] <= batch_size + _EPS:
            return hi, hi, 0.0
        lo = hi - 1
        w = (batch_size - self._bsz_arr[lo]) / (self._bsz_arr[hi] - self._bsz_arr[lo])
        return lo, hi, float(w)

    def _interp_val(self, field: str, batch_size: float, epoch: int) -> float:
        lo, hi, w = self._bracket(batch_size)
        a = getattr(self._val[self.batch_sizes[lo]], field)[epoch]
        if lo == hi:
            return float(a)
        b = getattr(self._val[self.batch_sizes[hi]], field)[epoch]
        return float((1.0 - w) * a + w * b)

    def grad_stats(self, batch_size: float, epoch: int) -> Tuple[float, float]:
        """True ``(grad_sqr, grad_var)`` during ``epoch`` (0-based) at total batch
        ``batch_size``: linear in the batch size between the two nearest validated runs.

        Raises:
            ValueError: ``batch_size`` outside the validated range.
        """
        return (self._interp_val("grad_sqr", batch_size, epoch),
                self._interp_val("grad_var", batch_size, epoch))

    def iterations(self, batch_size: float, epoch: int) -> float:
        """Optimizer steps a run at total batch ``batch_size`` has taken when it finishes
        epoch index ``epoch`` (0-based row of the validation traces), interpolated linearly
        between validated batch sizes.

        Raises:
            ValueError: ``batch_size`` outside the validated range.
        """
        return self._interp_val("iteration", batch_size, epoch)

    # -- throughput side ----------------------------------------------------------------
    def _interpolator(self):
        if self._nd_interp is None:
            from scipy.interpolate import LinearNDInterpolator
            from scipy.spatial import QhullError

            # Mean of the measured placements per (nodes, replicas, batch), then the
            # large-scale measurements: a 3-D piecewise-linear surface.
            groups: Dict[Tuple[float, float, float], list] = {}
            for key, b, st, sy in zip(self._pl_key, self._pl_bsz, self._pl_step,
                                      self._pl_sync):
                n, k = len(key), sum(int(c) for c in key)
                groups.setdefault((float(n), float(k), float(b)), []).append((st, sy))
            xs = sorted(groups)
            ys = [np.mean(np.array(groups[x]), axis=0) for x in xs]
            xs = list(xs) + [(float(n), float(k), float(b)) for n, k, b in
                             zip(self._sc["num_nodes"], self._sc["num_replicas"],
                                 self._sc["local_bsz"])]
            ys = ys + [np.array([float(s), float(y)]) for s, y in
                       zip(self._sc["step_time"], self._sc["sync_time"])]
            try:
                self._nd_interp = LinearNDInterpolator(np.array(xs), np.array(ys))
            except QhullError:
                # Degenerate: all measurements on one node count (e.g. a one-node type).
                self._nd_interp = False
        return self._nd_interp

    def step_time(self, placement: Sequence[int], local_bsz: float) -> Tuple[float, float]:
        """``(step_time, sync_time)`` in seconds of one optimizer step (no accumulation) with
        ``local_bsz`` samples per replica on ``placement`` (replicas per node).

        A measured placement (up to rotation) interpolates linearly in the batch between its
        measurements (clamped at their ends); any other uses a piecewise-linear
        interpolation over (nodes, replicas, batch) of all measurements, node count capped
        at 16 as in the traces.

        Raises:
            ValueError: malformed placement, or a configuration outside the measured hull.
        """
        p = canonical_placement(placement)
        key = (p, float(local_bsz))
        hit = self._step_cache.get(key)
        if hit is not None:
            return hit
        pid = "".join(str(v) for v in p)
        rows = self._by_placement.get(pid) if all(v < 10 for v in p) else None
        if rows is not None:
            b, st, sy = rows
            out = (float(np.interp(local_bsz, b, st)), float(np.interp(local_bsz, b, sy)))
        else:
            n = min(len(p), 16)
            interp = self._interpolator()
            st, sy = interp([[n, sum(p), float(local_bsz)]])[0] if interp is not False \
                else (math.nan, math.nan)
            if not (math.isfinite(st) and math.isfinite(sy)) and self.gpu_type is not None:
                st, sy = self._extrapolated(len(p), sum(p), float(local_bsz))
            if not (math.isfinite(st) and math.isfinite(sy)):
                raise ValueError(f"{self.name}: no throughput data around placement {p} "
                                 f"with local batch {local_bsz}")
            out = (float(st), float(sy))
        self._step_cache[key] = out
        return out


    def measurements(self, max_nodes: Optional[int] = None) -> np.ndarray:
        """The placement measurements as rows ``(nodes, replicas, local batch, step time,
        sync time)`` (on at most ``max_nodes`` nodes if given)."""
        rows = [(len(k), sum(int(c) for c in k), b, st, sy)
                for k, b, st, sy in zip(self._pl_key, self._pl_bsz, self._pl_step,
                                        self._pl_sync)
                if max_nodes is None or len(k) <= max_nodes]
        return np.array(rows, dtype=float).reshape(-1, 5)

    def one_gpu_throughput(self) -> float:
        """Samples per second of one replica at its largest measured local batch (the
        throughput the Sia paper profiles every job at on every type)."""
        rows = self._by_placement.get("1")
        if rows is None:
            raise ValueError(f"{self.name}: no one-replica measurements")
        b, st, _ = rows
        return float(b.max() / st.max())

    def _extrapolated(self, nodes: int, replicas: int, local_bsz: float) -> Tuple[float, float]:
        """``(step_time, sync_time)`` beyond the measured hull (typed applications: the
        traces of most types stop at 1-3 nodes): the throughput model fitted to all of
        the type's measurements, ``alpha + beta * b`` compute and Pollux's sync form."""
        if self._type_model is None:
            xs = [(float(n), float(k), float(b), float(st), float(sy)) for n, k, b, st, sy in
                  zip(self._sc["num_nodes"], self._sc["num_replicas"], self._sc["local_bsz"],
                      self._sc["step_time"], self._sc["sync_time"])]
            arr = np.concatenate([self.measurements(), np.array(xs, dtype=float)])
            params = fit_perf_params(arr[:, 0], arr[:, 1], arr[:, 2], arr[:, 3] - arr[:, 4],
                                     arr[:, 3])
            self._type_model = GoodputFunction(params, (1.0, 0.0), self.init_batch_size)
        model = self._type_model
        step = replicas * local_bsz / float(model.throughput(nodes, replicas, local_bsz, 0))
        p = model.perf_params
        compute = p.alpha_c + p.beta_c * local_bsz
        return step, max(step - compute, 0.0)


@functools.lru_cache(maxsize=None)
def _load(trace_dir: str, gpu_type: Optional[str] = None) -> Application:
    return Application(trace_dir, gpu_type=gpu_type)


def get_application(name: str, traces_dir: Path | str | None = None,
                    gpu_type: Optional[str] = None) -> Application:
    """The :class:`Application` of model ``name`` (one of :data:`APPLICATION_NAMES`), from
    ``traces_dir`` (default: the vendored traces), loaded once and shared: its step times
    on ``gpu_type`` (one of :data:`~adaptdl_core.sim.gpu_types.GPU_TYPES`), or ``None``
    for the Pollux paper's T4 traces with its memory limits.

    Raises:
        ValueError: unknown name or type (lists the known ones).
    """
    base = Path(traces_dir) if traces_dir is not None else TRACES_DIR
    if not (base / name).is_dir():
        raise ValueError(f"unknown application {name!r}: no folder {base / name}; known: "
                         f"{', '.join(APPLICATION_NAMES)}")
    if gpu_type is not None and gpu_type not in TRACE_SUFFIX:
        raise ValueError(f"gpu_type {gpu_type!r} has no traces; use one of "
                         f"{', '.join(TRACE_SUFFIX)} or None")
    return _load(str((base / name).resolve()), gpu_type)


def fixed_batch_config(app: Application, num_replicas: int, batch_size: int,
                       force_accum_single: bool = True) -> Tuple[int, int]:
    """``(atomic_bsz, accum_steps)`` that run total batch ``batch_size`` on ``num_replicas``
    replicas within the model's micro-batch limit: the fewest accumulation steps, the
    micro-batch rounded up, and never beyond the model's largest batch. With
    ``force_accum_single``, a single replica above ``M0`` accumulates at least once (the
    original AdaptDL measured its gradient noise that way; the TunedJobs baselines keep it).

    Raises:
        ValueError: ``num_replicas`` or ``batch_size`` < 1.
    """
    if not (num_replicas >= 1 and batch_size >= 1):  # (inline first: the search's hot path)
        validation.number("num_replicas", num_replicas, 1.0)
        validation.number("batch_size", batch_size, 1.0)
    local = math.ceil(batch_size / num_replicas - _EPS)
    accum = math.ceil(local / app.max_local_bsz - _EPS) - 1
    if force_accum_single and num_replicas == 1 and batch_size > app.init_batch_size:
        accum = max(1, accum)
    atomic = math.ceil(local / (accum + 1) - _EPS)
    atomic = min(atomic, int(app.max_batch_size / (num_replicas * (accum + 1))))
    return int(atomic), int(accum)


class SimJob:
    """One simulated job of an :class:`Application`.

    Args:
        name: the job's name.
        app: its model.
        submission_time: when it arrives, seconds from the start of the simulation.
        target_batch_size: a fixed total batch (TunedJobs); ``None`` makes the job adaptive
            (its agent chooses the batch by goodput).
        target_num_replicas: the TunedJobs replica count (used by fixed-size schedulers).
        restart_s: seconds without progress after every start or change of allocation.
        min_batch_improvement: an adaptive job changes its running batch between
            re-allocations only when the predicted goodput improves by more than this
            fraction (the library's agent uses 5% against oscillation; 0 re-chooses freely).
        apps_by_type: on a cluster of several GPU types, the model's application on each
            type (``app`` must be one of them: where it is modelled before its first
            start); :meth:`reallocate` then names the type of each allocation.
        type_aware: with ``apps_by_type``, whether the agent keeps one profile and one
            throughput fit per GPU type (``True``) or one of everything it measured
            (``False``: a type-unaware agent, as the Sia paper ran Pollux).
        slowdown: real training is this many times slower than the traced step times say
            (a calibration, ``>= 1``; the measurements the agent records stay the traced).

    Attributes (read-only by convention): ``placement`` (replicas per node, ``()`` when not
    running), ``atomic_bsz``, ``accum_steps``, ``progress``, ``epoch``, ``num_restarts``
    (``None`` before the first start), ``completion_time``, ``attained_service``
    (GPU-seconds held), ``gpu_seconds_by_type`` (the same by GPU type, typed clusters),
    ``trained_s`` (seconds it held an allocation, restarts included: what a front-end
    measures as its training time), ``perf_params``, ``grad_params``, ``profile`` ((nodes,
    replicas, atomic batch) -> (step_time, sync_time); of the current GPU type when
    type-aware), ``num_fits``, ``gpu_type`` (the type of its current or last allocation).

    Raises:
        ValueError: malformed arguments.
    """

    def __init__(self, name: str, app: Application, submission_time: float,
                 target_batch_size: Optional[int] = None,
                 target_num_replicas: Optional[int] = None, restart_s: float = 30.0,
                 min_batch_improvement: float = 0.0, *,
                 apps_by_type: Optional[Mapping[str, Application]] = None,
                 type_aware: bool = True, slowdown: float = 1.0) -> None:
        validation.number("submission_time", submission_time, 0.0)
        validation.number("slowdown", slowdown, 1.0, what="a calibration factor")
        if apps_by_type is not None and app not in apps_by_type.values():
            raise ValueError(f"app of {name} must be one of apps_by_type's applications")
        validation.number("restart_s", restart_s, 0.0, what="a finite number of seconds")
        if target_batch_size is not None and not (
                app.init_batch_size <= target_batch_size <= app.max_batch_size):
            raise ValueError(f"target_batch_size of {name} must be within "
                             f"[{app.init_batch_size}, {app.max_batch_size}], got "
                             f"{target_batch_size}")
        self.name = name
        self.app = app
        self.submission_time = float(submission_time)
        self.target_batch_size = target_batch_size
        self.target_num_replicas = target_num_replicas
        self.restart_s = float(restart_s)
        self.min_batch_improvement = float(min_batch_improvement)
        self.now = 0.0
        self.placement: Tuple[int, ...] = ()
        self.atomic_bsz = 0
        self.accum_steps = 0
        self.progress = 0.0
        self.epoch = 0
        self.num_restarts: Optional[int] = None
        self.completion_time: Optional[float] = None
        self.attained_service = 0.0
        self.trained_s = 0.0
        self.rescale_left = 0.0
        self.profile: Dict[Tuple[int, int, int], Tuple[float, float]] = {}
        self.perf_params: Optional[PerfParams] = None
        self.grad_params: Optional[Tuple[float, float]] = None
        self.num_fits = 0
        self._goodput_fn: Optional[GoodputFunction] = None
        self.apps_by_type = dict(apps_by_type) if apps_by_type is not None else None
        self.type_aware = bool(type_aware)
        self.slowdown = float(slowdown)
        self.gpu_type: Optional[str] = app.gpu_type if apps_by_type is not None else None
        self.gpu_seconds_by_type: Dict[Optional[str], float] = {}
        # Type-aware agent: the profile and fit of the types it is not on now.
        self._stashed: Dict[Optional[str], Tuple[dict, Optional[PerfParams]]] = {}

    def __repr__(self) -> str:
        return (f"SimJob({self.name!r}, epoch={self.epoch}/{self.app.max_epochs}, "
                f"placement={self.placement}, batch={self.batch_size})")

    # -- configuration ------------------------------------------------------------------
    @property
    def adaptive(self) -> bool:
        """Whether the job chooses its own batch size."""
        return self.target_batch_size is None

    @property
    def done(self) -> bool:
        """Whether the job has finished all its epochs."""
        return self.completion_time is not None

    @property
    def num_replicas(self) -> int:
        """Replicas it runs now (0 when not running)."""
        return sum(self.placement)

    @property
    def batch_size(self) -> int:
        """Total batch of one optimizer step now (0 when not running)."""
        return self.num_replicas * self.atomic_bsz * (self.accum_steps + 1)

    @property
    def max_profiled_replicas(self) -> int:
        """The largest replica count the job has run at (0 before it ran)."""
        return max((k[1] for k in self.profile), default=0)

    @property
    def max_profiled_nodes(self) -> int:
        """The largest node count the job has run at (0 before it ran)."""
        return max((k[0] for k in self.profile), default=0)

    def goodput_function(self) -> Optional[GoodputFunction]:
        """The agent's current goodput model, ``None`` before its first measurement."""
        if self._goodput_fn is None and self.perf_params is not None \
                and self.grad_params is not None:
            self._goodput_fn = GoodputFunction(self.perf_params, self.grad_params,
                                               self.app.init_batch_size)
        return self._goodput_fn

    def hints(self) -> SchedHints:
        """What the job's agent reports to a scheduler: its fitted throughput model,
        gradient statistics, batch limits and profiled extent."""
        app = self.app
        fixed = self.target_batch_size is not None
        return SchedHints(
            perf_params=self.perf_params,
            grad_params=self.grad_params,
            init_batch_size=app.init_batch_size,
            max_batch_size=None if fixed else app.max_batch_size,
            local_bsz_bounds=(app.min_local_bsz, app.max_local_bsz),
            gradient_accumulation=True,
            max_profiled_replicas=self.max_profiled_replicas,
            max_profiled_nodes=self.max_profiled_nodes,
            restart_cost_s=self.restart_s,
        )

    def _choose_batch(self, rechoose: bool) -> None:
        app = self.app
        nodes, replicas = len(self.placement), self.num_replicas
        fn = self.goodput_function()
        if self.target_batch_size is not None:
            self.atomic_bsz, self.accum_steps = fixed_batch_config(
                app, replicas, self.target_batch_size)
            return
        if fn is None:
            bsz = max(app.init_batch_size, app.min_local_bsz * replicas)
            self.atomic_bsz, self.accum_steps = fixed_batch_config(app, replicas, bsz)
            return
        goodput, atomic, accum = fn.optimize(nodes, replicas, app.max_batch_size,
                                             (app.min_local_bsz, app.max_local_bsz),
                                             accumulation=True)
        atomic, accum = min(int(atomic), app.max_local_bsz_at(replicas)), int(accum)
        if (not rechoose and self.min_batch_improvement > 0 and self.atomic_bsz > 0
                and (atomic, accum) != (self.atomic_bsz, self.accum_steps)):
            current = float(fn.evaluate(nodes, replicas, self.atomic_bsz, self.accum_steps))
            if float(goodput) <= current * (1.0 + self.min_batch_improvement):
                return
        count = replicas * (accum + 1)
        self.atomic_bsz = min(atomic, int(app.max_batch_size / count))
        self.accum_steps = accum

    def _record(self, step_time: float, sync_time: float, sqr: float, var: float) -> None:
        if self.grad_params != (sqr, var):
            self.grad_params = (sqr, var)
            self._goodput_fn = None
        key = (len(self.placement), self.num_replicas, self.atomic_bsz)
        if key in self.profile or self.target_batch_size is not None:
            # Fixed-batch jobs are scheduled without a throughput model: skip the fit.
            self.profile.setdefault(key, (step_time, sync_time))
            return
        self.profile[key] = (step_time, sync_time)
        # The fit is a deterministic function of (profile in order, warm start), and jobs of
        # one model often walk the same configurations (1, 2, 4 GPUs at the same batches):
        # a job repeating another's history reuses its fit instead of refitting.
        memo_key = (self.app.name, self.gpu_type if self.type_aware else None,
                    tuple(self.profile.items()), self.perf_params)
        fitted = _FIT_MEMO.get(memo_key)
        if fitted is None:
            arr = np.array([(k[0], k[1], k[2], v[0], v[1]) for k, v in self.profile.items()])
            fitted = fit_perf_params(arr[:, 0], arr[:, 1], arr[:, 2],
                                     arr[:, 3] - arr[:, 4], arr[:, 3],
                                     initial=self.perf_params)
            if len(_FIT_MEMO) >= _FIT_MEMO_SIZE:
                _FIT_MEMO.pop(next(iter(_FIT_MEMO)))
            _FIT_MEMO[memo_key] = fitted
        self.perf_params = fitted
        self.num_fits += 1
        self._goodput_fn = None

    # -- events -------------------------------------------------------------------------
    def reallocate(self, placement: Sequence[int], gpu_type: Optional[str] = None) -> None:
        """Run on ``placement`` (replicas per node; empty to stop) from now on, on GPUs of
        ``gpu_type`` (required for a job with ``apps_by_type``, ignored otherwise). A start
        or change costs ``restart_s`` without progress and counts as a restart (the first
        start does not). The agent re-chooses its batch for the new shape.

        Raises:
            ValueError: a malformed placement, or a type the job has no application for.
        """
        placement = tuple(int(v) for v in placement if int(v) != 0)
        if any(v < 0 for v in placement):
            raise ValueError(f"placement must be replicas per node (>= 0), got {placement}")
        if placement and self.apps_by_type is not None:
            self._switch_type(gpu_type)
        if not placement:
            self.placement = ()
            self.atomic_bsz = 0
            self.accum_steps = 0
            self.rescale_left = 0.0
            return
        self.placement = placement
        self._choose_batch(rechoose=True)
        self.rescale_left = self.restart_s
        self.num_restarts = 0 if self.num_restarts is None else self.num_restarts + 1

    def _switch_type(self, gpu_type: Optional[str]) -> None:
        """Run on ``gpu_type`` from now on: its application; a type-aware agent also
        swaps in that type's profile and fit (and keeps the others)."""
        if gpu_type not in self.apps_by_type:
            raise ValueError(f"{self.name}: gpu_type must be one of "
                             f"{sorted(self.apps_by_type)}, got {gpu_type!r}")
        if gpu_type == self.gpu_type:
            return
        if self.type_aware:
            self._stashed[self.gpu_type] = (self.profile, self.perf_params)
            self.profile, self.perf_params = self._stashed.pop(gpu_type, ({}, None))
            self._goodput_fn = None
        self.gpu_type = gpu_type
        self.app = self.apps_by_type[gpu_type]

    def fits_by_type(self) -> Dict[str, Tuple[PerfParams, int]]:
        """A type-aware job's throughput fit on each GPU type it has measured, with the
        largest replica count measured there: type -> ``(PerfParams, replicas)``."""
        out = {t: (perf, max(k[1] for k in profile))
               for t, (profile, perf) in self._stashed.items()
               if t is not None and perf is not None and profile}
        if self.gpu_type is not None and self.perf_params is not None and self.profile:
            out[self.gpu_type] = (self.perf_params, self.max_profiled_replicas)
        return out

    def _hold(self, seconds: float, replicas: int) -> None:
        """Count ``seconds`` of holding ``replicas`` GPUs (of the current type)."""
        self.attained_service += seconds * replicas
        self.gpu_seconds_by_type[self.gpu_type] = \
            self.gpu_seconds_by_type.get(self.gpu_type, 0.0) + seconds * replicas

    def advance(self, seconds: float, interference: float = 0.0) -> None:
        """Let ``seconds`` pass. A running job first pays what is left of its restart, then
        trains: each step of its current configuration takes the traced step time (plus
        ``accum_steps`` compute-only micro-batches) slowed by ``interference`` (a fraction in
        [0, 1)), and advances progress by its AdaScale gain. At each epoch boundary (time
        rounded to whole seconds) the job may finish; after each stretch the agent records
        the measurement, refits and re-chooses its batch.

        Raises:
            ValueError: negative ``seconds`` or ``interference`` outside [0, 1).
        """
        if not (seconds >= 0 and 0.0 <= interference < 1.0):  # (inline first: every tick)
            validation.number("seconds", seconds, 0.0)
            validation.number("interference", interference, 0.0, 1.0, high_open=True)
        if not self.placement or self.done:
            self.now += seconds
            return
        started = self.now
        self._train(seconds, interference)
        self.trained_s += (self.completion_time if self.done else self.now) - started

    def _train(self, seconds: float, interference: float) -> None:
        """:meth:`advance` of a running job."""
        replicas = self.num_replicas
        delay = min(self.rescale_left, seconds)
        self.now += delay
        self._hold(delay, replicas)
        self.rescale_left -= delay
        seconds -= delay
        app = self.app
        while seconds > 0 and not self.done:
            batch = self.batch_size
            step, sync = app.step_time(self.placement, self.atomic_bsz)
            compute = step - sync
            sqr, var = app.grad_stats(batch, self.epoch)
            scale = batch / app.init_batch_size
            gain = (var + sqr) / (var / scale + sqr)
            self._record(step, sync, sqr, var)
            rate = gain / (step + compute * self.accum_steps) * (1.0 - interference) \
                / self.slowdown
            target = app.epoch_progress(self.epoch + 1)
            if self.progress + rate * seconds < target:
                self.progress += rate * seconds
                self.now += seconds
                self._hold(seconds, replicas)
                seconds = 0
            else:
                delta = float(round((target - self.progress) / rate))
                delta = min(delta, seconds)
                self.epoch += 1
                self.progress = target
                self.now += delta
                self._hold(delta, replicas)
                seconds -= delta
                if self.epoch >= app.max_epochs:
                    self.completion_time = self.now
            if not self.done:
                self._choose_batch(rechoose=False)
        self.now += seconds

    def remaining_iterations(self) -> float:
        """Optimizer steps a fixed-batch job still needs at its target batch (exact, from the
        traces: Optimus's oracle). 1 once within its last epoch's bookkeeping.

        Raises:
            ValueError: for an adaptive job.
        """
        if self.target_batch_size is None:
            raise ValueError(f"{self.name} is adaptive: remaining_iterations needs a fixed "
                             "target_batch_size")
        last = self.app.max_epochs - 1
        if last <= self.epoch:
            return 1.0
        return (self.app.iterations(self.target_batch_size, last)
                - self.app.iterations(self.target_batch_size, self.epoch))
