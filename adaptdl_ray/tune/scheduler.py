"""AdaptDLScheduler: the Ray Tune front-end of the decision core.

Every scheduling decision (when to re-divide the cluster, how many replicas each trial
gets, whether a resize pays, which trials are left alone) is made by
:class:`adaptdl_core.decision.DecisionCore`; this class turns Tune's events into the
core's events and the core's decisions into Tune's actions, and does what only Tune
needs (pause announcements, interrupts, result files, the base scheduler):

* **Shared profiles**: by default the trials of one scheduler form one profile group
  (they train the same model with different hyper-parameters): a new trial is modelled
  with the throughput profile of the most widely profiled trial so far until its own
  covers as many replicas: Tune starts it at ``min_replicas`` as any trial, and its first
  resize goes straight to the size that profile supports instead of exploring
  1 -> 2 -> 4 replicas with a restart each (``share_profiles``).
* **Admission** is Tune's own: a new trial is PENDING at ``min_replicas`` and starts when
  its resources are free, exactly as under FIFO, so Tune's pending-trial limit and the
  searcher's concurrency keep working.
* **When**: the core re-solves when trials were added or ended (a burst of additions is
  one solve, and such solves are at least ``_MIN_EVENT_GAP_S`` apart) and otherwise every
  ``allocation_interval_s`` seconds, never once per result.
* **Resize**: a running trial whose decision is ``resize`` is paused at its next result
  (Tune checkpoints it in place), its placement group request is updated while it is
  paused, and it is resumed with the new count; it grows only once the room is free, and
  each resize is logged with its reason (``state.jobs[id].resize_log``).
* **Accelerator types**: on a cluster of several types, a trial's placement group request
  (its ``min_replicas`` base bundles; its own reservations follow it) names the type its
  decision places it on, from its first request (the scheduler solves when Tune adds a
  trial, before Tune stages it) to each relaunch. A decision naming another type than
  where the trial runs is a move: Tune cannot change a placement group in place, so the
  trial is paused at its next result (Tune checkpoints it; its actor gives its own
  reservations back) and relaunched with a request for the new type, restoring from that
  checkpoint. Trials post their replicas' node ids at each launch and the core is told
  them, so that it sees where each trial runs and does not order the same move again.
* **Draining nodes**: a running trial with replicas on a node Ray is draining (a spot
  node's preemption notice, ``ray drain-node``, the autoscaler removing it) is paused at
  its next batch boundary, without waiting for a report, and relaunched on the other
  nodes (as many replicas as they hold, at least ``min_replicas``); a pause is no failure.
* **Interrupts**: the driver's first Ctrl-C or SIGTERM makes every running trial save at
  its next batch boundary before Tune stops it, so ``Tuner.restore`` resumes there.
* **Early stopping**: an optional base scheduler (e.g. ASHA) decides stop/continue; this
  scheduler decides resources only.
* **State and solves**: driven by the core's own
  :class:`~adaptdl_core.decision.CoreDriver`, as every front-end drives it: the policy
  solves in a worker thread (a hook waits only while solves are quick, never for the
  disk), and the core's :class:`~adaptdl_core.decision.CoreState` is written to the
  experiment directory after each solve, resize, relaunch and interrupt and when the last
  trial ends (other changes at most every few seconds), so it survives ``Tuner.restore``;
  on an interrupt and when the last trial ends, the hook waits for the write.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any, Callable, Mapping

import ray
from ray.tune.experiment import Trial
from ray.tune.schedulers import FIFOScheduler, TrialScheduler

from adaptdl_core.decision import CoreDriver, CoreState, DecisionCore
from adaptdl_core.decision.driver import DEFAULT_SOLVE_WAIT_S
from adaptdl_core.decision.room import RelaunchQueue, fits, free_room
from adaptdl_core.policy import (NodeInfo, PolluxPolicy, amortised_resize_verdict,
                                 common_type)
from adaptdl_ray.cluster.sizing import JOB_RESIZE_COST_PRIOR_S as IN_PLACE_RESIZE_PRIOR_S
from adaptdl_ray.replicas.nodes import Cached, DrainWatch, cluster_nodes, free_resources
from adaptdl_ray.tune import checkpoint_files
from adaptdl_ray.tune.experiment_link import ExperimentLink
from adaptdl_ray.tune.resources import num_replicas_of, placement_group_factory, request_type
from adaptdl_ray.tune.results import check_metric
from adaptdl_ray.tune.scheduler_args import ProfileGroups, check_arguments, checked_policy
from adaptdl_ray.tune.creator import replica_spec_of, stop_timeout_of
from adaptdl_ray.tune.traps import TrapWatch
from adaptdl_ray.tune.trial_sizes import TrialSizes
from adaptdl_ray.tune.trial_replicas import remove_leftover_reservations

LOG = logging.getLogger(__name__)
# One line per resize, for users: Ray shows its "ray" logger tree at INFO by default (also
# at verbose=0) and Python shows other loggers only from WARNING, so this child of Tune's
# logger makes the lines visible at Tune's default verbosity and from run_job. Silence
# them with logging.getLogger("ray.tune.adaptdl").setLevel(logging.WARNING).

__all__ = ["AdaptDLScheduler"]

# choose_trial_to_run runs thousands of times a second when Tune is idle: do its real work
# at most this often.
_MIN_CHECK_INTERVAL_S = 0.2
# Trials arrive in bursts (a searcher's suggestions, one per event-loop step): solves that
# additions and ends trigger are this far apart, so a burst costs a few solves, not one each.
_MIN_EVENT_GAP_S = 1.0
# The solves (in the driver or the cluster allocator, on the machines that train) take at
# most this share of the time: a sweep of many short trials otherwise re-solves on every
# trial's start and end (benchmarks/many_trials.py).
_MAX_SOLVE_SHARE = 0.1
# Seconds between checks for running trials on a node Ray is draining (a preemption
# notice gives 30-120 s: a move must begin within a few seconds of it).
_DRAIN_CHECK_S = 2.0
# How long the cluster's node list is reused between allocations.
_NODES_TTL_S = 5.0
# How long Ray's count of free resources is reused (a shared cluster's room for a grow).
_FREE_TTL_S = 1.0
# When the last trial ends (the experiment may be over) or on an interrupt, a hook waits
# this long for the state file to be written.
_FINAL_FLUSH_S = 5.0
# Tune statuses of a trial that holds, or is about to hold, its replicas.
_HOLDING = (Trial.RUNNING, Trial.PENDING)


def _wall_clock() -> float:
    # Looked up at each call (not bound once), so that tests can freeze time.time.
    return time.time()


class AdaptDLScheduler(TrialScheduler):
    """Allocates replicas to AdaptDL trials to maximise the fairness-weighted goodput.

    Args:
        base_scheduler: decides when trials stop (a ``TrialScheduler`` instance such as
            ``ASHAScheduler()``); default FIFO.
        allocation_interval_s: seconds between periodic re-allocations (finite, ``> 0``).
        p: power-mean exponent of the policy's objective (-1: fair, the default; 1: sum),
            over each trial's speedup relative to its speedup at its fair share of the
            cluster (``PolluxPolicy(p, fair_share=True)``, as the simulator's Pollux).
        nodes_fn: returns the cluster as ``{node id: NodeInfo}``; default: the alive Ray
            nodes (tests pass a fixed cluster).
        policy: an allocation policy (with ``allocate(jobs, nodes, base, now=...)``, e.g. a
            configured :class:`~adaptdl_core.policy.PolluxPolicy`; overrides ``p``), or a
            name: ``"pollux"`` (default) or ``"adaptdl"`` (weighted by each trial's
            estimated remaining work, :class:`~adaptdl_core.policy.RemainingWorkPolicy`).
        hints_fn: returns ``{trial id: hints dict}`` of the given trial ids; default: what
            the trials posted to the experiment's control actor.
        resize_rule: whether a resize the policy proposes pays (called with
            :func:`~adaptdl_core.policy.resize_verdict`'s keyword arguments, returns a
            :class:`~adaptdl_core.policy.ResizeVerdict`); default
            :func:`~adaptdl_core.policy.amortised_resize_verdict` (a trial is not resized
            again before its last resize is measured and amortised).
        solve_wait_s: the policy solves in a worker thread; a hook that starts a solve
            waits at most this long for it while the previous one took no longer, else it
            answers with the standing decisions and the new ones apply at a later hook.
            ``None``: always wait, and write the state file in the hook (deterministic;
            tests and scripted benchmarks).
        share_profiles: which trials share a throughput profile (see
            :class:`~adaptdl_core.decision.JobSpec`'s ``profile_group``): ``True`` (default)
            all (a sweep of one model over hyper-parameters that barely change its step
            time); ``False`` none; the name of a config entry (``"model_size"``, ``"a/b"``
            for ``config["a"]["b"]``): trials with equal values share, those without it
            share among themselves; or a picklable function of the trial's config
            returning a hashable group key (``None``: no sharing).
        resize_cost_prior_s: seconds a resize is assumed to cost until one in the trial's
            profile group is measured (raised to the longest start-up measured; default 5 s:
            a trial resizes in place; ``benchmarks/resize_cost.py`` measures it). Young
            trials, and trials with less than twice this left, are not moved.
        cluster_allocator: share the Ray cluster with every other AdaptDL experiment and
            job on it through the cluster allocator (started on first use; its policy
            decides, and this scheduler's only while it cannot be reached, with a warning).
            ``False``: decide alone over the whole cluster. ``None`` (default): share when
            on Ray with the default ``nodes_fn`` and no policy object of its own.

    Raises:
        TypeError: for an argument of the wrong kind (e.g. ``base_scheduler='asha'``);
            from ``on_trial_add``, for a trainable not made by ``AdaptDLTrainableCreator``.
        ValueError: for an unknown ``policy`` name, a non-finite or non-positive interval or
            ``resize_cost_prior_s``, a non-finite ``p``, a negative ``solve_wait_s`` or an
            empty ``share_profiles`` name.
    """

    def __init__(self, base_scheduler: TrialScheduler | None = None, *,
                 allocation_interval_s: float = 30.0, p: float = -1.0,
                 nodes_fn: Callable[[], dict[Any, NodeInfo]] | None = None,
                 policy: Any = None,
                 hints_fn: Callable[[list[str]], Mapping[str, dict]] | None = None,
                 resize_rule: Callable[..., Any] | None = None,
                 solve_wait_s: float | None = DEFAULT_SOLVE_WAIT_S,
                 share_profiles: bool | str | Callable[[dict], Any] = True,
                 cluster_allocator: bool | None = None,
                 resize_cost_prior_s: float = IN_PLACE_RESIZE_PRIOR_S) -> None:
        check_arguments(base_scheduler=base_scheduler,
                        allocation_interval_s=allocation_interval_s, p=p,
                        solve_wait_s=solve_wait_s, cluster_allocator=cluster_allocator,
                        share_profiles=share_profiles, functions={
                            "nodes_fn": nodes_fn, "hints_fn": hints_fn,
                            "resize_rule": resize_rule})
        super().__init__()
        own_policy = policy is not None and not isinstance(policy, str)
        self._base = base_scheduler or FIFOScheduler()
        self._core = DecisionCore(checked_policy(policy, p) or PolluxPolicy(p, fair_share=True),
                                  clock=_wall_clock, interval_s=float(allocation_interval_s),
                                  resize_rule=resize_rule or amortised_resize_verdict,
                                  min_event_gap_s=_MIN_EVENT_GAP_S,
                                  max_solve_share=_MAX_SOLVE_SHARE,
                                  resize_cost_prior_s=resize_cost_prior_s)
        self._driver = CoreDriver(self._core, solve_wait_s=solve_wait_s)
        self._sizes = TrialSizes(self._core, self._driver, hints_fn)
        self._nodes = Cached(nodes_fn or cluster_nodes, _NODES_TTL_S)
        self._cluster_free = Cached(free_resources, _FREE_TTL_S)
        self._profile_groups = ProfileGroups(share_profiles)
        self._link = ExperimentLink(
            self._sizes, self._driver, policy_name=policy if isinstance(policy, str)
            else "pollux", share_cluster=cluster_allocator if cluster_allocator is not None
            else nodes_fn is None and not own_policy)
        self._traps = TrapWatch(allocation_interval_s)
        self._relaunches = RelaunchQueue()  # paused trials to relaunch (drain or type moves)
        # Each trial's trainable class: Tune's Trial.get_trainable_cls() asks Ray's GCS and
        # unpickles the class on every call (milliseconds, on every result).
        self._trainables: dict[str, Any] = {}
        self._metric: str | None = None
        self._last_check = float("-inf")
        self._drains = DrainWatch(_DRAIN_CHECK_S)

    def __getstate__(self) -> dict:
        # Tune pickles its configuration (with this scheduler) before the run; a worker
        # thread and a solve in flight do not travel (the driver leaves its thread behind
        # itself), nor does an interrupt (see ExperimentLink).
        return dict(self.__dict__, _trainables={})

    def _trainable(self, trial: Trial) -> Any:
        """``trial.get_trainable_cls()``, asked of Tune once per trial."""
        cls = self._trainables.get(trial.trial_id)
        if cls is None:
            cls = self._trainables[trial.trial_id] = trial.get_trainable_cls()
        return cls

    # -- configuration --------------------------------------------------------------
    def set_search_properties(self, metric: str | None, mode: str | None, **spec: Any) -> bool:
        """Remember the experiment's metric and mode and pass them to the base scheduler."""
        self._metric = metric or self._metric
        return self._base.set_search_properties(metric, mode, **spec)

    @property
    def metric(self) -> str | None:
        """The metric given to tune.run / TuneConfig (checked in every result), or None."""
        return self._metric

    @property
    def state(self) -> CoreState:
        """The scheduler's records (read-only use: per-trial history, resizes and why)."""
        return self._core.state

    @property
    def core(self) -> DecisionCore:
        """The decision core this scheduler drives (read-only use)."""
        return self._core

    @property
    def driver(self) -> CoreDriver:
        """How this scheduler drives its core (solves, state writes; read-only use)."""
        return self._driver

    def flush_state(self, timeout: float | None = None) -> bool:
        """Wait until the state snapshots taken so far are in the experiment directory
        (at most ``timeout`` seconds; ``None``: as long as it takes). Returns ``True`` if
        nothing is left to write. Tune does not need this; a script reading the state
        file while the experiment runs may."""
        return self._driver.flush(timeout)

    # -- trial events ---------------------------------------------------------------
    def on_trial_add(self, tune_controller: Any, trial: Trial) -> None:
        """Register the trial (it starts when Tune finds its resources, as under FIFO).

        A trial re-added after a failure or a restore keeps its replica count if the
        cluster can hold it, else it starts again at ``min_replicas``.

        Raises:
            TypeError: the trainable was not made by AdaptDLTrainableCreator.
            ValueError: the cluster cannot hold the trial's min_replicas at all."""
        spec = replica_spec_of(self._trainable(trial))
        group = self._profile_groups.of(trial.trial_id, getattr(trial, "config", None))
        if group is not None:
            spec = dataclasses.replace(spec, profile_group=group)
        self._link.hook()
        restored = self._link.attach(getattr(trial, "storage", None))
        if restored is not None:
            LOG.info("restored AdaptDLScheduler state: %d trials", restored)
        nodes = self._nodes.get()
        self._core.set_nodes(nodes)
        requested = spec.fitted(self._sizes.target_of(trial.trial_id) or 1, nodes) \
            if trial.status == Trial.PENDING else None
        # (first: the core raises the clear error for a trial the cluster never holds)
        self._core.add_job(trial.trial_id, spec, replicas=requested, name=str(trial))
        self._base.on_trial_add(tune_controller, trial)
        if requested is not None:
            checkpoint_files.restore_result_files_of(trial)
            self._sizes.place_first(trial.trial_id)
            self._set_resources(trial, spec, requested)
        elif trial.status == Trial.PAUSED:
            self._relaunches.add(trial.trial_id)
        self._driver.save_soon()

    def on_trial_result(self, tune_controller: Any, trial: Trial, result: dict) -> str:
        """Pass progress and resize costs to the core; return PAUSE when the core decides
        to resize the trial and its new room is free.

        Raises:
            ValueError: the experiment's metric is missing from the result."""
        self._link.hook()
        record = self._core.state.jobs.get(trial.trial_id)
        if record is None or not record.live:  # added before this scheduler saw it
            self.on_trial_add(tune_controller, trial)
        check_metric(trial.trial_id, self._metric, result)
        spec = replica_spec_of(self._trainable(trial))
        trap = self._traps.result(trial.trial_id, result, resizable=spec.max_replicas is None
                                  or spec.max_replicas > spec.min_replicas)
        if trap:
            LOG.warning(trap)
        current, changed = self._sizes.reported(trial.trial_id, result,
                                                num_replicas_of(trial.placement_group_factory))
        # (a relaunch happened, rarely: its measured cost is worth keeping at once)
        self._driver.save() if changed else self._driver.save_if_due()
        decision = self._base.on_trial_result(tune_controller, trial, result)
        if decision == TrialScheduler.PAUSE:
            self._traps.forget(trial.trial_id)
            self._link.announce_pause(trial.trial_id)
        if decision != TrialScheduler.CONTINUE or result.get("done"):
            return decision
        if self._link.interrupts.requested:
            return decision  # interrupted: the trial saves where it is, no resize begins
        if trial.trial_id in self._relaunches:
            return decision  # already pausing (moving off a draining node)
        self._maybe_decide(tune_controller)
        kind = request_type(trial.placement_group_factory)
        move = self._sizes.resize(trial.trial_id, current, lambda replicas: self._fits(
            self._free(tune_controller, kind), trial, replicas), kind)
        if move is not None:  # to another accelerator type: relaunched with its request
            self._sizes.move_type(trial.trial_id, current, move)
            return self._pause_to_relaunch(trial.trial_id, move.replicas)
        return TrialScheduler.CONTINUE

    def _pause_to_relaunch(self, trial_id: str, replicas: int) -> str:
        """Queue the pausing trial to relaunch on ``replicas``; announce it. Returns PAUSE."""
        self._relaunches.add(trial_id, replicas)
        self._traps.forget(trial_id)
        self._link.announce_pause(trial_id)
        return TrialScheduler.PAUSE

    def on_trial_complete(self, tune_controller: Any, trial: Trial, result: dict) -> None:
        """Free the finished trial's replicas (re-divided at the next check). Its last
        result (which Tune passes here, not to on_trial_result) still counts: a resize
        whose first result is the trial's last is measured too."""
        record = self._core.state.jobs.get(trial.trial_id)
        if result and record is not None and record.live:
            self._sizes.progress(trial.trial_id, result)
        self._trial_ended(trial, "finished")
        self._base.on_trial_complete(tune_controller, trial, result)

    def on_trial_remove(self, tune_controller: Any, trial: Trial) -> None:
        """Free the removed trial's replicas (re-divided at the next check)."""
        self._trial_ended(trial, "stopped")
        self._base.on_trial_remove(tune_controller, trial)

    def on_trial_error(self, tune_controller: Any, trial: Trial) -> None:
        """Free the failed trial's replicas (a retried trial is added again by Tune)."""
        self._trial_ended(trial, "failed")
        self._base.on_trial_error(tune_controller, trial)

    def choose_trial_to_run(self, tune_controller: Any) -> Trial | None:
        """The next resized trial to resume (first come, first served) once it has its
        replicas' room, else the base scheduler's choice."""
        # Tune calls this on every step of its event loop: do real work at most every
        # _MIN_CHECK_INTERVAL_S (a resized trial then resumes within that delay).
        self._link.interrupts.relay.alive()
        self._driver.collect(0.0)
        now = time.monotonic()
        if now - self._last_check >= _MIN_CHECK_INTERVAL_S:
            self._last_check = now
            self._link.hook()
            self._handle_interrupt(tune_controller)
            if not self._link.interrupts.requested:
                self._maybe_decide(tune_controller)
                self._driver.save_if_due()
                self._check_traps(tune_controller)
                self._move_off_draining(tune_controller)
                trial = self._next_resized_trial(tune_controller)
                if trial is not None:
                    return trial
        if self._link.interrupts.requested:
            # Interrupted: no trial starts or resumes (it would only be stopped again,
            # and a start begun now could outlive the run's stop).
            return None
        choice = self._base.choose_trial_to_run(tune_controller)
        # FIFO-like bases resume any PAUSED trial; resized ones wait for their room.
        if choice is not None and choice.trial_id in self._relaunches:
            return None
        return choice

    def _check_traps(self, tune_controller: Any) -> None:
        """Name a running trial that the policy would resize but that does not report."""
        trials = self._core.state.jobs
        running = [(t.trial_id, trials[t.trial_id].target, self._held(t))
                   for t in tune_controller.get_trials()
                   if t.status == Trial.RUNNING and t.trial_id in trials
                   and trials[t.trial_id].live]
        trap = self._traps.check(running)
        if trap:
            LOG.warning(trap)

    def _move_off_draining(self, tune_controller: Any) -> None:
        """Pause each running trial with a replica on a node Ray is draining (its replicas
        stop at their next batch boundary, Tune keeps the checkpoint) and queue it to
        relaunch on the other nodes, with as many replicas as they hold (at least
        ``min_replicas``)."""
        running = {t.trial_id: t for t in tune_controller.get_trials()
                   if t.status == Trial.RUNNING and t.trial_id not in self._relaunches
                   and getattr(self._core.state.jobs.get(t.trial_id), "live", False)}
        if self._sizes.control is None or not running:
            return
        moves = self._drains.check(lambda: self._sizes.launch_nodes(list(running)))
        if not moves:
            return
        nodes = self._nodes.get(refresh=True)  # without the draining ones
        self._core.set_nodes(nodes)
        for trial_id, _, reason in moves:
            trial = running[trial_id]
            current = self._sizes.launch_size(trial_id) or self._held(trial)
            target = replica_spec_of(self._trainable(trial)).fitted(current, nodes)
            self._sizes.move(trial_id, current, target, reason)
            self._pause_to_relaunch(trial_id, target)
            tune_controller.pause_trial(trial)

    def _next_resized_trial(self, tune_controller: Any) -> Trial | None:
        """The first paused trial (first come, first served) whose new size fits."""
        if not len(self._relaunches):
            return None
        trials = {t.trial_id: t for t in tune_controller.get_trials()}
        rooms: dict[str | None, dict[str, float]] = {}  # the free room on each type asked

        def ready(trial_id: str, size: int | None) -> bool | None:
            trial = trials.get(trial_id)
            if trial is None or trial.status in (Trial.TERMINATED, Trial.ERROR):
                return None
            if trial.status != Trial.PAUSED:
                return False  # still saving before its pause
            spec = replica_spec_of(self._trainable(trial))
            target = size or self._core.state.jobs[trial_id].target or spec.min_replicas
            kind = self._sizes.decided_type(trial_id)  # (what its request will name)
            if kind not in rooms:
                rooms[kind] = self._free(tune_controller, kind)
            if not self._fits(rooms[kind], trial, target):
                return False
            self._set_resources(trial, spec, target)
            return True

        chosen = self._relaunches.next(ready)
        return trials[chosen] if chosen is not None else None

    def debug_string(self) -> str:
        """One line for Tune's status output: allocations, replicas in use, waiting trials."""
        return (f"AdaptDLScheduler: {self._sizes.summary()}, {len(self._relaunches)} "
                f"relaunching; base: {self._base.debug_string()}")

    # -- internals ------------------------------------------------------------------
    def _trial_ended(self, trial: Trial, outcome: str) -> None:
        self._link.hook()
        self._traps.forget(trial.trial_id)
        self._relaunches.drop(trial.trial_id)
        self._trainables.pop(trial.trial_id, None)
        if ray.is_initialized():  # (a trial actor that died gave back nothing of its own)
            remove_leftover_reservations(trial.trial_id)
        if self._sizes.ended(trial.trial_id, outcome):
            # The experiment may be over: nothing is left to flush it later, and the
            # driver may read or upload the file next.
            self._link.last_write(_FINAL_FLUSH_S)

    def _set_resources(self, trial: Trial, spec: Any, replicas: int) -> None:
        """A (not running) trial's start: its placement group holds its minimum (so that
        Tune admits it once that fits) on the accelerator type its decision names, and it
        grows to ``replicas`` in place."""
        kind = self._sizes.decided_type(trial.trial_id)
        pgf = trial.placement_group_factory
        if num_replicas_of(pgf) != spec.min_replicas or request_type(pgf) != kind:
            trial.update_resources(placement_group_factory(spec, spec.min_replicas, kind))
        self._link.hook()
        self._sizes.tell(trial.trial_id, replicas)

    def target_of(self, trial_id: str) -> int | None:
        """The replicas this scheduler last told the trial to run on (``None``: none)."""
        return self._sizes.target_of(trial_id)

    def _held(self, trial: Trial) -> int:
        """The replicas a trial runs on now (its placement group holds its minimum)."""
        return self._sizes.held(trial.trial_id, num_replicas_of(trial.placement_group_factory))

    def _maybe_decide(self, tune_controller: Any) -> None:
        """Have the core re-solve when it is due (see :meth:`TrialSizes.decide`)."""
        self._sizes.decide(lambda: [
            (t.trial_id, t.status == Trial.RUNNING, self._held(t))
            for t in tune_controller.get_trials()
            if t.status in (Trial.PENDING, Trial.RUNNING, Trial.PAUSED)],
            lambda: self._nodes.get(refresh=True))

    def _free(self, tune_controller: Any, kind: str | None = None) -> dict[str, float]:
        """Resources the running and starting trials leave free (see
        :func:`~adaptdl_core.decision.room.free_room`), on the nodes of accelerator type
        ``kind`` if given (``None``: every node). When the cluster is shared, what other
        experiments, jobs and other work hold is not free either."""
        holdings = [(replica_spec_of(self._trainable(t)).resources, self._held(t),
                     t.status == Trial.PENDING,
                     self._held_type(t) if kind is not None else None)
                    for t in tune_controller.get_trials() if t.status in _HOLDING]
        return free_room(self._nodes.get(), holdings, accelerator_type=kind,
                         cluster_free=self._cluster_free.get()
                         if self._link.allocator is not None else None)

    def _held_type(self, trial: Trial) -> str | None:
        """The accelerator type a trial's replicas are on: its request's, else that of
        the nodes the core last heard it runs on (``None``: not known, or no type)."""
        kind = request_type(trial.placement_group_factory)
        if kind is None:
            record = self._core.state.jobs.get(trial.trial_id)
            if record is not None and record.placed_known:
                kind = common_type(self._nodes.get(), record.placed)
        return kind

    def _fits(self, free: dict[str, float], trial: Trial, replicas: int) -> bool:
        """Whether ``trial`` could hold ``replicas`` replicas given ``free``."""
        return fits(free, replica_spec_of(self._trainable(trial)).resources,
                    self._held(trial) if trial.status in _HOLDING else 0, replicas)

    # -- interrupts -----------------------------------------------------------------
    def _handle_interrupt(self, tune_controller: Any) -> None:
        """After the driver's first Ctrl-C/SIGTERM: have the running trials save, then let
        Tune stop the run (see :mod:`.interrupts`)."""
        if not self._link.interrupts.requested:
            return
        trials = tune_controller.get_trials()
        live = [t for t in trials if t.status in _HOLDING or t.is_saving]
        if self._link.interrupts.step([(t.trial_id, t.status, t.is_saving) for t in trials],
                                 max((stop_timeout_of(self._trainable(t)) for t in live),
                                     default=0.0), self._sizes.control):
            self._link.last_write(_FINAL_FLUSH_S)
            self._link.interrupts.release()
