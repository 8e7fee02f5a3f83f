"""AdaptDLScheduler: re-divides the cluster among AdaptDL trials with the Pollux policy.

Tune bookkeeping only; the decisions come from :class:`adaptdl_core.policy.PolluxPolicy`
and :func:`adaptdl_core.policy.resize_verdict`.

* **Admission** is Tune's own: a new trial is PENDING at ``min_replicas`` and starts when
  its resources are free, exactly as under FIFO, so Tune's pending-trial limit and the
  searcher's concurrency keep working (a searcher is not asked for more trials than it
  would be under FIFO, and it learns from every result).
* **When**: the allocation is recomputed when trials are added or end (at most every
  ``_MIN_CHECK_INTERVAL_S``), and otherwise every ``allocation_interval_s`` seconds,
  never once per result.
* **Resize**: a running trial whose replica count changes is paused at its next result
  (Tune checkpoints it in place), its placement group request is updated while it is
  paused, and it is resumed with the new count; a trial is resized only when that pays
  (:func:`~adaptdl_core.policy.resize_verdict`), grows only once the room is free, and
  each resize is logged with its reason (``state.trials[id].resize_log``).
* **Interrupts**: the driver's first Ctrl-C or SIGTERM makes every running trial save at
  its next batch boundary before Tune stops it, so ``Tuner.restore`` resumes there.
* **Early stopping**: an optional base scheduler (e.g. ASHA) decides stop/continue; this
  scheduler decides resources only.
* **State**: kept in :class:`~adaptdl_ray.tune.scheduler_state.SchedulerState` and written
  to the experiment directory, so it survives ``Tuner.restore``.
"""

from __future__ import annotations

import json
import logging
import math
import time
from typing import Any, Callable, Mapping

import numpy as np
import ray
from ray.tune.experiment import Trial
from ray.tune.schedulers import FIFOScheduler, TrialScheduler

from adaptdl_core.policy import (DEFAULT_RESTART_COST_S, MIN_COST_MULTIPLES, NodeInfo,
                                 PolluxPolicy, resize_verdict)
from adaptdl_ray.tune import checkpoint_files, control
from adaptdl_ray.tune.allocation import job_info
from adaptdl_ray.tune.interrupts import InterruptRelay
from adaptdl_ray.tune.resources import (cluster_capacity, cluster_nodes, num_replicas_of,
                                        placement_group_factory, replicas_fitting)
from adaptdl_ray.tune.results import METRIC_PREFIX
from adaptdl_ray.tune.scheduler_state import SchedulerState, TrialRecord
from adaptdl_ray.tune.trainable import replica_spec_of, stop_timeout_of

LOG = logging.getLogger(__name__)

__all__ = ["AdaptDLScheduler"]

# choose_trial_to_run runs thousands of times a second when Tune is idle: re-divide the
# cluster from there at most this often.
_MIN_CHECK_INTERVAL_S = 0.2
# Hints change with every result; write the state out at most this often.
_SAVE_INTERVAL_S = 5.0
# How long the cluster's node list is reused between allocations.
_NODES_TTL_S = 5.0
# On an interrupt, time for writing the trials' state on top of their stop timeouts.
_INTERRUPT_MARGIN_S = 30.0


class AdaptDLScheduler(TrialScheduler):
    """Allocates replicas to AdaptDL trials to maximise the fairness-weighted goodput.

    Args:
        base_scheduler: decides when trials stop (a ``TrialScheduler`` instance such as
            ``ASHAScheduler()``); default FIFO.
        allocation_interval_s: seconds between periodic re-allocations (finite, ``> 0``).
        p: power-mean exponent of the policy's objective (-1: fair, the default; 1: sum).
        nodes_fn: returns the cluster as ``{node id: NodeInfo}``; default: the alive Ray
            nodes (tests pass a fixed cluster).
        policy: an allocation policy with ``allocate(jobs, nodes, base, now=...)`` such as
            a configured :class:`~adaptdl_core.policy.PolluxPolicy` (overrides ``p``).
        hints_fn: returns the latest scheduler hints of the given trial ids as
            ``{trial id: hints dict}``; default: what the trials posted to the experiment's
            control actor (tests and other front-ends pass their own).
        resize_rule: decides whether a resize the policy proposes for a running trial pays,
            called with :func:`~adaptdl_core.policy.resize_verdict`'s keyword arguments and
            returning a :class:`~adaptdl_core.policy.ResizeVerdict`; default
            ``resize_verdict`` (benchmarks of the resize mechanism pass one that always
            resizes).

    Raises:
        TypeError: for an argument of the wrong kind (e.g. ``base_scheduler='asha'``);
            from ``on_trial_add``, for a trainable not made by ``AdaptDLTrainableCreator``.
        ValueError: for a non-finite or non-positive interval or a non-finite ``p``.
    """

    def __init__(self, base_scheduler: TrialScheduler | None = None, *,
                 allocation_interval_s: float = 30.0, p: float = -1.0,
                 nodes_fn: Callable[[], dict[Any, NodeInfo]] | None = None,
                 policy: Any = None,
                 hints_fn: Callable[[list[str]], Mapping[str, dict]] | None = None,
                 resize_rule: Callable[..., Any] | None = None) -> None:
        if base_scheduler is not None and not isinstance(base_scheduler, TrialScheduler):
            raise TypeError(f"base_scheduler must be a ray.tune TrialScheduler instance such as "
                            f"ASHAScheduler(), got {base_scheduler!r}")
        if isinstance(allocation_interval_s, bool) or not isinstance(
                allocation_interval_s, (int, float)) or not math.isfinite(
                allocation_interval_s) or allocation_interval_s <= 0:
            raise ValueError(f"allocation_interval_s must be a finite number of seconds > 0, "
                             f"got {allocation_interval_s!r}")
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not math.isfinite(p):
            raise ValueError(f"p must be a finite number (-1: fair, 1: total goodput), "
                             f"got {p!r}")
        if policy is not None and not callable(getattr(policy, "allocate", None)):
            raise TypeError(f"policy must be an allocation policy such as PolluxPolicy() "
                            f"(with an allocate() method), got {policy!r}")
        for name, fn in (("nodes_fn", nodes_fn), ("hints_fn", hints_fn),
                         ("resize_rule", resize_rule)):
            if fn is not None and not callable(fn):
                raise TypeError(f"{name} must be a function, got {fn!r}")
        super().__init__()
        self._base = base_scheduler or FIFOScheduler()
        self._interval = float(allocation_interval_s)
        self._policy = policy or PolluxPolicy(p)
        self._nodes_fn = nodes_fn or cluster_nodes
        self._hints_fn = hints_fn
        self._resize_rule = resize_rule or resize_verdict
        self._nodes_cache: tuple[float, dict[Any, NodeInfo]] | None = None
        self._state = SchedulerState()
        self._state_dir: str | None = None
        self._restored = False
        self._dirty = False
        self._last_check = float("-inf")
        self._last_save = 0.0
        self._queue: list[str] = []  # paused (resized) trial ids waiting to run, in order
        self._metric: str | None = None
        self._mode: str | None = None
        self._control: Any = None
        self._relay = InterruptRelay()
        self._interrupt: dict[str, Any] | None = None

    # -- configuration --------------------------------------------------------------
    def set_search_properties(self, metric: str | None, mode: str | None, **spec: Any) -> bool:
        """Remember the experiment's metric and mode and pass them to the base scheduler."""
        self._metric = metric or self._metric
        self._mode = mode or self._mode
        return self._base.set_search_properties(metric, mode, **spec)

    @property
    def metric(self) -> str | None:
        """The metric given to tune.run / TuneConfig (checked in every result), or None."""
        return self._metric

    @property
    def state(self) -> SchedulerState:
        """The scheduler's records (read-only use: per-trial history, resizes and why)."""
        return self._state

    # -- trial events ---------------------------------------------------------------
    def on_trial_add(self, tune_controller: Any, trial: Trial) -> None:
        """Register the trial (it starts when Tune finds its resources, as under FIFO).

        A trial re-added after a failure or a restore keeps its replica count if the
        cluster can hold it, else it starts again at ``min_replicas``.

        Raises:
            TypeError: the trainable was not made by AdaptDLTrainableCreator.
            ValueError: the cluster cannot hold the trial's min_replicas at all."""
        spec = replica_spec_of(trial.get_trainable_cls())
        self._hook()
        self._maybe_restore(trial)
        record = self._state.trials.get(trial.trial_id)
        if record is None:
            record = self._state.trials[trial.trial_id] = TrialRecord(created=time.time())
        self._base.on_trial_add(tune_controller, trial)
        nodes = self._nodes()
        # Raises a clear error if the cluster cannot hold the trial at all.
        job_info(spec, nodes, created=record.created, hints=None)
        if trial.status == Trial.PENDING:
            self._restore_result_files(trial)
            current = num_replicas_of(trial.placement_group_factory)
            fitting = min(current, cluster_capacity(spec, nodes))
            self._set_resources(trial, spec, spec.clamp(max(fitting, spec.min_replicas)))
            requested = num_replicas_of(trial.placement_group_factory)
            if requested != record.target:
                record.history.append([time.time(), requested])
                record.target = requested
        elif trial.status == Trial.PAUSED:
            self._enqueue(trial.trial_id)
        self._dirty = True

    def on_trial_result(self, tune_controller: Any, trial: Trial, result: dict) -> str:
        """Absorb progress and resize costs; return PAUSE when the trial's replica count
        changes and the change pays.

        Raises:
            ValueError: the experiment's metric is missing from the result."""
        self._hook()
        record = self._state.trials.get(trial.trial_id)
        if record is None:  # added before this scheduler saw it (should not happen)
            self.on_trial_add(tune_controller, trial)
            record = self._state.trials[trial.trial_id]
        if self._metric and self._metric not in result:
            shown = sorted(k for k in result if not k.startswith(METRIC_PREFIX))
            raise ValueError(f"trial {trial.trial_id} reported no {self._metric!r} (the metric "
                             f"given to tune.run/TuneConfig); it reported {shown}. Report it "
                             "with tune.report({...}) from the training function")
        if self._absorb(record, result) or time.time() - self._last_save >= _SAVE_INTERVAL_S:
            self._save()
        decision = self._base.on_trial_result(tune_controller, trial, result)
        if decision == TrialScheduler.PAUSE:
            self._announce_pause(trial)
        if decision != TrialScheduler.CONTINUE or result.get("done"):
            return decision
        self._maybe_reallocate(tune_controller)
        current = num_replicas_of(trial.placement_group_factory)
        if record.target == current:
            return TrialScheduler.CONTINUE
        verdict = self._verdict(trial, record, current)
        if not verdict.pays:
            if record.last_veto != verdict.reason:
                LOG.info("trial %s: keeping %d replicas instead of %d: %s", trial.trial_id,
                         current, record.target, verdict.reason)
                record.last_veto = verdict.reason
            return TrialScheduler.CONTINUE
        if record.target > current and not self._fits(self._free(tune_controller), trial,
                                                        record.target):
            # Grow only once the shrinking trials have freed the room; pausing now would
            # leave this trial idle while it waits.
            return TrialScheduler.CONTINUE
        LOG.info("trial %s: %d -> %d replicas (%s)", trial.trial_id, current, record.target,
                 verdict.reason)
        record.resizes += 1
        record.resize_pending = True
        record.last_veto = None
        record.resize_log.append({"time": time.time(), "from": current, "to": record.target,
                                  "reason": verdict.reason, "saved_s": verdict.saved_s,
                                  "cost_s": self._resize_cost(record)})
        self._enqueue(trial.trial_id)
        self._save()
        self._announce_pause(trial)
        return TrialScheduler.PAUSE

    def on_trial_complete(self, tune_controller: Any, trial: Trial, result: dict) -> None:
        """Free the finished trial's replicas (re-divided at the next check)."""
        self._trial_ended(trial)
        self._base.on_trial_complete(tune_controller, trial, result)

    def on_trial_remove(self, tune_controller: Any, trial: Trial) -> None:
        """Free the removed trial's replicas (re-divided at the next check)."""
        self._trial_ended(trial)
        self._base.on_trial_remove(tune_controller, trial)

    def on_trial_error(self, tune_controller: Any, trial: Trial) -> None:
        """Free the failed trial's replicas (a retried trial is added again by Tune)."""
        self._trial_ended(trial)
        self._base.on_trial_error(tune_controller, trial)

    def choose_trial_to_run(self, tune_controller: Any) -> Trial | None:
        """The next resized trial to resume (first come, first served) once it has its
        replicas' room, else the base scheduler's choice."""
        # Tune calls this on every step of its event loop: do real work at most every
        # _MIN_CHECK_INTERVAL_S (a resized trial then resumes within that delay).
        self._relay.alive()
        now = time.monotonic()
        if now - self._last_check >= _MIN_CHECK_INTERVAL_S:
            self._last_check = now
            self._hook()
            self._handle_interrupt(tune_controller)
            self._maybe_reallocate(tune_controller)
            trial = self._next_resized_trial(tune_controller)
            if trial is not None:
                return trial
        choice = self._base.choose_trial_to_run(tune_controller)
        # FIFO-like bases resume any PAUSED trial; resized ones wait for their room.
        if choice is not None and choice.trial_id in self._queue:
            return None
        return choice

    def _next_resized_trial(self, tune_controller: Any) -> Trial | None:
        """The first paused trial (first come, first served) whose new size fits."""
        if not self._queue:
            return None
        trials = {t.trial_id: t for t in tune_controller.get_trials()}
        free = self._free(tune_controller)
        for trial_id in list(self._queue):
            trial = trials.get(trial_id)
            if trial is None or trial.status in (Trial.TERMINATED, Trial.ERROR):
                self._queue.remove(trial_id)
                continue
            if trial.status != Trial.PAUSED:
                continue  # still saving before its pause
            record = self._state.trials[trial_id]
            spec = replica_spec_of(trial.get_trainable_cls())
            target = record.target or spec.min_replicas
            if not self._fits(free, trial, target):
                continue
            self._set_resources(trial, spec, target)
            self._queue.remove(trial_id)
            return trial
        return None

    def debug_string(self) -> str:
        """One line for Tune's status output: allocations, replicas in use, waiting trials."""
        live = [r for r in self._state.trials.values() if r.target > 0]
        return (f"AdaptDLScheduler: {self._state.num_allocations} allocations, "
                f"{sum(r.target for r in live)} replicas over {len(live)} trials, "
                f"{len(self._queue)} resizing; base: {self._base.debug_string()}")

    # -- internals ------------------------------------------------------------------
    def _hook(self) -> None:
        """Per-hook set-up: the interrupt relay and, under Ray, the control actor."""
        if self._control is None and ray.is_initialized():
            self._control = control.start()
            self._relay.install()

    def _announce_pause(self, trial: Trial) -> None:
        """Tell the trial that the save Tune asks for next precedes a pause, so that its
        replicas stop at the checkpoint (waited for: the save must not overtake it)."""
        if self._control is not None:
            try:
                ray.get(self._control.pausing.remote(trial.trial_id), timeout=10)
            except ray.exceptions.RayError as exc:
                LOG.warning("trial %s: could not announce its pause (%s); its replicas "
                            "train on until stopped", trial.trial_id, exc)

    def _absorb(self, record: TrialRecord, result: dict) -> bool:
        """Take the trial's restarts, resize cost and remaining time from a result; True if
        the restarts or resize cost changed (worth saving at once)."""
        before = (record.restarts, record.resize_s)
        restarts = result.get(METRIC_PREFIX + "restarts")
        if isinstance(restarts, int) and restarts != record.restarts:
            record.restarts = restarts
            resize_s = result.get(METRIC_PREFIX + "resize_s")
            if record.resize_pending and isinstance(resize_s, (int, float)) and resize_s > 0:
                # The first result after a resize this scheduler asked for: what it cost
                # (a relaunch after a failure or a restore is not a resize).
                record.resize_s = float(resize_s)
                if record.resize_log:
                    record.resize_log[-1]["measured_s"] = float(resize_s)
            record.resize_pending = False
        launch_s = result.get(METRIC_PREFIX + "launch_s")
        if isinstance(launch_s, (int, float)) and launch_s > 0:
            record.launch_s = float(launch_s)
        done, total = result.get(METRIC_PREFIX + "epochs_done"), result.get(
            METRIC_PREFIX + "epochs")
        trained_s = result.get("time_total_s")
        if all(isinstance(v, (int, float)) for v in (done, total, trained_s)) and done > 0 \
                and total > 0:
            record.remaining_s = float(trained_s) / done * max(total - done, 0)
        return (record.restarts, record.resize_s) != before

    @staticmethod
    def _resize_cost(record: TrialRecord) -> float:
        """Seconds a resize of the trial costs: its last measured resize, else its launch's
        start-up time (a relaunch costs at least that), else the policy's prior."""
        return record.resize_s or record.launch_s or DEFAULT_RESTART_COST_S

    def _verdict(self, trial: Trial, record: TrialRecord, current: int) -> Any:
        """Whether moving ``trial`` from ``current`` to ``record.target`` replicas pays."""
        speedups = None
        if record.target > current and record.remaining_s is not None:
            job = job_info(replica_spec_of(trial.get_trainable_cls()), self._nodes(),
                           created=record.created, hints=record.hints,
                           current_replicas=current)
            nodes_now = max(len(set(record.placed)), 1) if record.placed else 1
            nodes_new = max(len(set(record.nodes)), 1)
            speedups = (float(np.asarray(job.speedup_fn(nodes_now, current))),
                        float(np.asarray(job.speedup_fn(nodes_new, record.target))))
        return self._resize_rule(current=current, target=record.target,
                              remaining_s=record.remaining_s,
                              cost_s=self._resize_cost(record),
                              speedup_now=speedups[0] if speedups else None,
                              speedup_new=speedups[1] if speedups else None)

    def _trial_ended(self, trial: Trial) -> None:
        self._hook()
        record = self._state.trials.get(trial.trial_id)
        if record is not None and record.target:
            record.target = 0
            record.nodes = []
            record.history.append([time.time(), 0])
        if record is not None:
            record.resize_pending = False
        if trial.trial_id in self._queue:
            self._queue.remove(trial.trial_id)
        if self._control is not None:
            self._control.forget.remote(trial.trial_id)
        self._dirty = True
        self._save()

    def _enqueue(self, trial_id: str) -> None:
        if trial_id not in self._queue:
            self._queue.append(trial_id)

    def _set_resources(self, trial: Trial, spec: Any, replicas: int) -> None:
        if num_replicas_of(trial.placement_group_factory) != replicas:
            trial.update_resources(placement_group_factory(spec, replicas))

    def _maybe_reallocate(self, tune_controller: Any) -> None:
        if self._dirty or time.time() - self._state.last_allocation >= self._interval:
            self._reallocate(tune_controller, reason="trials added or ended" if self._dirty
                             else "interval")

    def _live_trials(self, tune_controller: Any) -> list[Trial]:
        return [t for t in tune_controller.get_trials()
                if t.status in (Trial.PENDING, Trial.RUNNING, Trial.PAUSED)
                and t.trial_id in self._state.trials]

    def _refresh_hints(self, trial_ids: list[str]) -> None:
        """Pull the trials' latest scheduler hints (posted by the trials, not in results)."""
        if not trial_ids:
            return
        try:
            if self._hints_fn is not None:
                fresh = dict(self._hints_fn(trial_ids))
            elif self._control is not None:
                fresh = {k: json.loads(v) for k, v in ray.get(
                    self._control.get_hints.remote(trial_ids), timeout=10).items()}
            else:
                return
        except (ray.exceptions.RayError, ValueError) as exc:
            LOG.warning("could not read the trials' scheduler hints (%s); using the last ones",
                        exc)
            return
        for trial_id, hints in fresh.items():
            if trial_id in self._state.trials and hints:
                self._state.trials[trial_id].hints = hints

    def _reallocate(self, tune_controller: Any, reason: str) -> None:
        self._dirty = False
        now = time.time()
        self._state.last_allocation = now
        trials = self._live_trials(tune_controller)
        if not trials:
            return
        self._refresh_hints([t.trial_id for t in trials])
        nodes = self._nodes(refresh=True)
        jobs, base = {}, {}
        for trial in trials:
            record = self._state.trials[trial.trial_id]
            # A PENDING trial holds nothing yet: Tune starts it at its request once there
            # is room (and the policy then resizes it like any other).
            current = num_replicas_of(trial.placement_group_factory) \
                if trial.status == Trial.RUNNING else 0
            spec = replica_spec_of(trial.get_trainable_cls())
            jobs[trial.trial_id] = job_info(
                spec, nodes, created=record.created, hints=record.hints,
                restarts=record.restarts, restart_cost_s=self._resize_cost(record),
                current_replicas=current)
            if current and self._finishing(record):
                # It would spend most of its remaining time on a resize: keep it as it is.
                jobs[trial.trial_id].preemptible = False
            if current:
                # Ray places bundles itself (PACK); the policy's last placement stands in
                # for the real one when its size matches.
                base[trial.trial_id] = record.nodes if len(record.nodes) == current else \
                    self._pack_guess(nodes, spec, current)
                record.placed = list(base[trial.trial_id])
        result = self._policy.allocate(jobs, nodes, base, now=now)
        self._state.num_allocations += 1
        changes = []
        for trial_id, placement in result.allocations.items():
            record = self._state.trials[trial_id]
            if len(placement) != record.target:
                changes.append(f"{trial_id}: {record.target}->{len(placement)}")
                record.history.append([now, len(placement)])
            record.target = len(placement)
            record.nodes = list(placement)
        LOG.info("allocation #%d (%s) in %.0f ms: %s", self._state.num_allocations, reason,
                 1e3 * result.solve_time_s, ", ".join(changes) or "no change")
        self._save()

    def _finishing(self, record: TrialRecord) -> bool:
        """Less training left than the resize rule allows (see resize_verdict)."""
        return record.remaining_s is not None and \
            record.remaining_s < MIN_COST_MULTIPLES * self._resize_cost(record)

    @staticmethod
    def _pack_guess(nodes: dict[Any, NodeInfo], spec: Any, count: int) -> list:
        placement: list = []
        for key, node in nodes.items():
            placement += [key] * min(replicas_fitting(spec.resources, node),
                                     count - len(placement))
        return placement

    def _nodes(self, refresh: bool = False) -> dict[Any, NodeInfo]:
        """The cluster, re-read at most every _NODES_TTL_S (``ray.nodes()`` is an RPC)."""
        now = time.monotonic()
        if refresh or self._nodes_cache is None or now - self._nodes_cache[0] > _NODES_TTL_S:
            self._nodes_cache = (now, self._nodes_fn())
        return self._nodes_cache[1]

    def _free(self, tune_controller: Any) -> dict[str, float]:
        """Resources the running and starting trials leave free (aggregate over nodes)."""
        free: dict[str, float] = {}
        for node in self._nodes().values():
            for k, v in node.resources.items():
                free[k] = free.get(k, 0.0) + v
        for trial in tune_controller.get_trials():
            if trial.status in (Trial.RUNNING, Trial.PENDING):
                for k, v in trial.placement_group_factory.required_resources.items():
                    free[k] = free.get(k, 0.0) - v
        return free

    @staticmethod
    def _fits(free: dict[str, float], trial: Trial, replicas: int) -> bool:
        """Whether ``trial`` could hold ``replicas`` replicas given ``free`` (from
        :meth:`_free`; what the trial holds itself counts as available to it)."""
        own = trial.placement_group_factory.required_resources \
            if trial.status in (Trial.RUNNING, Trial.PENDING) else {}
        spec = replica_spec_of(trial.get_trainable_cls())
        return all(free.get(k, 0.0) + own.get(k, 0.0) + 1e-9 >= v * replicas
                   for k, v in spec.resources.items())

    # -- interrupts -----------------------------------------------------------------
    def _handle_interrupt(self, tune_controller: Any) -> None:
        """After the driver's first Ctrl-C/SIGTERM: have the running trials save, then let
        Tune stop the run (see :mod:`.interrupts`)."""
        if self._relay.requested_at is None:
            return
        running = {t.trial_id: t for t in tune_controller.get_trials()
                   if t.status == Trial.RUNNING}
        if self._interrupt is None:
            timeouts = [stop_timeout_of(t.get_trainable_cls()) for t in running.values()]
            self._interrupt = {"expect": set(running), "deadline": time.monotonic() +
                               max(timeouts, default=0.0) + _INTERRUPT_MARGIN_S}
            if self._control is not None:
                self._control.interrupt.remote()
            LOG.warning("saving %d running trial(s) before stopping", len(running))
        waiting = {t for t in self._interrupt["expect"]
                   if t in running and not running[t].is_saving}
        if waiting and self._control is not None:
            waiting -= set(ray.get(self._control.acks.remote(), timeout=10))
        if waiting and time.monotonic() < self._interrupt["deadline"]:
            return
        if waiting:
            LOG.warning("trials %s did not save in time; stopping anyway", sorted(waiting))
        self._save()
        self._relay.release()

    # -- persistence ----------------------------------------------------------------
    @staticmethod
    def _restore_result_files(trial: Trial) -> None:
        """A trial resuming from the state it saved on an interrupt (and from no Tune
        checkpoint) continues its progress.csv, which Tune would start afresh."""
        storage = getattr(trial, "storage", None)
        if storage is None or trial.checkpoint is not None:
            return
        try:
            local, remote = trial.local_path, trial.path
        except RuntimeError:  # a new trial: it has no directory yet
            return
        if not local:
            return
        try:
            if checkpoint_files.has_interrupted(storage.storage_filesystem, remote):
                checkpoint_files.restore_result_files(storage.storage_filesystem, remote,
                                                      local)
        except OSError as exc:
            LOG.warning("trial %s: could not restore its result files: %s", trial.trial_id,
                        exc)


    def _maybe_restore(self, trial: Trial) -> None:
        if self._state_dir is None:
            storage = getattr(trial, "storage", None)
            self._state_dir = getattr(storage, "experiment_driver_staging_path", None)
        if self._restored or self._state_dir is None:
            return
        self._restored = True
        try:
            saved = SchedulerState.load(self._state_dir)
        except (OSError, ValueError) as exc:
            LOG.warning("could not read the saved scheduler state (%s); starting afresh", exc)
            return
        if saved is not None:
            LOG.info("restored AdaptDLScheduler state: %d trials", len(saved.trials))
            self._state = saved
            self._dirty = True

    def _save(self) -> None:
        self._last_save = time.time()
        if self._state_dir is None:
            return
        try:
            self._state.save(self._state_dir)
        except OSError as exc:
            LOG.warning("could not save the scheduler state to %s: %s", self._state_dir, exc)

