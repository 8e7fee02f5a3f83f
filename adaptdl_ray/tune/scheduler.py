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
import json
import logging
import math
import time
from typing import Any, Callable, Mapping

import ray
from ray.tune.experiment import Trial
from ray.tune.schedulers import FIFOScheduler, TrialScheduler

from adaptdl_core.decision import (CoreDriver, CoreState, DecisionCore, JobProgress,
                                   cluster_capacity, estimate_remaining_s, job_info)
from adaptdl_core.decision.driver import DEFAULT_SOLVE_WAIT_S
from adaptdl_core.decision.resize_cost import describe_resize
from adaptdl_core.policy import (NodeInfo, PolluxPolicy, amortised_resize_verdict,
                                 policy_by_name)
from adaptdl_ray.cluster.client import AllocatorSolver, new_member_id
from adaptdl_ray.cluster.sizing import JOB_RESIZE_COST_PRIOR_S as IN_PLACE_RESIZE_PRIOR_S
from adaptdl_ray.replicas import _ray_private
from adaptdl_ray.tune import checkpoint_files, control
from adaptdl_ray.tune.interrupts import InterruptRelay, unsaved_trials
from adaptdl_ray.replicas.nodes import cluster_nodes, draining_under, replicas_to_move
from adaptdl_ray.tune.resources import num_replicas_of, placement_group_factory
from adaptdl_ray.tune.results import METRIC_PREFIX
from adaptdl_ray.tune.trainable import replica_spec_of, stop_timeout_of
from adaptdl_ray.tune.traps import TrapWatch
from adaptdl_ray.tune.trial_replicas import remove_leftover_reservations

LOG = logging.getLogger(__name__)
# One line per resize, for users: Ray shows its "ray" logger tree at INFO by default (also
# at verbose=0) and Python shows other loggers only from WARNING, so this child of Tune's
# logger makes the lines visible at Tune's default verbosity and from run_job. Silence
# them with logging.getLogger("ray.tune.adaptdl").setLevel(logging.WARNING).
RESIZE_LOG = logging.getLogger("ray.tune.adaptdl")

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
# On an interrupt, time for writing the trials' state on top of their stop timeouts.
_INTERRUPT_MARGIN_S = 30.0
# When the last trial ends (the experiment may be over) or on an interrupt, a hook waits
# this long for the state file to be written.
_FINAL_FLUSH_S = 5.0


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
        policy: an allocation policy with ``allocate(jobs, nodes, base, now=...)`` such as
            a configured :class:`~adaptdl_core.policy.PolluxPolicy` (overrides ``p``), or
            a name: ``"pollux"`` (the default) or ``"adaptdl"`` (Pollux weighted by each
            trial's estimated remaining work, :class:`~adaptdl_core.policy.RemainingWorkPolicy`).
        hints_fn: returns the latest scheduler hints of the given trial ids as
            ``{trial id: hints dict}``; default: what the trials posted to the experiment's
            control actor (tests and other front-ends pass their own).
        resize_rule: decides whether a resize the policy proposes for a running trial pays,
            called with :func:`~adaptdl_core.policy.resize_verdict`'s keyword arguments and
            returning a :class:`~adaptdl_core.policy.ResizeVerdict`; default
            :func:`~adaptdl_core.policy.amortised_resize_verdict` (a trial resizes in place:
            it is not resized again before its last resize is measured and amortised;
            benchmarks of the resize mechanism pass one that always resizes).
        solve_wait_s: the policy re-solves in a worker thread so that Tune's event loop
            is never blocked by it; a hook that starts a solve waits at most this many
            seconds for it while the previous solve took no longer (small solves then take
            effect at once; a larger one is not waited for, since beside a busy solve
            thread any wait overshoots), and otherwise answers with the standing
            decisions, the new ones taking effect at a later hook. ``None``: always wait,
            and write the state file in the hook (deterministic; for tests and scripted
            benchmarks).
        share_profiles: which trials share a throughput profile (see
            :class:`~adaptdl_core.decision.JobSpec`'s ``profile_group``): ``True``
            (default) all trials of this scheduler, which suits a sweep of one model
            over hyper-parameters that do not change its step time much (learning rate,
            weight decay, a schedule); ``False`` none (each trial profiles itself from one
            replica up); the name of a config entry (``"model_size"``, or ``"a/b"`` for
            ``config["a"]["b"]``) when the search changes the model, so that only
            trials with equal values share (a trial without the entry shares with the
            others without it); or a function of the trial's config returning a
            hashable group key, ``None`` for no sharing (it must pickle: Tune pickles the
            scheduler).
        resize_cost_prior_s: seconds a trial's resize is assumed to cost before one in its
            profile group is measured (raised to the longest start-up measured; default 5 s:
            a trial resizes in place, keeping its replicas that stay, so a resize costs a
            checkpoint, a rendezvous and a first step; ``benchmarks/resize_cost.py``
            measures it). Young trials, and trials with less than twice this left, are not
            moved.
        cluster_allocator: share the Ray cluster with every other AdaptDL experiment and
            job on it through the cluster allocator (:mod:`adaptdl_ray.cluster`, started
            on first use): this experiment's trials then get the share of one solve over
            every AdaptDL job on the cluster (the allocator's own policy decides; this
            scheduler's ``policy`` decides only while the allocator cannot be reached, with
            one warning; a ``policy`` name given here is the allocator's policy if this
            experiment starts it). ``False``: decide for this experiment alone over the
            whole cluster. ``None`` (default): share when running on Ray with the default
            ``nodes_fn`` and no policy object of its own (a policy object cannot be the
            allocator's, so such an experiment decides alone).

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
        policy_name = policy if isinstance(policy, str) else "pollux"
        own_policy = policy is not None and not isinstance(policy, str)
        if isinstance(policy, str):
            policy = policy_by_name(policy, p)  # ValueError names the known policies
        if policy is not None and not callable(getattr(policy, "allocate", None)):
            raise TypeError(f"policy must be an allocation policy such as PolluxPolicy() "
                            f"(with an allocate() method), got {policy!r}")
        if solve_wait_s is not None and (isinstance(solve_wait_s, bool) or not isinstance(
                solve_wait_s, (int, float)) or not math.isfinite(solve_wait_s)
                or solve_wait_s < 0):
            raise ValueError(f"solve_wait_s must be a finite number of seconds >= 0 or None "
                             f"(always wait), got {solve_wait_s!r}")
        for name, fn in (("nodes_fn", nodes_fn), ("hints_fn", hints_fn),
                         ("resize_rule", resize_rule)):
            if fn is not None and not callable(fn):
                raise TypeError(f"{name} must be a function, got {fn!r}")
        if cluster_allocator is not None and not isinstance(cluster_allocator, bool):
            raise TypeError(f"cluster_allocator must be True, False or None (share when on "
                            f"Ray), got {cluster_allocator!r}")
        if not isinstance(share_profiles, (bool, str)) and not callable(share_profiles):
            raise TypeError(f"share_profiles must be True, False, the name of a config entry "
                            f"or a function of the trial's config, got {share_profiles!r}")
        if isinstance(share_profiles, str) and not share_profiles.strip("/"):
            raise ValueError("share_profiles must name a config entry (e.g. 'model_size'), "
                             "got an empty name; pass True or False to share among all or "
                             "none")
        super().__init__()
        self._base = base_scheduler or FIFOScheduler()
        self._core = DecisionCore(policy or PolluxPolicy(p, fair_share=True), clock=_wall_clock,
                                  interval_s=float(allocation_interval_s),
                                  resize_rule=resize_rule or amortised_resize_verdict,
                                  min_event_gap_s=_MIN_EVENT_GAP_S,
                                  max_solve_share=_MAX_SOLVE_SHARE,
                                  resize_cost_prior_s=resize_cost_prior_s)
        self._nodes_fn = nodes_fn or cluster_nodes
        self._hints_fn = hints_fn
        self._nodes_cache: tuple[float, dict[Any, NodeInfo]] | None = None
        self._restored = False
        self._last_check = float("-inf")
        self._queue: list[str] = []  # paused (resized) trial ids waiting to run, in order
        # Relaunch sizes a move decided (off a draining node, onto the bundles a lost node
        # left), which the policy's next solve must not change before the relaunch.
        self._move_to: dict[str, int] = {}
        # Each running trial's replicas as its latest result reported them (a trial resizes
        # in place: its placement group holds only its minimum).
        self._replicas_now: dict[str, int] = {}
        self._targets: dict[str, int] = {}  # the size last told each trial
        # Each trial's trainable class: Tune's Trial.get_trainable_cls() asks Ray's GCS and
        # unpickles the class on every call (milliseconds, on every result).
        self._trainables: dict[str, Any] = {}
        self._metric: str | None = None
        self._mode: str | None = None
        self._control: Any = None
        self._relay = InterruptRelay()
        self._interrupt: dict[str, Any] | None = None
        self._interrupt_done = False  # the held-back signal went to Tune
        # Solves in a worker thread, state snapshots to the experiment directory.
        self._driver = CoreDriver(self._core, solve_wait_s=solve_wait_s)
        self._share_profiles = share_profiles
        self._missing_entry_logged = False
        self._traps = TrapWatch(allocation_interval_s)
        self._share_cluster = cluster_allocator if cluster_allocator is not None \
            else nodes_fn is None and not own_policy
        self._policy_name = policy_name
        self._allocator: AllocatorSolver | None = None
        self._ray_free_cache: tuple[float, dict[str, float]] | None = None
        self._next_drain_check = 0.0  # time.monotonic() of the next draining-node check

    def __getstate__(self) -> dict:
        # Tune pickles its configuration (with this scheduler) before the run; a worker
        # thread and a solve in flight do not travel.
        state = dict(self.__dict__)
        # (the driver leaves its worker thread behind itself). Nor does an interrupt: a restored run starts uninterrupted.
        state["_relay"], state["_interrupt"], state["_interrupt_done"] = \
            InterruptRelay(), None, False
        state["_trainables"] = {}
        return state

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
        self._mode = mode or self._mode
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
        group = self._profile_group(trial)
        if group is not None:
            spec = dataclasses.replace(spec, profile_group=group)
        self._hook()
        self._maybe_restore(trial)
        nodes = self._nodes()
        self._core.set_nodes(nodes)
        if cluster_capacity(spec, nodes) < spec.min_replicas:
            job_info(spec, nodes, created=0.0, hints=None)  # raises the clear error
        self._base.on_trial_add(tune_controller, trial)
        requested = None
        if trial.status == Trial.PENDING:
            self._restore_result_files(trial)
            # A trial re-added after a failure or a restore keeps its size if the cluster
            # holds it (it grows to it in place once its minimum has started).
            before = self._targets.get(trial.trial_id) or spec.min_replicas
            fitting = min(before, cluster_capacity(spec, nodes))
            requested = spec.clamp(max(fitting, spec.min_replicas))
            self._set_resources(trial, spec, requested)
        elif trial.status == Trial.PAUSED:
            self._enqueue(trial.trial_id)
        self._core.add_job(trial.trial_id, spec, replicas=requested, name=str(trial))
        self._driver.save_soon()

    def on_trial_result(self, tune_controller: Any, trial: Trial, result: dict) -> str:
        """Pass progress and resize costs to the core; return PAUSE when the core decides
        to resize the trial and its new room is free.

        Raises:
            ValueError: the experiment's metric is missing from the result."""
        self._hook()
        record = self._core.state.jobs.get(trial.trial_id)
        if record is None or not record.live:  # added before this scheduler saw it
            self.on_trial_add(tune_controller, trial)
        if self._metric and self._metric not in result:
            shown = sorted(k for k in result if not k.startswith(METRIC_PREFIX))
            raise ValueError(f"trial {trial.trial_id} reported no {self._metric!r} (the metric "
                             f"given to tune.run/TuneConfig); it reported {shown}. Report it "
                             "with tune.report({...}) from the training function")
        spec = replica_spec_of(self._trainable(trial))
        trap = self._traps.result(trial.trial_id, result, resizable=spec.max_replicas is None
                                  or spec.max_replicas > spec.min_replicas)
        if trap:
            LOG.warning(trap)
        current = self._take_replicas(trial, result)
        # Its size first: a count that changed through a resize begun here is not a new one.
        self._core.running(trial.trial_id, replicas=current)
        record = self._core.state.jobs[trial.trial_id]
        if self._take_progress(trial, result):
            self._driver.save()  # a relaunch happened (rare): its measured cost is worth keeping
        else:
            self._driver.save_if_due()
        decision = self._base.on_trial_result(tune_controller, trial, result)
        if decision == TrialScheduler.PAUSE:
            self._traps.forget(trial.trial_id)
            self._announce_pause(trial)
        if decision != TrialScheduler.CONTINUE or result.get("done"):
            return decision
        if self._relay.requested_at is not None:
            return decision  # interrupted: the trial saves where it is, no resize begins
        if trial.trial_id in self._queue:
            return decision  # already pausing (moving off a draining node)
        self._maybe_decide(tune_controller)
        verdict = self._core.decision_for(trial.trial_id)
        pending = record.resize_log[-1]["to"] if record.resize_pending and \
            record.resize_log else None
        if pending is not None and verdict.replicas != pending and \
                verdict.action in ("keep", "hold"):
            # The policy changed its mind before the trial could resize: it stays.
            self._core.cancel_resize(trial.trial_id, "the policy kept its size")
            self._post_target(trial.trial_id, current)
            return TrialScheduler.CONTINUE
        # A trial is never preempted to zero here: Tune admits trials itself.
        if verdict.action != "resize" or verdict.replicas < 1 or verdict.replicas == pending:
            return TrialScheduler.CONTINUE
        if verdict.replicas > current and not self._fits(self._free(tune_controller), trial,
                                                         verdict.replicas):
            # Grow only once the shrinking trials have freed the room.
            return TrialScheduler.CONTINUE
        self._core.begin_resize(trial.trial_id, verdict)
        LOG.info("trial %s: resizing in place %d -> %d replicas (%s; predicted cost %.1f s); "
                 "one line follows once its cost is measured", trial.trial_id, current,
                 verdict.replicas, verdict.reason, record.resize_log[-1]["cost_s"])
        self._post_target(trial.trial_id, verdict.replicas)
        self._driver.save()
        return TrialScheduler.CONTINUE

    def _begin_pause(self, trial: Trial, move_to: int | None = None) -> str:
        """Queue ``trial`` to relaunch (at ``move_to`` replicas if a move fixed the size,
        else at the core's target), keep the state, and announce the pause so that its
        replicas stop at the checkpoint; returns PAUSE."""
        self._enqueue(trial.trial_id, move_to=move_to)
        self._driver.save()
        self._traps.forget(trial.trial_id)
        self._announce_pause(trial)
        return TrialScheduler.PAUSE

    def on_trial_complete(self, tune_controller: Any, trial: Trial, result: dict) -> None:
        """Free the finished trial's replicas (re-divided at the next check). Its last
        result (which Tune passes here, not to on_trial_result) still counts: a resize
        whose first result is the trial's last is measured too."""
        record = self._core.state.jobs.get(trial.trial_id)
        if result and record is not None and record.live:
            self._take_progress(trial, result)
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
        self._relay.alive()
        self._driver.collect(0.0)
        now = time.monotonic()
        if now - self._last_check >= _MIN_CHECK_INTERVAL_S:
            self._last_check = now
            self._hook()
            self._handle_interrupt(tune_controller)
            if self._relay.requested_at is None:
                self._maybe_decide(tune_controller)
                self._driver.save_if_due()
                self._check_traps(tune_controller)
                self._move_off_draining(tune_controller)
                trial = self._next_resized_trial(tune_controller)
                if trial is not None:
                    return trial
        if self._relay.requested_at is not None:
            # Interrupted: no trial starts or resumes (it would only be stopped again,
            # and a start begun now could outlive the run's stop).
            return None
        choice = self._base.choose_trial_to_run(tune_controller)
        # FIFO-like bases resume any PAUSED trial; resized ones wait for their room.
        if choice is not None and choice.trial_id in self._queue:
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
        """Every _DRAIN_CHECK_S: pause each running trial with a replica on a node Ray is
        draining (its replicas stop at their next batch boundary, Tune keeps the
        checkpoint) and queue it to relaunch on the other nodes, with as many replicas as
        the cluster without the drained nodes holds, at least ``min_replicas``."""
        now = time.monotonic()
        if self._control is None or now < self._next_drain_check:
            return
        self._next_drain_check = now + _DRAIN_CHECK_S
        running = {t.trial_id: t for t in tune_controller.get_trials()
                   if t.status == Trial.RUNNING and t.trial_id not in self._queue}
        if not running:
            return
        try:
            draining = _ray_private.draining_nodes()
            if not draining:
                return
            nodes_of = ray.get(self._control.get_nodes.remote(list(running)), timeout=10)
        except Exception as exc:  # noqa: BLE001 - keep scheduling; say why at each check
            LOG.warning("could not check for trials on draining nodes (%s)", exc)
            return
        nodes = self._nodes(refresh=True)  # without the draining ones
        self._core.set_nodes(nodes)
        for trial_id, node_ids in nodes_of.items():
            under = draining_under(node_ids, draining)
            record = self._core.state.jobs.get(trial_id)
            if under is None or record is None or not record.live:
                continue
            trial = running[trial_id]
            current = self._held(trial)
            target = replicas_to_move(replica_spec_of(self._trainable(trial)), current,
                                      nodes)
            hit, when = under
            reason = f"node(s) {', '.join(n[:12] for n in hit)} draining ({when})"
            self._core.running(trial_id, replicas=current)
            self._core.begin_resize(trial_id, to=target, reason=reason)
            RESIZE_LOG.warning("trial %s: %s: pausing at its next batch boundary to relaunch "
                               "on the other nodes with %d replica(s)", trial_id, reason,
                               target)
            self._begin_pause(trial, move_to=target)
            tune_controller.pause_trial(trial)

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
                self._move_to.pop(trial_id, None)
                continue
            if trial.status != Trial.PAUSED:
                continue  # still saving before its pause
            record = self._core.state.jobs[trial_id]
            spec = replica_spec_of(self._trainable(trial))
            target = self._move_to.get(trial_id) or record.target or spec.min_replicas
            if not self._fits(free, trial, target):
                continue
            self._set_resources(trial, spec, target)
            self._queue.remove(trial_id)
            self._move_to.pop(trial_id, None)
            return trial
        return None

    def debug_string(self) -> str:
        """One line for Tune's status output: allocations, replicas in use, waiting trials."""
        state = self._core.state
        live = [r for r in state.jobs.values() if r.live and r.target > 0]
        return (f"AdaptDLScheduler: {state.num_allocations} allocations, "
                f"{sum(r.target for r in live)} replicas over {len(live)} trials, "
                f"{len(self._queue)} resizing; base: {self._base.debug_string()}")

    # -- internals ------------------------------------------------------------------
    def _hook(self) -> None:
        """Per-hook set-up: the interrupt relay and, under Ray, the control actor and the
        cluster allocator's solver."""
        if self._control is None and ray.is_initialized():
            self._control = control.start()
            self._relay.install()
            if self._share_cluster and self._allocator is None:
                self._allocator = AllocatorSolver(
                    new_member_id("tune"), "experiment",
                    interval_s=self._core.interval_s, policy=self._policy_name)
                self._driver.solver = self._allocator

    def _leave_cluster(self) -> None:
        """This experiment has no live trial left: its share of the cluster is freed now
        (it joins again with its next trial), with how its last trials ended."""
        if self._allocator is not None:
            self._allocator.leave({str(k): v for k, v in
                                   self._core.pending_outcomes().items()})

    def _announce_pause(self, trial: Trial) -> None:
        """Tell the trial that the save Tune asks for next precedes a pause, so that its
        replicas stop at the checkpoint (waited for: the save must not overtake it)."""
        if self._control is not None:
            try:
                ray.get(self._control.pausing.remote(trial.trial_id), timeout=10)
            except ray.exceptions.RayError as exc:
                LOG.warning("trial %s: could not announce its pause (%s); its replicas "
                            "train on until stopped", trial.trial_id, exc)

    @staticmethod
    def _progress(result: Mapping[str, Any]) -> JobProgress:
        """The core's view of a trial's result: restarts, relaunch costs, time left (from
        its epochs and its training time so far)."""
        def number(key: str) -> float | None:
            value = result.get(key)
            return float(value) if isinstance(value, (int, float)) and not isinstance(
                value, bool) and math.isfinite(value) else None

        restarts = result.get(METRIC_PREFIX + "restarts")
        done, total = number(METRIC_PREFIX + "epochs_done"), number(METRIC_PREFIX + "epochs")
        trained_s = number("time_total_s")
        remaining = None
        if done is not None and total is not None and trained_s is not None:
            remaining = estimate_remaining_s(done, total, trained_s)
        resize_s, launch_s = number(METRIC_PREFIX + "resize_s"), number(METRIC_PREFIX + "launch_s")
        return JobProgress(
            remaining_s=remaining,
            restarts=restarts if isinstance(restarts, int) and not isinstance(restarts, bool)
            and restarts >= 0 else None,
            resize_cost_s=resize_s if resize_s is not None and resize_s >= 0 else None,
            launch_s=launch_s if launch_s is not None and launch_s >= 0 else None)

    def _take_progress(self, trial: Trial, result: Mapping[str, Any]) -> bool:
        """Pass a result's progress to the core; the line of a resize it closes (its
        measured cost) goes out. Returns whether restarts or a resize cost changed."""
        record = self._core.state.jobs[trial.trial_id]
        resizing = record.resize_pending
        changed = self._core.update(trial.trial_id, progress=self._progress(result))
        if resizing and not record.resize_pending and record.resize_log:
            RESIZE_LOG.info(describe_resize(trial.trial_id, record.resize_log[-1], "trial"))
        return changed

    def _trial_ended(self, trial: Trial, outcome: str) -> None:
        self._hook()
        record = self._core.state.jobs.get(trial.trial_id)
        if record is not None and record.live and record.resize_pending and record.resize_log:
            RESIZE_LOG.info("%s (the trial ended first)",
                            describe_resize(trial.trial_id, record.resize_log[-1], "trial"))
        self._traps.forget(trial.trial_id)
        self._core.remove(trial.trial_id, outcome)
        if trial.trial_id in self._queue:
            self._queue.remove(trial.trial_id)
        self._move_to.pop(trial.trial_id, None)
        self._trainables.pop(trial.trial_id, None)
        self._replicas_now.pop(trial.trial_id, None)
        if outcome != "failed":  # (a retried trial starts again at the size it had)
            self._targets.pop(trial.trial_id, None)
        if ray.is_initialized():
            # (a trial actor that died gave back nothing of its own)
            remove_leftover_reservations(trial.trial_id)
        if self._control is not None:
            self._control.forget.remote(trial.trial_id)
        self._driver.save_soon()
        if not any(r.live for r in self._core.state.jobs.values()):
            # The experiment may be over: nothing is left to flush it later, and the
            # driver may read or upload the file next.
            self._leave_cluster()
            self._driver.save()
            self._driver.flush(_FINAL_FLUSH_S)

    def _profile_group(self, trial: Trial) -> str | None:
        """The trial's profile group under ``share_profiles`` (``None``: it shares none)."""
        share = self._share_profiles
        if share is False:
            return None
        if share is True:
            return "all-trials"
        config = getattr(trial, "config", None) or {}
        if isinstance(share, str):
            value: Any = config
            for part in (p for p in share.split("/") if p):
                if not isinstance(value, Mapping) or part not in value:
                    if not self._missing_entry_logged:
                        LOG.warning("trial %s has no config entry %r (share_profiles): it "
                                    "shares a throughput profile with the other trials "
                                    "without it", trial.trial_id, share)
                        self._missing_entry_logged = True
                    return f"{share}: missing"
                value = value[part]
            return f"{share}={value!r}"
        key = share(config)
        return None if key is None else f"key={key!r}"

    def _enqueue(self, trial_id: str, move_to: int | None = None) -> None:
        if trial_id not in self._queue:
            self._queue.append(trial_id)
        if move_to is not None:
            self._move_to[trial_id] = move_to

    def _set_resources(self, trial: Trial, spec: Any, replicas: int) -> None:
        """A (not running) trial's start: its placement group holds its minimum (so that
        Tune admits it once that fits), and it grows to ``replicas`` in place."""
        if num_replicas_of(trial.placement_group_factory) != spec.min_replicas:
            trial.update_resources(placement_group_factory(spec, spec.min_replicas))
        self._post_target(trial.trial_id, replicas)

    def _post_target(self, trial_id: str, replicas: int) -> None:
        """Tell the trial how many replicas to run on (it resizes itself in place)."""
        self._hook()
        self._targets[trial_id] = int(replicas)
        if self._control is not None:
            self._control.set_target.remote(trial_id, int(replicas), time.time())

    def target_of(self, trial_id: str) -> int | None:
        """The replicas this scheduler last told the trial to run on (``None``: none)."""
        return self._targets.get(trial_id)

    def _take_replicas(self, trial: Trial, result: Mapping[str, Any]) -> int:
        """The replicas a result says the trial runs on (kept for :meth:`_held`)."""
        value = result.get(METRIC_PREFIX + "replicas")
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            self._replicas_now[trial.trial_id] = value
        return self._held(trial)

    def _held(self, trial: Trial) -> int:
        """The replicas a trial runs on now: its latest report's count, else its
        placement group's (its minimum)."""
        return self._replicas_now.get(trial.trial_id) or \
            num_replicas_of(trial.placement_group_factory)

    def _maybe_decide(self, tune_controller: Any) -> None:
        """Have the driver start a re-solve when it is due (with the trials' sizes, hints
        and the cluster brought up to date first), and apply a finished one."""
        def prepare() -> None:
            live = {t.trial_id: t for t in tune_controller.get_trials()
                    if t.status in (Trial.PENDING, Trial.RUNNING, Trial.PAUSED)}
            ids = [k for k, r in self._core.state.jobs.items() if r.live and k in live]
            for trial_id in ids:
                trial, record = live[trial_id], self._core.state.jobs[trial_id]
                if trial.status == Trial.RUNNING and not record.resize_pending:
                    replicas = self._held(trial)
                elif record.resize_pending and record.resize_log:
                    # Resizing (in place, or relaunching after a move): it is about to hold
                    # that size. Counted as holding it, the next solve keeps it there (as
                    # nothing, the solve would give its room away and undo the resize
                    # before it lands).
                    replicas = record.resize_log[-1]["to"]
                else:
                    # A PENDING trial holds nothing yet: Tune starts it at its request
                    # once there is room (and the core then resizes it like any other).
                    replicas = 0
                self._core.running(trial_id, replicas=replicas)
            self._refresh_hints(ids)
            self._core.set_nodes(self._nodes(refresh=True))

        self._driver.step(prepare)

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
            record = self._core.state.jobs.get(trial_id)
            if record is not None and record.live and hints:
                self._core.update(trial_id, hints=hints)

    def _nodes(self, refresh: bool = False) -> dict[Any, NodeInfo]:
        """The cluster, re-read at most every _NODES_TTL_S (``ray.nodes()`` is an RPC)."""
        now = time.monotonic()
        if refresh or self._nodes_cache is None or now - self._nodes_cache[0] > _NODES_TTL_S:
            self._nodes_cache = (now, self._nodes_fn())
        return self._nodes_cache[1]

    def _free(self, tune_controller: Any) -> dict[str, float]:
        """Resources the running and starting trials leave free (aggregate over nodes).
        When the cluster is shared, what other experiments, jobs and other work hold is
        not free either: Ray's own count of free resources bounds it."""
        free: dict[str, float] = {}
        for node in self._nodes().values():
            for k, v in node.resources.items():
                free[k] = free.get(k, 0.0) + v
        pending: dict[str, float] = {}
        for trial in tune_controller.get_trials():
            if trial.status in (Trial.RUNNING, Trial.PENDING):
                # (its placement group, and the replicas it runs beyond it)
                held = self._held(trial)
                for k, v in replica_spec_of(self._trainable(trial)).resources.items():
                    free[k] = free.get(k, 0.0) - v * held
                    if trial.status == Trial.PENDING:
                        pending[k] = pending.get(k, 0.0) + v * held
        if self._allocator is not None:
            # A pending trial may not hold its resources yet: they are as good as taken.
            for k, v in self._ray_free().items():
                free[k] = min(free.get(k, 0.0), v - pending.get(k, 0.0))
        return free

    def _ray_free(self) -> dict[str, float]:
        """``ray.available_resources()``, re-read at most every _FREE_TTL_S (an RPC)."""
        now = time.monotonic()
        if self._ray_free_cache is None or now - self._ray_free_cache[0] > _FREE_TTL_S:
            try:
                self._ray_free_cache = (now, {k: float(v) for k, v in
                                              ray.available_resources().items()})
            except Exception as exc:  # noqa: BLE001 - fall back to this experiment's view
                LOG.debug("could not read Ray's free resources: %s", exc)
                return {}
        return self._ray_free_cache[1]

    def _fits(self, free: dict[str, float], trial: Trial, replicas: int) -> bool:
        """Whether ``trial`` could hold ``replicas`` replicas given ``free`` (from
        :meth:`_free`; what the trial holds itself counts as available to it)."""
        spec = replica_spec_of(self._trainable(trial))
        held = self._held(trial) if trial.status in (Trial.RUNNING, Trial.PENDING) else 0
        return all(free.get(k, 0.0) + v * held + 1e-9 >= v * replicas
                   for k, v in spec.resources.items())

    # -- interrupts -----------------------------------------------------------------
    def _handle_interrupt(self, tune_controller: Any) -> None:
        """After the driver's first Ctrl-C/SIGTERM: have the running trials save, then let
        Tune stop the run (see :mod:`.interrupts`)."""
        if self._relay.requested_at is None or self._interrupt_done:
            return
        trials = tune_controller.get_trials()
        if self._interrupt is None:
            live = [t for t in trials if t.status in (Trial.RUNNING, Trial.PENDING)
                    or t.is_saving]
            timeouts = [stop_timeout_of(self._trainable(t)) for t in live]
            self._interrupt = {"deadline": time.monotonic() + max(timeouts, default=0.0)
                               + _INTERRUPT_MARGIN_S}
            if self._control is not None:
                self._control.interrupt.remote()
            LOG.warning("saving %d running trial(s) before stopping",
                        sum(t.status == Trial.RUNNING for t in trials))
        acked: list[str] = []
        if self._control is not None:
            acked = ray.get(self._control.acks.remote(), timeout=10)
        waiting = unsaved_trials(((t.trial_id, t.status, t.is_saving) for t in trials), acked)
        if waiting and time.monotonic() < self._interrupt["deadline"]:
            return
        if waiting:
            LOG.warning("trials %s did not save in time; stopping anyway", sorted(waiting))
        self._interrupt_done = True
        self._leave_cluster()
        self._driver.save()
        self._driver.flush(_FINAL_FLUSH_S)
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
        if self._driver.state_dir is None:
            storage = getattr(trial, "storage", None)
            self._driver.state_dir = getattr(storage, "experiment_driver_staging_path", None)
        name = getattr(getattr(trial, "storage", None), "experiment_dir_name", None)
        if self._allocator is not None and name:
            self._allocator.label = name  # what `adaptdl-ray ls` shows as the experiment
        if self._restored or self._driver.state_dir is None:
            return
        self._restored = True
        try:
            saved = CoreState.load(self._driver.state_dir)
        except (OSError, ValueError) as exc:
            LOG.warning("could not read the saved scheduler state (%s); starting afresh", exc)
            return
        if saved is not None:
            LOG.info("restored AdaptDLScheduler state: %d trials", len(saved.jobs))
            self._core.restore(saved)
