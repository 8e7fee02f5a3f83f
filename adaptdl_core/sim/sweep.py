"""Simulate a hyper-parameter sweep of ResNet-18/CIFAR-10 trials on a GPU cluster.

The Pollux paper's HPO setting (``python -m adaptdl_core.sim sweep``): ``trials`` trials of
the ``cifar10`` job model (:mod:`adaptdl_core.sim.job_model`, the real traces), at most
``concurrent`` running at once (as Ray Tune's ``max_concurrent_trials``), on ``nodes`` x
``gpus_per_node`` GPUs, admitted in a fixed order (the searcher's). Three arms run on the
same seeded trial draws:

* ``a`` (static): every trial gets ``gpus_per_trial`` GPUs packed on free nodes and keeps
  a fixed total batch (``static_batch``, default 2048: the cifar10 TunedJobs batch of the
  paper's workloads at their smaller replica counts, 6-8 GPUs; the other one, 4096, goes
  with 12-16 GPUs).
* ``b`` (adaptive): the decision core (:class:`adaptdl_core.sim.pollux.CorePollux`:
  ``PolluxPolicy`` p = -1, the resize rule and the restart penalty, the path of the cluster
  mode and of ``AdaptDLScheduler``) re-divides the GPUs among the running trials every
  ``interval`` seconds and whenever a trial starts or ends; each trial's agent chooses its
  batch by goodput (the job model's adaptive mode). The trials form one profile group of
  the core (``AdaptDLScheduler``'s default): a new trial is modelled with the throughput
  profile of the most widely profiled earlier trial until its own reaches as far.
* ``c`` = ``b`` under asynchronous successive halving (:class:`AshaRule`, Tune's
  ``ASHAScheduler`` defaults: reduction factor 4, grace period 1 epoch, rungs on epochs).

Every start or change of a trial's allocation costs ``restart_s`` seconds without progress,
in every arm. The arms run in the round loop of :mod:`adaptdl_core.sim.rounds`, as the
cluster mode does: trials are admitted from a queue, at most ``concurrent`` at once
(:class:`~adaptdl_core.sim.rounds.QueueAdmission`); arm ``a``'s policy is
:class:`~adaptdl_core.sim.baselines.FixedSharePolicy`, arm ``c`` stops trials with
:class:`AshaStopping`. Time advances in ticks of ``tick_s`` seconds: a trial that ends (or
is stopped by ASHA at an epoch reached) within a tick frees its GPUs at the tick's end, in
every arm alike; the policy decides whenever a trial was admitted or ended, and the
adaptive arms' also at rounds on multiples of ``interval``.

Quality model (:class:`QualityModel`): the validation metric of trial ``i`` at the end of
epoch ``e`` is ``ref[e] + offset_i + noise_{i,e}``, clipped to [0, 1], where ``ref`` is the
``metric`` column of the cifar10 trace run at the initial batch (``validation-128.csv``:
top-1 accuracy after each epoch's worth of statistical progress), ``offset_i = -|N(0,
offset_sd)|`` is drawn once per trial and stands for how good its hyper-parameters are (the
reference run is as good as a trial gets, save for noise), and ``noise_{i,e} ~ N(0,
noise_sd)`` is the evaluation noise of one validation pass. Both are drawn from ``seed``
before any arm runs, so a trial has the same metric at the same epoch in every arm; the
metric depends on statistical progress only (the job model's AdaScale progress is
batch-invariant by construction), so adaptive batch sizes do not change a trial's quality
in this model: the arms differ in time and GPUs, not in accuracy.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from adaptdl_core import validation

from .baselines import FixedSharePolicy
from .cluster import MIN_INTERVAL_S
from .ideal import epoch_seconds
from .job_model import TRACES_DIR, Application, SimJob
from .rounds import Observer, QueueAdmission, Schedule, run_rounds

__all__ = ["ARMS", "AshaRule", "QualityModel", "TrialRecord", "simulate_arm", "run_sweep",
           "makespan_bounds", "add_sweep_parser", "run_sweep_cli"]

logger = logging.getLogger(__name__)

#: The arms: static, adaptive, adaptive + ASHA.
ARMS = ("a", "b", "c")
ARM_NAMES = {"a": "static", "b": "adaptive", "c": "adaptive+asha"}
#: The model the sweep trains (the paper's HPO experiment: ResNet-18 on CIFAR-10).
APPLICATION = "cifar10"


# -- ASHA ------------------------------------------------------------------------------
class AshaRule:
    """Asynchronous successive halving on epochs (one bracket, as Tune's ``ASHAScheduler``
    with ``brackets=1``; the metric is maximised).

    Rungs sit at ``grace_period * reduction_factor**k`` epochs below ``max_t``. When a trial
    first reports at or past a rung it has not been judged at, it is compared with the
    values recorded there before it: it stops if its metric is below their
    ``1 - 1/reduction_factor`` quantile (linear interpolation), else it continues; either
    way its value is recorded. The first trial at a rung always continues. A trial that
    reaches ``max_t`` is complete, not stopped.

    Args:
        max_t: epochs of a complete trial (>= 1).
        grace_period: epochs before the first rung (>= 1).
        reduction_factor: keep about one trial in this many at each rung (> 1).

    Raises:
        ValueError: a bound outside its range (named).
    """

    def __init__(self, max_t: int, grace_period: int = 1, reduction_factor: float = 4) -> None:
        self.max_t = validation.integer("max_t", max_t, 1, what="an integer number of epochs")
        self.grace_period = validation.integer("grace_period", grace_period, 1, self.max_t)
        self.reduction_factor = validation.number("reduction_factor", reduction_factor, 1.0,
                                                  low_open=True)
        count = int(math.log(max_t / grace_period) / math.log(self.reduction_factor) + 1)
        #: Rung milestones in epochs, ascending.
        self.rungs: Tuple[int, ...] = tuple(
            sorted({int(round(grace_period * self.reduction_factor ** k))
                    for k in range(count)}))
        self._recorded: Dict[int, Dict[str, float]] = {m: {} for m in self.rungs}

    def cutoff(self, rung: int) -> Optional[float]:
        """The value a trial must reach to continue at ``rung`` now (``None``: nothing
        recorded there yet).

        Raises:
            KeyError: ``rung`` is not one of :attr:`rungs`."""
        values = list(self._recorded[rung].values())
        if not values:
            return None
        return float(np.percentile(values, (1.0 - 1.0 / self.reduction_factor) * 100.0))

    def on_epoch(self, trial_id: str, epoch: int, metric: float) -> bool:
        """Judge ``trial_id`` after ``epoch`` epochs with ``metric``; ``True`` to continue,
        ``False`` to stop it early.

        Raises:
            ValueError: ``epoch`` < 1 or a non-finite metric."""
        validation.integer("epoch", epoch, 1)
        metric = validation.number("metric", metric)
        if epoch >= self.max_t:
            return True
        for rung in reversed(self.rungs):
            if epoch < rung:
                continue
            recorded = self._recorded[rung]
            if trial_id in recorded:
                return True  # already judged at its highest rung reached
            cut = self.cutoff(rung)
            recorded[trial_id] = float(metric)
            return cut is None or metric >= cut
        return True

    def recorded(self, rung: int) -> Dict[str, float]:
        """A copy of the values recorded at ``rung`` (trial id -> metric).

        Raises:
            KeyError: ``rung`` is not one of :attr:`rungs`."""
        return dict(self._recorded[rung])


class AshaStopping:
    """The stopping rule of :func:`adaptdl_core.sim.rounds.run_rounds` that asks an
    :class:`AshaRule` after every epoch a job finished in a step.

    Args:
        rule: the rule.
        metric: ``metric(name, epoch)``: the job's validation metric after ``epoch``.
    """

    def __init__(self, rule: AshaRule, metric) -> None:
        self.rule = rule
        self._metric = metric

    def stop(self, name: str, job: SimJob, epochs_before: int) -> bool:
        """Whether ``job`` stops after the epochs it finished since ``epochs_before``."""
        for e in range(epochs_before + 1, job.epoch + 1):
            if not self.rule.on_epoch(name, e, self._metric(name, e)):
                return True
        return False


# -- quality -----------------------------------------------------------------------------
class QualityModel:
    """Seeded validation metric of every trial after every epoch (see the module doc).

    Args:
        reference: the reference curve: metric after epoch 1, 2, ... (fractions in [0, 1]).
        trials: number of trials.
        seed: seeds the draws.
        offset_sd: scale of the per-trial hyper-parameter offset (fraction of accuracy).
        noise_sd: standard deviation of one evaluation's noise.

    Raises:
        ValueError: an empty curve, ``trials`` < 1 or a negative scale.
    """

    def __init__(self, reference: Sequence[float], trials: int, seed: int = 0,
                 offset_sd: float = 0.02, noise_sd: float = 0.003) -> None:
        ref = np.asarray(reference, dtype=float)
        if ref.ndim != 1 or ref.size == 0:
            raise ValueError("reference must be a non-empty list of per-epoch metrics")
        trials = validation.integer("trials", trials, 1)
        offset_sd = validation.number("offset_sd", offset_sd, 0.0)
        noise_sd = validation.number("noise_sd", noise_sd, 0.0)
        rng = np.random.default_rng(seed)
        self.reference = ref
        #: Per-trial offsets (<= 0), index = trial number.
        self.offsets = -np.abs(rng.normal(0.0, offset_sd, trials))
        self._noise = rng.normal(0.0, noise_sd, (trials, ref.size))

    @classmethod
    def from_traces(cls, app: Application, trials: int, seed: int = 0,
                    **kwargs) -> "QualityModel":
        """The model on ``app``'s validation run at its initial batch size.

        Raises:
            FileNotFoundError: no such validation file."""
        import csv

        path = Path(TRACES_DIR) / app.name / f"validation-{app.init_batch_size}.csv"
        with open(path, newline="") as f:
            ref = [float(r["metric"]) for r in csv.DictReader(f)]
        return cls(ref, trials, seed, **kwargs)

    def metric(self, trial: int, epoch: int) -> float:
        """Validation metric of trial number ``trial`` after ``epoch`` (>= 1) epochs.

        Raises:
            IndexError: ``trial`` or ``epoch`` outside the drawn range."""
        if not 1 <= epoch <= self.reference.size:
            raise IndexError(f"epoch must be in [1, {self.reference.size}], got {epoch}")
        value = self.reference[epoch - 1] + self.offsets[trial] + self._noise[trial, epoch - 1]
        return float(min(max(value, 0.0), 1.0))


# -- one arm ----------------------------------------------------------------------------
@dataclass
class TrialRecord:
    """What happened to one trial in one arm (times in simulated seconds).

    Attributes: ``name``; ``admitted`` (it took a concurrency slot); ``ended`` (completed,
    stopped, or ``None``); ``status`` (``completed``, ``stopped`` or ``unfinished``);
    ``epochs`` done; ``metric`` (after its last epoch, ``None`` before one); ``restarts``
    (changes of allocation after its first start); ``gpu_s`` (GPU-seconds held);
    ``timeline`` (``[t, gpus, batch]`` at every change of allocation or batch).
    """

    name: str
    admitted: float
    ended: Optional[float] = None
    status: str = "unfinished"
    epochs: int = 0
    metric: Optional[float] = None
    restarts: int = 0
    gpu_s: float = 0.0
    timeline: List[list] = field(default_factory=list)

    @property
    def jct(self) -> Optional[float]:
        """Seconds from admission to its end (``None`` while unfinished)."""
        return None if self.ended is None else self.ended - self.admitted

    def to_dict(self) -> dict:
        """Plain JSON-able form."""
        return {"name": self.name, "admitted": self.admitted, "ended": self.ended,
                "jct": self.jct, "status": self.status, "epochs": self.epochs,
                "metric": self.metric, "restarts": self.restarts, "gpu_s": self.gpu_s,
                "timeline": self.timeline}


class _TrialRecorder(Observer):
    """A :class:`TrialRecord` per trial, kept up to date by the round loop."""

    def __init__(self, metric) -> None:
        self.records: Dict[str, TrialRecord] = {}
        self._metric = metric

    def admitted(self, job, now) -> None:
        """Opens the trial's record."""
        self.records[job.name] = TrialRecord(job.name, now)

    def allocated(self, now, jobs, allocations, decided) -> None:
        """Adds a timeline point where a trial's GPUs or batch changed."""
        for name, job in jobs.items():
            rec = self.records[name]
            point = [now, job.num_replicas, job.batch_size]
            if not rec.timeline or rec.timeline[-1][1:] != point[1:]:
                rec.timeline.append(point)

    def trained(self, job, epochs_before) -> None:
        """Epochs done and the metric after the last one."""
        rec = self.records[job.name]
        rec.epochs = job.epoch
        if job.epoch > epochs_before:
            rec.metric = self._metric(job.name, job.epoch)

    def ended(self, job, status, at) -> None:
        """Closes the record."""
        rec = self.records[job.name]
        rec.status, rec.ended = status, at
        rec.restarts = int(job.num_restarts or 0)
        rec.gpu_s = float(job.attained_service)


def simulate_arm(arm: str, *, trials: int = 100, concurrent: int = 4, nodes: int = 4,
                 gpus_per_node: int = 4, epochs: Optional[int] = None, seed: int = 0,
                 restart_s: float = 30.0, interval: float = 60.0, tick_s: float = 5.0,
                 gpus_per_trial: int = 4, static_batch: Optional[int] = 2048,
                 grace_period: int = 1, reduction_factor: float = 4,
                 quality: Optional[QualityModel] = None,
                 traces: Optional[Union[str, Path]] = None,
                 max_time: Optional[float] = None, share_profiles: bool = True,
                 policy=None) -> dict:
    """Run one arm of the sweep (see the module doc) until every trial has ended.

    Args:
        arm: ``"a"`` (static), ``"b"`` (adaptive) or ``"c"`` (adaptive + ASHA).
        trials: trials in the sweep; concurrent: most running at once.
        nodes, gpus_per_node: the cluster.
        epochs: epochs of a complete trial (default: the model's 100).
        seed: seeds the quality draws (ignored when ``quality`` is given).
        restart_s: seconds without progress per start or change of allocation.
        interval: seconds between the adaptive arms' policy rounds (``>= 1``).
        tick_s: simulation step, seconds, ``>= 1`` (trial ends are seen at a tick's end).
        gpus_per_trial, static_batch: arm ``a``'s fixed allocation and total batch
            (``static_batch=None``: on that fixed allocation each trial's agent chooses
            its batch by goodput, a diagnostic that isolates the batch-size gain).
        grace_period, reduction_factor: arm ``c``'s ASHA settings.
        quality: the quality draws (default: :meth:`QualityModel.from_traces` with
            ``seed``); pass the same object to every arm.
        traces: traces folder (default: the vendored traces).
        max_time: stop after this many simulated seconds (unfinished trials stay so).
        share_profiles: arms ``b``/``c``: the trials form one profile group of the
            decision core (as under ``AdaptDLScheduler``'s default), so that a new trial
            is modelled with the most widely profiled earlier trial's throughput profile
            until its own reaches as far; ``False``: each trial explores from one GPU.
        policy: a policy object instead of the arm's (see :mod:`adaptdl_core.sim.rounds`;
            e.g. ``CorePollux(policy=RemainingWorkPolicy())`` for arms ``b``/``c``);
            ``share_profiles`` and ``gpus_per_trial`` then do not apply to it.

    Returns:
        A JSON-able dict: ``arm``, ``name``, ``makespan`` (first admission to last end, s),
        ``mean_jct`` (over completed trials), ``mean_jct_all`` (every ended trial),
        ``gpu_hours`` (GPU time held, restarts included), ``completed``, ``stopped_early``,
        ``top1``/``top5`` (best and mean of the five best final metrics of completed
        trials), ``decision_s`` (``median``/``max``/``rounds``: wall seconds per policy
        call), ``restarts``, ``max_gpus_held`` (most GPUs held at once), ``batch``
        (``min``/``median``/``max`` total batch over every trial's timeline),
        ``trials`` (per-trial :meth:`TrialRecord.to_dict`), ``wall_s`` and ``settings``.

    Raises:
        ValueError: a bad argument (named), e.g. ``gpus_per_trial`` beyond the cluster or
            ``static_batch`` outside the model's validated batch sizes.
    """
    if arm not in ARMS:
        raise ValueError(f"arm must be one of {', '.join(ARMS)}, got {arm!r}")
    trials = validation.integer("trials", trials, 1)
    concurrent = validation.integer("concurrent", concurrent, 1)
    nodes = validation.integer("nodes", nodes, 1)
    gpus_per_node = validation.integer("gpus_per_node", gpus_per_node, 1)
    gpus_per_trial = validation.integer("gpus_per_trial", gpus_per_trial, 1)
    interval = validation.number("interval", interval, 0.0, low_open=True)
    tick_s = validation.number("tick_s", tick_s, 0.0, low_open=True)
    for name, value in (("interval", interval), ("tick_s", tick_s)):
        if value < MIN_INTERVAL_S:  # the step count would be absurd (a run that never ends)
            raise ValueError(f"{name} must be >= {MIN_INTERVAL_S:g} s, got {value!r}: "
                             "steps shorter than a second multiply the steps to simulate")
    restart_s = validation.number("restart_s", restart_s, 0.0, what="a finite number of seconds")
    if gpus_per_trial > nodes * gpus_per_node:
        raise ValueError(f"gpus_per_trial ({gpus_per_trial}) exceeds the cluster's "
                         f"{nodes * gpus_per_node} GPUs: lower it or add nodes")
    base_dir = Path(traces) if traces is not None else TRACES_DIR
    app = Application(base_dir / APPLICATION, max_epochs=epochs)
    if static_batch is not None and not (
            app.init_batch_size <= static_batch <= app.max_batch_size):
        raise ValueError(f"static_batch must be within {app.name}'s validated batch sizes "
                         f"[{app.init_batch_size}, {app.max_batch_size}], got {static_batch}")
    if quality is None:
        quality = QualityModel.from_traces(app, trials, seed)
    if quality.offsets.size < trials or quality.reference.size < app.max_epochs:
        raise ValueError(f"quality draws cover {quality.offsets.size} trials and "
                         f"{quality.reference.size} epochs; the sweep needs {trials} and "
                         f"{app.max_epochs}")
    asha = AshaRule(app.max_epochs, grace_period, reduction_factor) if arm == "c" else None
    order = [f"trial-{i:03d}" for i in range(trials)]
    index = {name: i for i, name in enumerate(order)}
    if arm == "a":
        # Static: a fixed share as soon as one is free; only admissions and ends change it.
        schedule = Schedule(tick=tick_s, on_events=True)
        if policy is None:
            policy = FixedSharePolicy(gpus_per_trial)
    else:
        schedule = Schedule(tick=tick_s, interval=interval, on_events=True)
        if policy is None:
            from .pollux import CorePollux  # the cluster mode's path through the decision core

            policy = CorePollux(interval=interval)
            if share_profiles:
                # Every trial trains the same model: one profile group (as AdaptDLScheduler's
                # default), so a new trial starts from the earlier trials' throughput profile.
                policy.core.default_profile_group = APPLICATION
    node_gpus = {n: gpus_per_node for n in range(nodes)}

    def make_trial(name: str, now: float) -> SimJob:
        return SimJob(name, app, now, restart_s=restart_s,
                      target_batch_size=static_batch if arm == "a" else None)

    def metric(name: str, epoch: int) -> float:
        return quality.metric(index[name], epoch)

    t_wall = time.perf_counter()
    recorder = _TrialRecorder(metric)
    outcome = run_rounds(policy, QueueAdmission(order, make_trial, concurrent),
                         nodes=node_gpus, schedule=schedule,
                         stopping=None if asha is None else AshaStopping(asha, metric),
                         observer=recorder, max_time=max_time)
    records = recorder.records
    now = outcome.now
    decision_times = outcome.decision_times
    max_held = outcome.max_held
    for name, job in outcome.active.items():  # unfinished (max_time)
        records[name].restarts = int(job.num_restarts or 0)
        records[name].gpu_s = float(job.attained_service)

    recs = [records[n] for n in order if n in records]
    done = [r for r in recs if r.status == "completed"]
    ended_recs = [r for r in recs if r.ended is not None]
    finals = sorted((r.metric for r in done if r.metric is not None), reverse=True)
    batches = [p[2] for r in recs for p in r.timeline if p[2] > 0]
    result = {
        "arm": arm,
        "name": ARM_NAMES[arm],
        "makespan": max((r.ended for r in ended_recs), default=now)
        - min((r.admitted for r in recs), default=0.0),
        "mean_jct": statistics.fmean(r.jct for r in done) if done else None,
        "mean_jct_all": statistics.fmean(r.jct for r in ended_recs) if ended_recs else None,
        "gpu_hours": sum(r.gpu_s for r in recs) / 3600.0,
        "completed": len(done),
        "stopped_early": sum(r.status == "stopped" for r in recs),
        "num_trials": trials,
        "top1": finals[0] if finals else None,
        "top5": statistics.fmean(finals[:5]) if finals else None,
        "decision_s": {"median": statistics.median(decision_times) if decision_times else 0.0,
                       "max": max(decision_times, default=0.0),
                       "rounds": len(decision_times)},
        "restarts": sum(r.restarts for r in recs),
        "max_gpus_held": max_held,
        "batch": {"min": min(batches, default=0), "max": max(batches, default=0),
                  "median": statistics.median(batches) if batches else 0},
        "trials": [r.to_dict() for r in recs],
        "settings": {"trials": trials, "concurrent": concurrent, "nodes": nodes,
                     "gpus_per_node": gpus_per_node, "epochs": app.max_epochs,
                     "seed": seed, "restart_s": restart_s, "interval": interval,
                     "tick_s": tick_s, "gpus_per_trial": gpus_per_trial,
                     "static_batch": static_batch, "share_profiles": bool(share_profiles),
                     "asha": None if asha is None else
                     {"grace_period": grace_period, "reduction_factor": reduction_factor,
                      "rungs": list(asha.rungs)}},
        "wall_s": time.perf_counter() - t_wall,
    }
    logger.info("sweep arm %s (%s): makespan %.0f s, %d completed, %d stopped, %.1f GPU-h, "
                "wall %.1f s", arm, ARM_NAMES[arm], result["makespan"], result["completed"],
                result["stopped_early"], result["gpu_hours"], result["wall_s"])
    return result


def makespan_bounds(*, trials: int = 100, concurrent: int = 4, nodes: int = 4,
                    gpus_per_node: int = 4, epochs: Optional[int] = None,
                    restart_s: float = 30.0, gpus_per_trial: int = 4,
                    static_batch: int = 2048,
                    traces: Optional[Union[str, Path]] = None) -> dict:
    """What the sweep's makespan can be at best in this job model, against the static
    arm's: the yardstick for the adaptive arms (same arguments as :func:`simulate_arm`).

    * ``static``: trials back to back in ``trials / concurrent`` waves, each epoch at
      ``gpus_per_trial`` GPUs and ``static_batch``, plus one start (``restart_s``) per
      wave: arm ``a`` without its ticks.
    * ``fair_share``: the same waves, each epoch at ``gpus_per_trial`` GPUs and its
      fastest configuration: what adaptive batch sizes alone give, with the GPUs split
      evenly (identical trials admitted together, as here, stay in lockstep, and a
      policy that treats equal trials equally splits them so).
    * ``lower_bound``: no schedule of the sweep, whatever GPUs it gives each trial in
      each epoch (any count up to the cluster, fastest configuration, free resizes,
      perfect foresight), finishes earlier: the makespan ``M`` must cover the GPU-time
      (``sum g_e T_e(g_e) <= G M``) and the slots (``sum T_e(g_e) <= C M``) of every
      trial's epochs; for every weight ``w`` in [0, 1], ``M >= sum_e min_g T_e(g)
      (w g / G + (1 - w) / C)`` per trial, maximised over ``w`` (the Lagrangian dual of
      that relaxation), plus one start per wave.

    Returns:
        ``{"static", "fair_share", "lower_bound"}`` in simulated seconds, their ratios to
        ``static`` (``fair_share_ratio``, ``lower_bound_ratio``), ``gpus_by_epoch`` (the
        GPUs per epoch at the bound's weight) and ``weight``.

    Raises:
        ValueError: a bad argument (named).
    """
    trials = validation.integer("trials", trials, 1)
    concurrent = validation.integer("concurrent", concurrent, 1)
    gpus = validation.integer("nodes", nodes, 1) * validation.integer("gpus_per_node",
                                                                       gpus_per_node, 1)
    gpus_per_trial = validation.integer("gpus_per_trial", gpus_per_trial, 1)
    if gpus_per_trial > gpus:
        raise ValueError(f"gpus_per_trial ({gpus_per_trial}) exceeds the cluster's {gpus} "
                         "GPUs: lower it or add nodes")
    base_dir = Path(traces) if traces is not None else TRACES_DIR
    app = Application(base_dir / APPLICATION, max_epochs=epochs)
    waves = trials / concurrent
    starts = math.ceil(waves) * float(restart_s)
    static = waves * float(epoch_seconds(app, gpus_per_trial, gpus_per_node,
                                          static_batch).sum()) + starts
    per_gpus = np.stack([epoch_seconds(app, g, gpus_per_node) for g in range(1, gpus + 1)],
                        axis=1)  # epoch x GPUs
    fair = waves * float(per_gpus[:, gpus_per_trial - 1].sum()) + starts
    counts = np.arange(1, gpus + 1, dtype=float)
    best = (-math.inf, 0.0, None)
    for w in np.linspace(0.0, 1.0, 401):
        cost = per_gpus * (w * counts / gpus + (1.0 - w) / concurrent)
        value = trials * float(cost.min(axis=1).sum())
        if value > best[0]:
            best = (value, float(w), cost.argmin(axis=1) + 1)
    bound = best[0] + starts
    return {"static": static, "fair_share": fair, "lower_bound": bound,
            "fair_share_ratio": fair / static, "lower_bound_ratio": bound / static,
            "weight": best[1], "gpus_by_epoch": [int(g) for g in best[2]]}


def run_sweep(*, arms: Sequence[str] = ARMS, trials: int = 100, concurrent: int = 4,
              nodes: int = 4, gpus_per_node: int = 4, epochs: Optional[int] = None,
              seed: int = 0, restart_s: float = 30.0, interval: float = 60.0,
              **kwargs) -> dict:
    """Run ``arms`` of the sweep on the same seeded quality draws (see :func:`simulate_arm`
    for the arguments; ``kwargs`` go to it).

    Returns:
        ``{"arms": {arm: simulate_arm(...) result}, "ratio_b_a": makespan of b over a
        (``None`` unless both ran and completed the same number of trials), "settings"}``.

    Raises:
        ValueError: an unknown arm or a bad argument (named).
    """
    arms = list(dict.fromkeys(arms))
    bad = [a for a in arms if a not in ARMS]
    if bad or not arms:
        raise ValueError(f"arms must be a non-empty subset of {', '.join(ARMS)}, got {arms!r}")
    trials = validation.integer("trials", trials, 1)
    base_dir = Path(kwargs.get("traces") or TRACES_DIR)
    app = Application(base_dir / APPLICATION, max_epochs=epochs)
    quality = kwargs.pop("quality", None) or QualityModel.from_traces(app, trials, seed)
    results = {}
    for arm in arms:
        results[arm] = simulate_arm(arm, trials=trials, concurrent=concurrent, nodes=nodes,
                                    gpus_per_node=gpus_per_node, epochs=epochs, seed=seed,
                                    restart_s=restart_s, interval=interval, quality=quality,
                                    **kwargs)
    ratio = None
    if "a" in results and "b" in results and results["a"]["makespan"] > 0 \
            and results["a"]["completed"] == results["b"]["completed"]:
        ratio = results["b"]["makespan"] / results["a"]["makespan"]
    return {"arms": results, "ratio_b_a": ratio,
            "settings": {"trials": trials, "concurrent": concurrent, "nodes": nodes,
                         "gpus_per_node": gpus_per_node, "epochs": app.max_epochs,
                         "seed": seed, "restart_s": restart_s, "interval": interval}}


# -- command line -------------------------------------------------------------------------
def add_sweep_parser(sub) -> None:
    """Register the ``sweep`` subcommand on an ``argparse`` subparsers object."""
    p = sub.add_parser("sweep", help="simulate a hyper-parameter sweep of cifar10 trials: "
                       "static vs adaptive vs adaptive+ASHA")
    p.add_argument("--trials", type=int, default=100)
    p.add_argument("--concurrent", type=int, default=4, help="most trials running at once")
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--gpus-per-node", type=int, default=4)
    p.add_argument("--epochs", type=int, help="epochs per trial (default: 100)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--restart-s", type=float, default=30.0,
                   help="seconds without progress per start or change of allocation")
    p.add_argument("--interval", type=float, default=60.0, help="seconds per policy round")
    p.add_argument("--arms", default="a,b,c", help="comma-separated subset of a,b,c")
    p.add_argument("--static-batch", type=int, default=2048,
                   help="arm a's total batch (default: the cifar10 TunedJobs 2048)")
    p.add_argument("--tick-s", type=float, default=5.0, help="simulation step (s)")
    p.add_argument("--no-share-profiles", action="store_true",
                   help="adaptive arms: each trial profiles itself from one GPU up instead of "
                   "starting from the earlier trials' throughput profile")
    p.add_argument("--out", help="write the result JSON here")


def format_summary(result: Mapping) -> str:
    """One line per arm (and the b/a makespan ratio) for people."""
    lines = []
    for arm, r in result["arms"].items():
        top5 = "-" if r["top5"] is None else f"{100 * r['top5']:.2f}%"
        jct = "-" if r["mean_jct"] is None else f"{r['mean_jct']:.0f} s"
        lines.append(f"({arm}) {r['name']}: makespan {r['makespan']:.0f} s, mean JCT {jct}, "
                     f"{r['gpu_hours']:.1f} GPU-h, {r['completed']}/{r['num_trials']} completed"
                     f", {r['stopped_early']} stopped early, top-5 {top5}, decision median "
                     f"{1e3 * r['decision_s']['median']:.1f} ms, wall {r['wall_s']:.1f} s")
    if result.get("ratio_b_a") is not None:
        lines.append(f"makespan (b)/(a) = {result['ratio_b_a']:.3f}")
    return "\n".join(lines)


def run_sweep_cli(args) -> int:
    """Run the ``sweep`` subcommand from parsed ``args``; returns the exit status (2 for
    bad arguments, found before the simulation, and 1 when ``--out`` could not be written
    at the end: the result JSON then goes to stdout)."""
    import sys

    from .output import check_out_path, save_result

    try:
        if args.out:
            check_out_path(args.out)
        result = run_sweep(arms=[a.strip() for a in args.arms.split(",") if a.strip()],
                           trials=args.trials, concurrent=args.concurrent, nodes=args.nodes,
                           gpus_per_node=args.gpus_per_node, epochs=args.epochs,
                           seed=args.seed, restart_s=args.restart_s, interval=args.interval,
                           static_batch=args.static_batch, tick_s=args.tick_s,
                           share_profiles=not args.no_share_profiles)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(format_summary(result))
    if args.out:
        return save_result(args.out, result)
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    """``python -m adaptdl_core.sim.sweep``: the sweep subcommand on its own."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m adaptdl_core.sim")
    sub = parser.add_subparsers(dest="command", required=True)
    add_sweep_parser(sub)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    return run_sweep_cli(args)


if __name__ == "__main__":
    raise SystemExit(main())
