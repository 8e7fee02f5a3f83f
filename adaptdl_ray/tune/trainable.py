"""AdaptDLTrainable: the runtime of one Tune trial as N data-parallel replicas (made by
:func:`~adaptdl_ray.tune.creator.AdaptDLTrainableCreator`).

The trial actor starts one replica actor per replica (:mod:`adaptdl_ray.replicas`), runs
the user's function on all of them and hands rank 0's reports to Tune, one result per
``step``, as any Tune function trial would. A trial of one CPU replica runs that replica in
the trial actor itself (``single_replica_in_process``).

* **Checkpoints are the user's.** A report with ``checkpoint=`` becomes a Tune checkpoint
  holding the user's files; each also carries the job's own state, taken in place at the
  next batch boundary without stopping the replicas, so a restore from any of them resumes
  at that batch (layout: :mod:`.checkpoint_files`).
* **Resizes in place**: the trial reads the size the scheduler decided from the experiment's
  control actor; a grow first starts its new replicas (one-bundle reservations of the
  trial's own, :mod:`.trial_replicas`) while it trains, then the replicas checkpoint at a
  batch boundary, those that stay keep their processes and the function continues on the
  new count. Tune never pauses the trial for it.
* **Failures** of a replica end ``step`` with :class:`WorkerFailed` after every earlier
  report has been handed to Tune; Tune's ``FailureConfig`` retries from the latest
  checkpoint.
* **Lost nodes** are not the trial's failure: every ``checkpoint_interval_s`` the replicas
  checkpoint in place (also onto the run's storage); when a node under them is lost, the
  trial continues from that checkpoint on its placement group (Ray places the lost bundles
  on the nodes left, or the start waits for room) and grows back in place. The loss of the
  trial actor's own node is a Tune failure whose retry resumes from that checkpoint.
* **Interrupts** of the driver reach the trial through the control actor: it stops its
  replicas at the next batch boundary and saves their state into its trial directory, which
  a ``Tuner.restore`` picks up (newest state wins).
* **Shared with a submitted job**: the schedule and saves of in-place checkpoints, the
  verdict on a failure over a lost node, the step toward a new size and the hand-over of
  the replicas that stay are the job supervisor's (:mod:`adaptdl_ray.supervisor`).
* **Actor reuse** (``reuse_actors=True``): a trial actor handed to a new trial keeps its
  replica actors (torch imported); each forgets the previous job first.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import time
from typing import Any, Callable

import ray
from ray import tune
from ray.tune.result import DONE, RESULT_DUPLICATE, TIME_THIS_ITER_S

from adaptdl_core.decision.jobs import JobSpec
from adaptdl_ray.replicas import _ray_private
from adaptdl_ray.tune import checkpoint_files, control
from adaptdl_ray.tune.resources import (num_replicas_of, placement_group_factory,
                                         request_type)
from adaptdl_ray.tune.results import resize_phases, result_row
from adaptdl_ray.tune.traps import warn_unscheduled
from adaptdl_ray.tune.trial_progress import PendingReport, TrialProgress
from adaptdl_ray.tune.trial_replicas import TrialReplicas
from adaptdl_ray.replicas.failures import WorkerFailed, first_line_of
from adaptdl_ray.replicas.group import WorkerGroup
from adaptdl_ray.replicas.in_process import InProcessReplica
from adaptdl_ray.supervisor.in_place import InPlaceCheckpoints
from adaptdl_ray.supervisor.outcomes import Boundary, boundary_of
from adaptdl_ray.supervisor.recovery import (ResizeStep, Verdict, hand_over, judge_failure,
                                             resize_step)

LOG = logging.getLogger(__name__)
_ray_private.check_tune()  # fail at import, not inside a trial, on a Ray without them

__all__ = ["AdaptDLTrainable", "WorkerFailed", "DEFAULT_CHECKPOINT_INTERVAL_S"]

# Longest wait for rank 0's next report or end before the trial looks for an interrupt.
_POLL_S = 1.0
# After a report, how long to wait for the function to end (the report is then the final
# one, which carries the final state to Tune); a next report or the end cut it short.
_FINISH_GRACE_S = 0.3
# After saving on an interrupt, how long to wait for Tune to stop the trial.
_INTERRUPTED_WAIT_S = 120.0
#: Seconds of training between a multi-process trial's in-place checkpoints: what a node
#: lost without notice can cost (benchmarks/node_loss.py measures what a save costs).
DEFAULT_CHECKPOINT_INTERVAL_S = 300.0
_WITH_RESOURCES_ERROR = (
    "tune.with_resources() cannot set the resources of an AdaptDL trainable: a trial's "
    "resources are its replicas', and AdaptDLScheduler changes their number. Pass "
    "num_cpus_per_worker=..., num_gpus_per_worker=... or resources_per_worker={...} (and "
    "min_replicas/max_replicas) to AdaptDLTrainableCreator instead")


class AdaptDLTrainable(tune.Trainable):
    """Base class of the trainables made by :func:`AdaptDLTrainableCreator` (do not
    subclass it directly; the creator fills in the training function and the replica
    spec). ``tune.with_parameters`` works on it; ``tune.with_resources`` raises
    :class:`TypeError` (set per-replica resources in the creator).

    Attributes:
        adaptdl_replica_spec: the trial's replicas (resources each, min/max count), set by
            the creator (:func:`~adaptdl_ray.tune.creator.replica_spec_of` reads it).
        adaptdl_stop_timeout_s: seconds the replicas get to reach a batch boundary when
            asked to save or stop, set by the creator.
        adaptdl_single_replica_in_process: whether a one-replica launch runs its replica
            in the trial actor (when it needs no GPU and no custom resource), set by the
            creator.
        adaptdl_checkpoint_interval_s: seconds of training between in-place checkpoints
            of a launch with replica processes (``None``: none), set by the creator."""

    _adaptdl_fn: Callable[..., Any] | None = None
    adaptdl_replica_spec: JobSpec | None = None
    adaptdl_stop_timeout_s: float = 120.0
    adaptdl_single_replica_in_process: bool = True
    adaptdl_checkpoint_interval_s: float | None = DEFAULT_CHECKPOINT_INTERVAL_S
    _adaptdl_collective_timeout_s: float | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "default_resource_request" in cls.__dict__:
            raise TypeError(_WITH_RESOURCES_ERROR)

    @classmethod
    def default_resource_request(cls, config: dict) -> Any:
        """``min_replicas`` replicas until a scheduler decides otherwise."""
        return placement_group_factory(cls.adaptdl_replica_spec, cls.adaptdl_replica_spec.min_replicas)

    # -- Tune hooks -------------------------------------------------------------------
    def setup(self, config: dict, **fn_kwargs: Any) -> None:
        """Start the replica actors (the training function starts at the first step).

        Keyword arguments (from ``tune.with_parameters``) are passed on to the training
        function as ``train_fn(config, **kwargs)``."""
        if self._adaptdl_fn is None or self.adaptdl_replica_spec is None:
            raise TypeError("AdaptDLTrainable is a base class: create trainables with "
                            "adaptdl_ray.tune.AdaptDLTrainableCreator(train_fn)")
        self._fn_kwargs = ray.put(fn_kwargs) if fn_kwargs else {}
        self._control = control.find()
        if self._control is None:
            warn_unscheduled(self.adaptdl_replica_spec)
        self._interrupt = self._control.wait_interrupt.remote() if self._control else None
        self._new_trial(config)
        self._replicas = self._trial_replicas()
        self._group: WorkerGroup | InProcessReplica | None = self._new_group()

    @property
    def _adaptdl_name(self) -> str:
        """How log lines name the trial (not ``_name``: Tune registers a trainable class
        under its ``_name``)."""
        return f"trial {self.trial_id}"

    def _new_trial(self, config: dict) -> None:
        """Forget every trace of a previous trial on this actor (a fresh trial starts)."""
        self._config = config
        self._progress = TrialProgress()
        self._archive: bytes | None = None      # the job state the next launch starts from
        self._user_files: bytes | None = None   # the user's latest checkpoint (tar bytes)
        self._queue: collections.deque[PendingReport] = collections.deque()
        self._error: WorkerFailed | None = None  # raised once the queued reports are out
        self._measure_from: dict[str, float] | None = None  # pause record of a relaunch
        self._first_step = True
        self._ended = False  # rank 0's function of the current launch has returned
        self._posted_hints: str | None = None
        self._storage_info = _ray_private.trial_storage(self)
        self._launch_at = time.time()
        self._launch_s = 0.0  # this launch's start to first step, once seen
        self._in_place = InPlaceCheckpoints(self.adaptdl_checkpoint_interval_s,
                                            self.adaptdl_stop_timeout_s,
                                            name=self._adaptdl_name)
        self._target = control.TargetReader(self._control, self.trial_id)

    def load_checkpoint(self, checkpoint_dir: str) -> None:
        """Take the job state, the user's files and the unreturned reports of a checkpoint
        this trial wrote; the relaunch counts as a restart."""
        self._adopt(*checkpoint_files.read(checkpoint_dir))

    def step(self) -> dict:
        """Return rank 0's next report (the last one marked done).

        Raises:
            WorkerFailed: a replica failed (after every earlier report was returned)."""
        if self._first_step:
            self._first_step = False
            self._adopt_interrupted_state()
        if self._progress.finished:
            return self._next_final()
        self._ensure_started()
        while True:
            self._check_interrupt()
            outcomes = None
            if self._error is None:
                try:
                    self._save_in_place_if_due()
                    self._resize_in_place_if_due()
                    if not self._ended:
                        # Block on the next report or the end. With one report queued,
                        # wait only briefly: if the function ends right after it, that
                        # report is the final one.
                        queued = len(self._queue)
                        self._fetch(_POLL_S if not queued else
                                    _FINISH_GRACE_S if queued == 1 else 0.0)
                        if not queued and not self._queue and not self._ended:
                            # Nothing came: a replica that failed before its function
                            # could report (even rank 0, which then never ends) must not
                            # leave the trial waiting (raises WorkerFailed).
                            self._group.finished(0.0)
                    if self._ended:  # the other replicas end with rank 0
                        outcomes = self._group.finished(_POLL_S)
                except (WorkerFailed, ray.exceptions.RayActorError) as exc:
                    if self._continue_after_lost_node(exc):
                        continue
                    self._error = exc if isinstance(exc, WorkerFailed) else WorkerFailed(
                        f"{self._group.describe(0)} died: {first_line_of(exc)}")
                    self._fetch_quietly()
            if self._error is not None:
                if self._queue:
                    return self._emit(self._queue.popleft())
                raise self._error
            if outcomes is None:
                if self._queue:
                    return self._emit(self._queue.popleft())
                continue
            self._fetch(0.0)
            if boundary_of(outcomes) is Boundary.CHECKPOINTED:
                # The job stopped itself (request_checkpoint_and_exit in the function):
                # continue from its checkpoint in fresh processes.
                self._relaunch_from_checkpoint()
                continue
            self._progress.finished = True
            return self._next_final()

    def _save_in_place_if_due(self) -> None:
        """Every ``checkpoint_interval_s`` of a launch: checkpoint at the next batch
        boundary while the replicas train on (see
        :class:`~adaptdl_ray.supervisor.in_place.InPlaceCheckpoints`); a lost replica node
        continues from it, and it is written to the trial's directory on the run's storage
        (newest state wins), where Tune's retry or a ``Tuner.restore`` after the trial
        actor was lost finds it.

        Raises:
            WorkerFailed: a replica failed before the checkpoint."""
        group = self._group
        if group is None or not group.started or self._ended:
            return
        saved = self._in_place.save_if_due(group)
        if saved is None:
            return
        self._archive = saved.archive or self._archive
        if self._storage_info is None:
            return
        self._fetch(0.0)
        try:
            # The reports made before the checkpoint and not yet returned: a resumption
            # from it returns them first (the later ones the function makes again).
            self._keep_state(self._reports_before(saved.index))
        except (OSError, ValueError) as exc:
            LOG.warning("%s: could not keep its in-place checkpoint on the run's storage "
                        "(%s)", self._adaptdl_name, exc)

    def _reports_before(self, index: int) -> list[PendingReport]:
        """The queued reports made before the batch boundary ``index`` (a checkpoint's)."""
        return [r for r in self._queue if r.tag < index]

    def _keep_state(self, pending: list[PendingReport]) -> str:
        """Write the trial's record (with ``pending``, its reports not yet returned), its
        newest job state and the user's files to its directory on the run's storage, as
        the newest AdaptDL state (``seq`` + 1); returns the path written."""
        self._progress.seq += 1
        self._progress.pause = None
        self._progress.pending = pending
        try:
            return checkpoint_files.write_interrupted(self._storage_info, self._progress,
                                                      self._archive, self._user_files)
        finally:
            self._progress.pending = []

    def _continue_after_lost_node(self, exc: BaseException) -> bool:
        """After a replica failed: if a node under the replicas is gone, start them again
        from the newest checkpoint in the same placement group (Ray places its lost
        bundles on the nodes left, or the start times out into an ordinary failure) and
        return True; False if no node was lost (the failure is the trial's)."""
        from adaptdl_ray.replicas.nodes import cluster_nodes
        group = self._group
        if not isinstance(group, WorkerGroup):
            return False  # (it ran in the trial actor: a loss of its node is Tune's)
        verdict = judge_failure(exc, group, lambda: cluster_nodes().keys(),
                                name=self._adaptdl_name)
        if verdict.verdict is Verdict.FAIL:
            return False
        self._fetch_quietly()
        self._progress.nodes_lost += len(verdict.lost_nodes)
        # Its own reservations go back too: it continues on its placement group's bundles
        # (Ray places the lost ones on the nodes left, else the start waits for room) and
        # grows back to its size in place once there is room.
        self._replicas.release_all(group)
        self._group = None
        self._ended = False
        self._ensure_started()
        return True

    def _resize_in_place_if_due(self) -> None:
        """When the scheduler decided another size, resize without Tune relaunching the
        trial: a grow first starts its new replicas while the trial trains (see
        :mod:`.trial_replicas`); then the replicas checkpoint at their next batch
        boundary, the ones that stay keep their processes, the extra ones stop, and the
        function continues from the checkpoint on the new count (a restart, measured as
        a resize from the stop request to the first step)."""
        group = self._group
        if group is None or not group.started or self._ended:
            return
        target = self._target.read()
        if not target:
            return
        target = self.adaptdl_replica_spec.clamp(target)
        current = group.num_replicas
        step = resize_step(current, target, cancel_grow=self._replicas.cancel_grow,
                           grow_ready=lambda extra: self._replicas.grow_ready(group, extra))
        if step is not ResizeStep.GO:
            return  # (a grow's new replicas start while the trial trains)
        requested = time.time()
        outcomes = group.stop(self.adaptdl_stop_timeout_s)
        self._fetch(0.0)
        if boundary_of(outcomes) is Boundary.FINISHED:
            self._ended = True  # the function ended first: step() finishes the trial
            return
        stopped = time.time()
        self._archive = group.checkpoint_archive() or self._archive
        stay = self._replicas.survivors(group, target)
        if isinstance(group, WorkerGroup):
            stay = hand_over(group.actors, stay, self._replica_trial_info(),
                             release=self._replicas.release)
        else:
            group.shutdown()
        LOG.info("trial %s: resizing in place %d -> %d replicas (%d stay, %d start)",
                 self.trial_id, current, target, len(stay), target - len(stay))
        self._count_restart(stopped)
        self._measure_from = {"requested": requested, "stopped": stopped, "saved": stopped,
                              "decided": self._target.decided_at or requested}
        self._group = self._replicas.group(target, keep=stay)
        self._ensure_started()

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        """Write the user's latest files and the job's state, taken at the next batch
        boundary, into ``checkpoint_dir``. The replicas keep training, unless the scheduler
        announced that this save precedes a pause: then they stop at the checkpoint.

        Raises:
            TimeoutError: the replicas reached no batch boundary within stop_timeout_s.
            WorkerFailed: a replica failed meanwhile."""
        if self._error is not None:
            raise self._error  # the replicas are gone: retry from the last checkpoint
        t0 = time.time()
        archive, pending = self._archive, list(self._queue)
        if self._group is not None and self._group.started and self._progress.finished:
            # The function has ended (the usual save of a trial's final result): its
            # final state is its newest checkpoint; nothing to stop or ask.
            archive = self._group.checkpoint_archive() or archive
        elif self._group is not None and self._group.started and self._pause_announced():
            archive, pending = self._stop_at_boundary() or archive, list(self._queue)
        elif self._group is not None and self._group.started:
            saved = self._in_place.save(self._group)
            self._fetch(0.0)
            if saved is not None:
                archive, pending = saved.archive, self._reports_before(saved.index)
            else:  # the function ended before a boundary: its final state
                self._group.finished(self.adaptdl_stop_timeout_s)
                self._fetch(0.0)
                archive, pending = self._group.checkpoint_archive(), list(self._queue)
        stopped = time.time()
        self._archive = archive
        self._progress.seq += 1
        self._progress.pause = {"requested": t0, "stopped": stopped, "saved": time.time()}
        self._progress.pending = pending
        try:
            checkpoint_files.write(checkpoint_dir, self._progress, archive, self._user_files)
        finally:
            self._progress.pending = []
        LOG.info("trial %s checkpointed in %.2f s (%d reports not yet returned)",
                 self.trial_id, time.time() - t0, len(pending))

    def cleanup(self) -> None:
        """Kill the replica actors and give every reservation of the trial's own back."""
        replicas = getattr(self, "_replicas", None)
        if replicas is not None:
            replicas.release_all(getattr(self, "_group", None))
        elif getattr(self, "_group", None) is not None:
            self._group.shutdown()
        self._group = None

    def reset_config(self, new_config: dict) -> bool:
        """Serve a new trial with this actor (Tune's ``reuse_actors=True``; Tune reuses an
        actor only for a trial that asks for the same resources).

        The replicas are kept (torch stays imported) when the new trial has the same
        number of replicas and their previous function has ended (an in-process replica's
        function that Tune stopped early is asked to stop first): each forgets the
        previous job as a new process would. Otherwise they are replaced by fresh ones.

        Returns:
            True (the actor is always reusable; only its replicas may be replaced).
        """
        if self._interrupt is not None and ray.wait([self._interrupt], timeout=0)[0]:
            return False  # the run is being interrupted: no new work here
        self._new_trial(new_config)
        info = self._replica_trial_info()
        n = self._replicas_wanted()
        group = self._group
        if group is not None and (group.num_replicas != n or n > self._base_replicas()
                                  or not group.recycle(info)):
            self._replicas.release_all(group)
            group = None
        # (the new trial's own reservations carry its name)
        replicas, self._replicas = self._replicas, self._trial_replicas()
        if group is None:
            replicas.release_all()
            group = self._new_group()
        else:
            self._replicas.adopt(replicas)
            LOG.info("trial %s reuses %d warm replica(s)", self.trial_id, n)
        self._group = group
        return True

    def _pause_announced(self) -> bool:
        """Whether the scheduler announced that the save now asked for precedes a pause."""
        if self._control is None:
            return False
        try:
            return bool(ray.get(self._control.take_pausing.remote(self.trial_id), timeout=10))
        except ray.exceptions.RayError:
            return False

    # -- launching ---------------------------------------------------------------------
    def _base_replicas(self) -> int:
        """The replicas of the trial's placement group from Tune (its ``min_replicas``)."""
        if ray.util.get_current_placement_group() is None:
            return self.adaptdl_replica_spec.min_replicas
        return num_replicas_of(self.trial_resources)

    def _replicas_wanted(self) -> int:
        """The replicas to launch with: the scheduler's latest decision, within the
        trial's bounds, else its placement group's."""
        target = self._target.read(force=True)
        return self.adaptdl_replica_spec.clamp(target) if target else self._base_replicas()

    def _trial_replicas(self) -> TrialReplicas:
        """Where this trial's replicas run (see :mod:`.trial_replicas`)."""
        placement = ray.util.get_current_placement_group()
        return TrialReplicas(self.adaptdl_replica_spec.resources, self._replica_trial_info(),
                             placement, self._base_replicas(),
                             self.trial_id, in_process=self.adaptdl_single_replica_in_process,
                             accelerator_type=request_type(self.trial_resources)
                             if placement is not None else None)

    def _replica_trial_info(self) -> dict[str, Any]:
        """What the replicas tell the function through ``tune.get_context()``."""
        storage = self._storage_info
        return {"trial_name": self.trial_name, "trial_id": self.trial_id,
                "experiment_name": storage.experiment_name if storage else None,
                "trial_resources": self.trial_resources,
                "trial_dir": (storage.trial_dir if storage else None) or self.logdir}

    def _new_group(self) -> WorkerGroup | InProcessReplica:
        """The replicas of a launch: as many as the scheduler decided (see
        :mod:`.trial_replicas`)."""
        return self._replicas.group(self._replicas_wanted())

    def _ensure_started(self) -> None:
        if self._group is None:
            self._count_restart()
            self._group = self._new_group()
        if not self._group.started:
            self._ended = False
            self._in_place.restart()
            self._group.start(self._adaptdl_fn, self._config, fn_kwargs=self._fn_kwargs,
                              archive=self._archive, user_files=self._user_files,
                              num_restarts=self._progress.restarts, job_id=self.trial_id,
                              timeout_s=self._adaptdl_collective_timeout_s)
            if self._control is not None:  # where it runs: moved off a draining node
                self._control.put_nodes.remote(self.trial_id, list(self._group.node_ids),
                                               self._progress.restarts)

    def _count_restart(self, at: float | None = None) -> None:
        """A new launch of the function, from ``at`` (default now): a restart."""
        self._progress.restarts += 1
        self._launch_at, self._launch_s = time.time() if at is None else at, 0.0

    def _relaunch_from_checkpoint(self) -> None:
        """Continue a job that stopped itself at a checkpoint, in the same (recycled)
        replicas if they can serve again, else in fresh ones; a restart either way."""
        self._archive = self._group.checkpoint_archive() or self._archive
        if self._group.recycle(self._replica_trial_info()):
            self._count_restart()
        else:
            self._replicas.release_all(self._group)
            self._group = None
        self._ensure_started()

    def _adopt(self, progress: TrialProgress, archive: bytes | None,
               user_files: bytes | None) -> None:
        """Continue from a saved record: its unreturned reports come first."""
        for report in progress.pending:
            report.tag = -1  # made before any checkpoint of the coming launch
        self._queue = collections.deque(progress.pending)
        progress.pending = []
        progress.restarts += 1
        self._progress = progress
        self._archive, self._user_files = archive, user_files
        self._measure_from = progress.pause

    def _adopt_interrupted_state(self) -> None:
        """Resume from the state kept in the trial's directory (saved on an interrupt of
        the driver, or the newest in-place checkpoint), if it is newer than the checkpoint
        Tune restored (or there was none)."""
        saved = checkpoint_files.read_newer_kept(self._storage_info, self._progress.seq)
        if saved is None:
            return
        progress = saved[0]
        LOG.info("trial %s resumes from the newest state it kept (iteration %d)",
                 self.trial_id, progress.iteration)
        _ray_private.set_trainable_counters(self, iteration=progress.iteration,
                                            time_total_s=progress.time_total_s)
        self._adopt(*saved)
        self._measure_from = None  # not a resize

    # -- reports -----------------------------------------------------------------------
    def _fetch(self, timeout_s: float) -> None:
        """Queue rank 0's new reports as result rows."""
        items, ended = self._group.next_results(timeout_s)
        self._ended = self._ended or ended
        for item in items:
            hints = item.get("hints")
            if hints and hints != self._posted_hints and self._control is not None:
                self._control.put_hints.remote(self.trial_id, hints)
                self._posted_hints = hints
            phases = None
            if self._measure_from is not None or not self._launch_s:
                timeline = self._group.timeline()
                if "first_step" in timeline:
                    self._launch_s = max(timeline["first_step"] - self._launch_at, 0.0)
                if self._measure_from is not None:
                    # The first report of a relaunch: what the relaunch cost, by phase.
                    phases = resize_phases(self._measure_from, self._launch_at, timeline)
                    self._progress.resize_s = phases.pop("total_s")
                    self._measure_from = None
            row = result_row(item["metrics"], item["status"], launch_s=self._launch_s,
                             resize_s=self._progress.resize_s, phases=phases)
            row[TIME_THIS_ITER_S] = float(item["time_this_iter_s"])
            self._queue.append(PendingReport(row, item["tag"], item["user_checkpoint"]))

    def _fetch_quietly(self) -> None:
        """After a failure: take what rank 0 reported, if it is still alive."""
        with contextlib.suppress(ray.exceptions.RayActorError):
            self._fetch(0.0)

    def _emit(self, report: PendingReport, *, final: bool = False) -> dict:
        """The result Tune receives for a queued report (:meth:`TrialProgress.tune_result`);
        a report's user checkpoint becomes the files of the trial's next checkpoint."""
        if report.user_checkpoint is not None:
            self._user_files = report.user_checkpoint
        return self._progress.tune_result(report, final=final, failed=self._error is not None)

    def _next_final(self) -> dict:
        """After the function ended: its remaining reports, the last marked done."""
        if not self._queue:
            # Tune then completes the trial with its last result, without a new row.
            return {RESULT_DUPLICATE: True, DONE: True}
        report = self._queue.popleft()
        return self._emit(report, final=not self._queue)

    # -- interrupts --------------------------------------------------------------------
    def _check_interrupt(self) -> None:
        """On an interrupt of the driver: save where the replicas are, tell the scheduler,
        and wait for Tune to stop this trial."""
        if self._interrupt is None or not ray.wait([self._interrupt], timeout=0)[0]:
            return
        self._interrupt = None
        t0 = time.time()
        try:
            self._save_interrupted()
        except Exception:  # noqa: BLE001 - a restore then starts from Tune's checkpoint
            LOG.warning("trial %s could not save its state on the interrupt", self.trial_id,
                        exc_info=True)
        finally:
            self._control.ack.remote(self.trial_id)
        LOG.info("trial %s saved its state on the interrupt in %.2f s", self.trial_id,
                 time.time() - t0)
        time.sleep(_INTERRUPTED_WAIT_S)
        raise RuntimeError("the run was interrupted, but Tune did not stop this trial within "
                           f"{_INTERRUPTED_WAIT_S:.0f} s")

    def _save_interrupted(self) -> None:
        if self._storage_info is None or self._error is not None:
            return
        self._archive = self._stop_at_boundary() or self._archive
        path = self._keep_state(list(self._queue))
        LOG.info("trial %s: state saved to %s", self.trial_id, path)

    def _stop_at_boundary(self) -> bytes | None:
        """Stop the replicas at their next batch boundary (each checkpoints, unless its
        function ended first), queue rank 0's last reports and return its newest
        checkpoint (``None``: none); the trial is finished if the function had ended."""
        outcomes = self._group.stop(self.adaptdl_stop_timeout_s)
        self._fetch(0.0)
        self._progress.finished = boundary_of(outcomes) is Boundary.FINISHED
        return self._group.checkpoint_archive()
