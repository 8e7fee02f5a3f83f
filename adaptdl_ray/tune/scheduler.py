"""AdaptDLScheduler: re-divides the cluster among AdaptDL trials with the Pollux policy.

Tune bookkeeping only; the decisions come from :class:`adaptdl_core.policy.PolluxPolicy`.

* **When**: the allocation is recomputed when a trial is added or ends, and otherwise at
  most every ``allocation_interval_s`` seconds (checked when a result arrives or Tune asks
  which paused trial to run), never once per result.
* **Resize**: a running trial whose replica count changes is paused at its next result
  (its trainable checkpoints at the next batch boundary), its placement group request is
  updated while it is paused, and it is resumed with the new count.
* **Admission**: a new trial the policy gives no replicas waits PAUSED; waiting and resized
  trials are resumed first-come first-served as soon as the policy gives them replicas, so
  new trials cannot starve resized ones.
* **Early stopping**: an optional base scheduler (e.g. ASHA) decides stop/continue; this
  scheduler decides resources only.
* **State**: kept in :class:`~adaptdl_ray.tune.scheduler_state.SchedulerState` and written
  to the experiment directory, so it survives ``Tuner.restore``.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any, Callable

from ray.tune.experiment import Trial
from ray.tune.schedulers import FIFOScheduler, TrialScheduler

from adaptdl_core.policy import DEFAULT_RESTART_COST_S, NodeInfo, PolluxPolicy
from adaptdl_ray.tune.allocation import job_info
from adaptdl_ray.tune.resources import (cluster_nodes, num_replicas_of,
                                        placement_group_factory, replicas_fitting)
from adaptdl_ray.tune.scheduler_state import SchedulerState, TrialRecord
from adaptdl_ray.tune.trainable import replica_spec_of
from adaptdl_ray.tune.worker import HINTS_KEY, METRIC_PREFIX

LOG = logging.getLogger(__name__)

__all__ = ["AdaptDLScheduler"]

# choose_trial_to_run runs thousands of times a second when Tune is idle: re-divide the
# cluster from there at most this often.
_MIN_CHECK_INTERVAL_S = 0.2
# Hints change with every result; write them out at most this often.
_SAVE_INTERVAL_S = 5.0
# New trials are released this long after the latest addition, so that a searcher's
# burst of trials is divided up once rather than trial by trial.
_SETTLE_S = 0.25
# A running trial with less than this many resize costs of training left is not resized.
_FINISHING_RESIZE_COSTS = 2.0
# How long the cluster's node list is reused between allocations.
_NODES_TTL_S = 5.0


class AdaptDLScheduler(TrialScheduler):
    """Allocates replicas to AdaptDL trials to maximise the fairness-weighted goodput.

    Args:
        base_scheduler: decides when trials stop (e.g. ``ASHAScheduler``); default FIFO.
        allocation_interval_s: seconds between periodic re-allocations (``> 0``).
        p: power-mean exponent of the policy's objective (-1: fair, the default; 1: sum).
        nodes_fn: returns the cluster as ``{node id: NodeInfo}``; default: the alive Ray
            nodes (tests pass a fixed cluster).
        policy: a configured :class:`~adaptdl_core.policy.PolluxPolicy` (overrides ``p``).

    Raises:
        ValueError: for a non-positive interval; ``TypeError`` (from ``on_trial_add``) for
            a trainable not made by ``AdaptDLTrainableCreator``.
    """

    def __init__(self, base_scheduler: TrialScheduler | None = None, *,
                 allocation_interval_s: float = 30.0, p: float = -1.0,
                 nodes_fn: Callable[[], dict[Any, NodeInfo]] | None = None,
                 policy: PolluxPolicy | None = None) -> None:
        if isinstance(allocation_interval_s, bool) or not isinstance(
                allocation_interval_s, (int, float)) or not allocation_interval_s > 0:
            raise ValueError(f"allocation_interval_s must be a number of seconds > 0, "
                             f"got {allocation_interval_s!r}")
        super().__init__()
        self._base = base_scheduler or FIFOScheduler()
        self._interval = float(allocation_interval_s)
        self._policy = policy or PolluxPolicy(p)
        self._nodes_fn = nodes_fn or cluster_nodes
        self._nodes_cache: tuple[float, dict[Any, NodeInfo]] | None = None
        self._state = SchedulerState()
        self._state_dir: str | None = None
        self._restored = False
        self._dirty = False
        self._last_check = 0.0
        self._last_save = 0.0
        self._last_add = float("-inf")
        self._queue: list[str] = []  # paused trial ids waiting to run, first come first
        self._metric: str | None = None
        self._mode: str | None = None

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
        """The scheduler's records (read-only use: per-trial history, resize counts)."""
        return self._state

    # -- trial events ---------------------------------------------------------------
    def on_trial_add(self, tune_controller: Any, trial: Trial) -> None:
        """Register the trial, re-divide the cluster and hold the trial PAUSED until it is released.

        Raises:
            TypeError: the trainable was not made by AdaptDLTrainableCreator.
            ValueError: the cluster cannot hold the trial's min_replicas at all."""
        spec = replica_spec_of(trial.get_trainable_cls())
        self._maybe_restore(trial)
        record = self._state.trials.get(trial.trial_id)
        if record is None:
            record = self._state.trials[trial.trial_id] = TrialRecord(created=time.time())
        self._base.on_trial_add(tune_controller, trial)
        # Raises a clear error if the cluster cannot hold the trial at all.
        job_info(spec, self._nodes(), created=record.created, hints=None)
        self._last_add = time.monotonic()
        if trial.status == Trial.PENDING:
            # Admission control: every new trial waits PAUSED and is released by
            # choose_trial_to_run once the burst of additions has settled, with the replica
            # count of the latest allocation and only when that fits. (A PENDING trial's
            # request cannot be changed once Tune has staged it, so setting it here would
            # fix the count before the next trial's arrival re-divides the cluster.)
            # Tune names a trial's directory only when it starts it; reporters read it.
            trial.init_local_path()
            trial.set_status(Trial.PAUSED)
            record.waiting_since = time.time()
        if trial.status == Trial.PAUSED:
            self._enqueue(trial.trial_id)
        self._reallocate(tune_controller, reason=f"trial {trial.trial_id} added")

    def on_trial_result(self, tune_controller: Any, trial: Trial, result: dict) -> str:
        """Absorb hints and resize costs; return PAUSE when the trial's replica count changes.

        Raises:
            ValueError: the experiment's metric is missing from the result."""
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
        if decision != TrialScheduler.CONTINUE:
            return decision
        self._maybe_reallocate(tune_controller)
        current = num_replicas_of(trial.placement_group_factory)
        if record.target > current and not self._fits(self._free(tune_controller), trial,
                                                        record.target):
            # Grow only once the shrinking trials have freed the room; pausing now would
            # leave this trial idle while it waits.
            return TrialScheduler.CONTINUE
        if record.target != current:
            LOG.info("trial %s: %d -> %d replicas (pausing to resize)", trial.trial_id,
                     current, record.target)
            record.resizes += 1
            self._enqueue(trial.trial_id)
            self._save()
            return TrialScheduler.PAUSE
        return TrialScheduler.CONTINUE

    def on_trial_complete(self, tune_controller: Any, trial: Trial, result: dict) -> None:
        """Free the finished trial's replicas (re-divided at the next check)."""
        self._trial_ended(trial)
        self._base.on_trial_complete(tune_controller, trial, result)

    def on_trial_remove(self, tune_controller: Any, trial: Trial) -> None:
        """Free the removed trial's replicas (re-divided at the next check)."""
        self._trial_ended(trial)
        self._base.on_trial_remove(tune_controller, trial)

    def on_trial_error(self, tune_controller: Any, trial: Trial) -> None:
        """Free the failed trial's replicas (re-divided at the next check)."""
        self._trial_ended(trial)
        self._base.on_trial_error(tune_controller, trial)

    def choose_trial_to_run(self, tune_controller: Any) -> Trial | None:
        """The next held-back or resized trial to resume (first come, first served) that
        has replicas and room, else the base scheduler's choice."""
        # Tune calls this on every step of its event loop: do real work at most every
        # _MIN_CHECK_INTERVAL_S (a waiting trial then resumes within that delay).
        now = time.monotonic()
        if now - self._last_check >= _MIN_CHECK_INTERVAL_S:
            self._last_check = now
            self._maybe_reallocate(tune_controller)
            trial = self._next_waiting_trial(tune_controller)
            if trial is not None:
                return trial
        choice = self._base.choose_trial_to_run(tune_controller)
        # FIFO-like bases resume any PAUSED trial; the ones this scheduler holds back wait
        # for their allocation.
        if choice is not None and choice.trial_id in self._queue:
            return None
        return choice

    def _next_waiting_trial(self, tune_controller: Any) -> Trial | None:
        """The first paused trial (first come, first served) that has replicas and room."""
        if not self._queue or time.monotonic() - self._last_add < _SETTLE_S:
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
            if record.target == 0 or not self._fits(free, trial, record.target):
                continue
            self._set_resources(trial, replica_spec_of(trial.get_trainable_cls()),
                                record.target)
            self._queue.remove(trial_id)
            record.waiting_since = None
            return trial
        return None

    def debug_string(self) -> str:
        """One line for Tune's status output: allocations, replicas in use, waiting trials."""
        live = [r for r in self._state.trials.values() if r.target > 0]
        return (f"AdaptDLScheduler: {self._state.num_allocations} allocations, "
                f"{sum(r.target for r in live)} replicas over {len(live)} trials, "
                f"{len(self._queue)} waiting; base: {self._base.debug_string()}")

    # -- internals ------------------------------------------------------------------
    def _absorb(self, record: TrialRecord, result: dict) -> bool:
        """Take the trial's hints, restarts and resize cost from a result; True if the
        restarts or resize cost changed (worth saving at once)."""
        before = (record.restarts, record.resize_s)
        hints = result.get(HINTS_KEY)
        if isinstance(hints, str) and hints:
            try:
                record.hints = json.loads(hints)
            except ValueError:
                LOG.warning("unreadable %s in a result; keeping the previous hints", HINTS_KEY)
        restarts = result.get(METRIC_PREFIX + "restarts")
        if isinstance(restarts, int):
            record.restarts = restarts
        resize_s = result.get(METRIC_PREFIX + "resize_s")
        if isinstance(resize_s, (int, float)) and resize_s > 0:
            record.resize_s = float(resize_s)
        done, total = result.get(METRIC_PREFIX + "epochs_done"), result.get(
            METRIC_PREFIX + "epochs")
        trained_s = result.get("time_total_s")
        if all(isinstance(v, (int, float)) for v in (done, total, trained_s)) and done > 0 \
                and total > 0:
            record.remaining_s = float(trained_s) / done * max(total - done, 0)
        return (record.restarts, record.resize_s) != before

    def _trial_ended(self, trial: Trial) -> None:
        record = self._state.trials.get(trial.trial_id)
        if record is not None and record.target:
            record.target = 0
            record.nodes = []
            record.history.append([time.time(), 0])
        if trial.trial_id in self._queue:
            self._queue.remove(trial.trial_id)
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
            self._reallocate(tune_controller, reason="interval" if not self._dirty
                             else "trial ended")

    def _live_trials(self, tune_controller: Any) -> list[Trial]:
        return [t for t in tune_controller.get_trials()
                if t.status in (Trial.PENDING, Trial.RUNNING, Trial.PAUSED)
                and t.trial_id in self._state.trials]

    def _reallocate(self, tune_controller: Any, reason: str) -> None:
        self._dirty = False
        now = time.time()
        self._state.last_allocation = now
        trials = self._live_trials(tune_controller)
        if not trials:
            return
        nodes = self._nodes(refresh=True)
        jobs, base = {}, {}
        for trial in trials:
            record = self._state.trials[trial.trial_id]
            # A released (PENDING) trial holds its request as much as a running one.
            current = num_replicas_of(trial.placement_group_factory) \
                if trial.status in (Trial.RUNNING, Trial.PENDING) else 0
            jobs[trial.trial_id] = job_info(
                replica_spec_of(trial.get_trainable_cls()), nodes, created=record.created,
                hints=record.hints, restarts=record.restarts, restart_cost_s=record.resize_s,
                current_replicas=current)
            if current and self._finishing(record):
                # A resize would cost more than the time the trial has left: keep it as is.
                jobs[trial.trial_id].preemptible = False
            if current:
                # Ray places bundles itself (PACK); the policy's last placement stands in
                # for the real one when its size matches.
                base[trial.trial_id] = record.nodes if len(record.nodes) == current else \
                    self._pack_guess(
                    nodes, jobs[trial.trial_id], current)
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

    @staticmethod
    def _finishing(record: TrialRecord) -> bool:
        cost = record.resize_s if record.resize_s else DEFAULT_RESTART_COST_S
        return record.remaining_s is not None and record.remaining_s < \
            _FINISHING_RESIZE_COSTS * cost

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

    # -- persistence ----------------------------------------------------------------
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
