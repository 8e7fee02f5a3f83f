"""AdaptDLTrainableCreator: one Tune trial = N data-parallel replicas of a training function.

The trial actor starts one worker actor per bundle of its placement group (see
:mod:`.worker_group`), runs the user's function on all of them and hands rank 0's reports
to Tune, one result per ``step``, as any Tune function trial would. A trial of one CPU
replica runs that replica in the trial actor itself (no second process; see
``single_replica_in_process``).

* **Checkpoints are the user's.** A report with ``checkpoint=`` becomes a Tune checkpoint
  holding the user's files, governed by ``CheckpointConfig``. Every checkpoint the trial
  writes (``save_checkpoint``: after such a report, on ``checkpoint_frequency``, at a pause
  for a resize, at the end) also carries the job's own state, taken in place at the next
  batch boundary without stopping the replicas, so a restore from any of them resumes at
  that batch (layout: :mod:`.checkpoint_files`).
* **Failures** of a replica end ``step`` with :class:`WorkerFailed` after every report made
  before them has been handed to Tune; Tune's ``FailureConfig`` retries from the latest
  checkpoint.
* **Lost nodes**: a replica's node that vanishes without notice is not the trial's failure.
  Every ``checkpoint_interval_s`` the replicas checkpoint in place (they train on); when a
  node under them is lost, the trial starts its replicas again from that newest checkpoint
  in the same placement group, whose lost bundles Ray places on the nodes left (the work
  since the checkpoint is repeated, nothing counts against ``max_failures``). If the
  nodes left have no room for the lost bundles, the trial continues on the bundles Ray
  still holds (at least ``min_replicas``) and grows back onto all of them, from a fresh
  checkpoint, once Ray places the rest again (a node joins, other work ends); with fewer
  than ``min_replicas`` placed, the start waits for room and then fails as usual. The
  trial actor itself runs on the node of the group's first bundle: the loss of that node
  (or of a one-replica trial's node, whose replica runs in the trial actor) is a Tune
  failure, but each in-place checkpoint is also kept on the run's storage, so that Tune's
  retry (``FailureConfig(max_failures=...)``) or a ``Tuner.restore`` resumes from it.
* **Interrupts** of the driver reach the trial through the experiment's control actor
  (:mod:`.control`): it stops its replicas at the next batch boundary and saves their state
  into its trial directory, which a ``Tuner.restore`` picks up (newest state wins).
* **Pauses** (resizes by :class:`~adaptdl_ray.tune.AdaptDLScheduler`): Tune saves, then stops
  the trial; the relaunched trial resumes from that checkpoint on its new number of
  replicas at the same epoch and sample. A resize changes the trial's placement group,
  which Tune re-creates, so the relaunch starts new replica processes.
* **Actor reuse** (``tune.TuneConfig(reuse_actors=True)``): a trial actor that Tune hands
  to a new trial with the same resources keeps its replica actors (torch imported); each
  forgets the previous job first (:meth:`AdaptDLTrainable.reset_config`).
"""

from __future__ import annotations

import collections
import inspect
import logging
import time
from typing import Any, Callable, Mapping

import ray
from ray import tune
from ray.tune.result import (DONE, RESULT_DUPLICATE, SHOULD_CHECKPOINT, TIME_THIS_ITER_S)

from adaptdl_core import validation
from adaptdl_core.decision.jobs import JobSpec
from adaptdl_ray.replicas import _ray_private
from adaptdl_ray.tune import checkpoint_files, control
from adaptdl_ray.tune.resources import num_replicas_of, placement_group_factory
from adaptdl_ray.tune.results import order_like, result_row
from adaptdl_ray.tune.traps import warn_unscheduled
from adaptdl_ray.tune.trial_progress import PendingReport, TrialProgress
from adaptdl_ray.tune.trial_replicas import TrialReplicas
from adaptdl_ray.replicas.group import (InProcessReplica, WorkerFailed, WorkerGroup,
                                           first_line_of, recycle_workers)

LOG = logging.getLogger(__name__)
_ray_private.check_tune()  # fail at import, not inside a trial, on a Ray without them

__all__ = ["AdaptDLTrainableCreator", "AdaptDLTrainable", "is_adaptdl_trainable",
           "replica_spec_of", "stop_timeout_of", "resize_phases", "WorkerFailed"]

# Longest wait for rank 0's next report or end before the trial looks for an interrupt.
_POLL_S = 1.0
# After a report, how long to wait for the function to end (the report is then the final
# one, which carries the final state to Tune); a next report or the end cut it short.
_FINISH_GRACE_S = 0.3
# After saving on an interrupt, how long to wait for Tune to stop the trial.
_INTERRUPTED_WAIT_S = 120.0
# How often a running trial asks for the scheduler's decision of its size.
_TARGET_READ_S = 1.0
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
            the creator; read it through :func:`replica_spec_of`.
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
        self._next_save: float | None = None  # time.monotonic() of the next in-place save
        self._target: int | None = None  # the scheduler's latest decision (replicas)
        self._target_at: float | None = None  # when it was decided (time.time())
        self._next_target_read = 0.0     # time.monotonic() of the next read of it

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
            if any(o["status"] == "checkpointed" for o in outcomes):
                # The job stopped itself (request_checkpoint_and_exit in the function):
                # continue from its checkpoint in fresh processes.
                self._relaunch_from_checkpoint()
                continue
            self._progress.finished = True
            return self._next_final()

    def _save_in_place_if_due(self) -> None:
        """Every ``checkpoint_interval_s`` of a launch: checkpoint at the next batch
        boundary while the replicas train on, keep that state as the one a lost replica
        node continues from, and write it to the trial's directory on the run's storage
        (as the state of an interrupted run: the newest state wins), so that when the
        trial actor itself is lost (its node, or an in-process replica with it), Tune's
        retry under ``FailureConfig(max_failures=...)`` or a ``Tuner.restore`` resumes
        there rather than at Tune's last checkpoint.

        Raises:
            WorkerFailed: a replica failed before the checkpoint."""
        interval, group = self.adaptdl_checkpoint_interval_s, self._group
        if interval is None or group is None or not group.started or self._ended:
            return
        now = time.monotonic()
        if self._next_save is None:
            self._next_save = now + interval
        if now < self._next_save:
            return
        self._next_save = now + interval
        try:
            answer = group.save(self.adaptdl_stop_timeout_s)
        except TimeoutError as exc:
            LOG.warning("trial %s: in-place checkpoint skipped: %s", self.trial_id, exc)
            return
        if not answer["taken"]:
            return
        self._archive = group.checkpoint_archive(answer["path"]) or self._archive
        if self._storage_info is None:
            return
        self._fetch(0.0)
        try:
            # The reports made before the checkpoint and not yet returned: a resumption
            # from it returns them first (the later ones the function makes again).
            self._keep_state([r for r in self._queue if r.tag < answer["index"]])
        except (OSError, ValueError) as exc:
            LOG.warning("trial %s: could not keep its in-place checkpoint on the run's "
                        "storage (%s)", self.trial_id, exc)

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
        from adaptdl_ray.replicas.nodes import cluster_nodes, lost_nodes_under
        group = self._group
        if not isinstance(group, WorkerGroup):
            return False
        lost = lost_nodes_under(group.node_ids, group.actors, lambda: cluster_nodes().keys())
        if not lost:
            return False
        self._fetch_quietly()
        self._progress.nodes_lost += len(lost)
        LOG.warning("trial %s: node(s) %s under its replicas were lost (%s); continuing "
                    "from its newest checkpoint", self.trial_id,
                    ", ".join(n[:12] for n in lost), first_line_of(exc))
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
        target = self._read_target()
        if not target:
            return
        target = self.adaptdl_replica_spec.clamp(target)
        current = group.num_replicas
        if target == current:
            self._replicas.cancel_grow()
            return
        if target > current and not self._replicas.grow_ready(group, target - current):
            return  # the new replicas start while the trial trains
        requested = time.time()
        outcomes = group.stop(self.adaptdl_stop_timeout_s)
        self._fetch(0.0)
        if all(o["status"] == "finished" for o in outcomes):
            self._ended = True  # the function ended first: step() finishes the trial
            return
        stopped = time.time()
        self._archive = group.checkpoint_archive() or self._archive
        stay = self._replicas.survivors(group, target)
        if isinstance(group, WorkerGroup):
            # Every replica leaves the job's process group together, then the extra stop.
            if stay and not recycle_workers(group.actors, self._replica_trial_info()):
                stay = []
            self._replicas.release([a for a in group.actors if a not in stay])
        else:
            group.shutdown()
        LOG.info("trial %s: resizing in place %d -> %d replicas (%d stay, %d start)",
                 self.trial_id, current, target, len(stay), target - len(stay))
        self._progress.restarts += 1
        self._launch_at, self._launch_s = stopped, 0.0
        self._measure_from = {"requested": requested, "stopped": stopped, "saved": stopped,
                              "decided": self._target_at or requested}
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
            outcomes = self._group.stop(self.adaptdl_stop_timeout_s)
            self._fetch(0.0)
            archive, pending = self._group.checkpoint_archive() or archive, list(self._queue)
            self._progress.finished = all(o["status"] == "finished" for o in outcomes)
        elif self._group is not None and self._group.started:
            answer = self._group.save(self.adaptdl_stop_timeout_s)
            self._fetch(0.0)
            if answer["taken"]:
                archive = self._group.checkpoint_archive(answer["path"])
                pending = [r for r in self._queue if r.tag < answer["index"]]
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
        target = self._read_target(force=True)
        return self.adaptdl_replica_spec.clamp(target) if target else self._base_replicas()

    def _read_target(self, force: bool = False) -> int | None:
        """The scheduler's latest decision for this trial (asked of the control actor at
        most every ``_TARGET_READ_S``; ``None`` without a scheduler or decision)."""
        now = time.monotonic()
        if self._control is None or (not force and now < self._next_target_read):
            return self._target
        self._next_target_read = now + _TARGET_READ_S
        try:
            answer = ray.get(self._control.get_target.remote(self.trial_id), timeout=10)
        except ray.exceptions.RayError as exc:
            LOG.debug("trial %s: could not read its target size: %s", self.trial_id, exc)
            return self._target
        if answer is not None:
            self._target, self._target_at = int(answer[0]), float(answer[1])
        return self._target

    def _trial_replicas(self) -> TrialReplicas:
        """Where this trial's replicas run (see :mod:`.trial_replicas`)."""
        return TrialReplicas(self.adaptdl_replica_spec.resources, self._replica_trial_info(),
                             ray.util.get_current_placement_group(), self._base_replicas(),
                             self.trial_id, in_process_allowed=self._in_process_allowed)

    def _replica_trial_info(self) -> dict[str, Any]:
        """What the replicas tell the function through ``tune.get_context()``."""
        storage = self._storage_info
        return {"trial_name": self.trial_name, "trial_id": self.trial_id,
                "experiment_name": storage.experiment_name if storage else None,
                "trial_resources": self.trial_resources,
                "trial_dir": (storage.trial_dir if storage else None) or self.logdir}

    def _in_process_allowed(self) -> bool:
        """Whether a one-replica launch may run its replica in this actor: enabled, the
        replica needs only CPUs (the trial actor holds no GPU or custom resource; its
        node is the bundle's), and no earlier in-process function still runs here."""
        resources = self.adaptdl_replica_spec.resources
        only_cpu = all(v == 0 for k, v in resources.items() if k not in ("CPU", "memory"))
        return self.adaptdl_single_replica_in_process and only_cpu and \
            not InProcessReplica.busy()

    def _new_group(self) -> WorkerGroup | InProcessReplica:
        """The replicas of a launch: as many as the scheduler decided (see
        :mod:`.trial_replicas`)."""
        return self._replicas.group(self._replicas_wanted())

    def _ensure_started(self) -> None:
        if self._group is None:
            self._progress.restarts += 1
            self._launch_at, self._launch_s = time.time(), 0.0
            self._group = self._new_group()
        if not self._group.started:
            self._ended = False
            self._next_save = None
            self._group.start(self._adaptdl_fn, self._config, fn_kwargs=self._fn_kwargs,
                              archive=self._archive, user_files=self._user_files,
                              num_restarts=self._progress.restarts, job_id=self.trial_id,
                              timeout_s=self._adaptdl_collective_timeout_s)
            if self._control is not None:
                # Where this launch runs: the scheduler moves the trial off a node Ray
                # drains (not waited for).
                self._control.put_nodes.remote(self.trial_id, list(self._group.node_ids))

    def _relaunch_from_checkpoint(self) -> None:
        """Continue a job that stopped itself at a checkpoint, in the same (recycled)
        replicas if they can serve again, else in fresh ones; a restart either way."""
        self._archive = self._group.checkpoint_archive() or self._archive
        if self._group.recycle(self._replica_trial_info()):
            self._progress.restarts += 1
            self._launch_at, self._launch_s = time.time(), 0.0
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
        if self._storage_info is None:
            return
        try:
            saved = checkpoint_files.read_interrupted(self._storage_info)
        except (OSError, ValueError) as exc:
            LOG.warning("trial %s: ignoring the state kept in its directory: %s",
                        self.trial_id, exc)
            return
        if saved is None or saved[0].seq <= self._progress.seq:
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
        try:
            self._fetch(0.0)
        except ray.exceptions.RayActorError:
            pass

    def _emit(self, report: PendingReport, *, final: bool = False) -> dict:
        """The result Tune receives for a queued report."""
        row = dict(report.metrics)
        checkpoint = report.user_checkpoint is not None
        if checkpoint:
            self._user_files = report.user_checkpoint
            self._progress.user_checkpoints += 1
        elif final and self._progress.user_checkpoints == 0:
            # Never checkpointed by the user: the final state goes to Tune, so that
            # result.checkpoint holds the trained model (model_state_dict()).
            checkpoint = True
        # After a failure no fresh state can be taken: the retry starts from the last
        # checkpoint, so the reports still queued go to Tune without one.
        row[SHOULD_CHECKPOINT] = checkpoint and self._error is None
        row[DONE] = final or bool(row.get(DONE, False))
        row[TIME_THIS_ITER_S] = row.pop(TIME_THIS_ITER_S)
        if not self._progress.schema:
            self._progress.schema = list(row)
        self._progress.iteration += 1
        self._progress.time_total_s += row[TIME_THIS_ITER_S]
        return order_like(row, self._progress.schema)

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
        outcomes = self._group.stop(self.adaptdl_stop_timeout_s)
        self._fetch(0.0)
        self._archive = self._group.checkpoint_archive() or self._archive
        self._progress.finished = all(o["status"] == "finished" for o in outcomes)
        path = self._keep_state(list(self._queue))
        LOG.info("trial %s: state saved to %s", self.trial_id, path)


def resize_phases(pause: Mapping[str, float], setup_at: float,
                  timeline: Mapping[str, float]) -> dict[str, float]:
    """Split one checkpoint-relaunch cycle into phases (seconds).

    Args:
        pause: wall-clock times the checkpoint was ``requested``, the replicas ``stopped``
            (saved at a batch boundary) and the checkpoint was ``saved`` into Tune's
            directory.
        setup_at: when the relaunched trial actor began its launch.
        timeline: the new launch's milestones (``created``, ``workers_up``, ``ready``,
            ``first_step``; see ``WorkerGroup.timeline``); a missing ``first_step`` means
            "not seen", and the current time stands in for it.

    Returns:
        ``checkpoint_s`` (to a batch boundary, rank 0 writes), ``save_s`` (checkpoint
        bytes into Tune's directory), ``relaunch_s`` (Tune persists the checkpoint, frees
        and re-creates the placement group, starts the trial actor; also any time the trial
        waited for resources), ``worker_start_s`` (replica actors up), ``restore_s``
        (checkpoint handed over, torch imported, files unpacked), ``first_step_s`` (process
        group, states loaded, first optimizer step), their sum ``total_s``, and for a
        resize in place (``pause`` has when it was ``decided``) ``decided_to_stop_s``: the
        time from the scheduler's decision to the stop request, while the trial trained on
        (a grow's new replicas start then).
    """
    first = timeline.get("first_step", time.time())
    ready = timeline.get("ready", first)
    phases = {
        "checkpoint_s": pause["stopped"] - pause["requested"],
        "save_s": pause["saved"] - pause["stopped"],
        "relaunch_s": setup_at - pause["saved"],
        "worker_start_s": timeline["workers_up"] - timeline["created"],
        "restore_s": ready - timeline["workers_up"],
        "first_step_s": first - ready,
    }
    if "decided" in pause:  # (a resize in place: the trial trained on until the stop)
        phases["decided_to_stop_s"] = pause["requested"] - pause["decided"]
    phases = {k: max(float(v), 0.0) for k, v in phases.items()}
    phases["total_s"] = max(first - pause["requested"], 0.0)
    return phases


def is_adaptdl_trainable(trainable_cls: Any) -> bool:
    """True for a class made by :func:`AdaptDLTrainableCreator` (or a Tune wrapper of one,
    such as ``tune.with_parameters``)."""
    return isinstance(trainable_cls, type) and issubclass(trainable_cls, AdaptDLTrainable) \
        and trainable_cls.adaptdl_replica_spec is not None


def replica_spec_of(trainable_cls: Any) -> JobSpec:
    """The :class:`JobSpec` of an AdaptDL trainable.

    Raises:
        TypeError: if ``trainable_cls`` was not made by :func:`AdaptDLTrainableCreator`
            (the message says how to wrap a training function, or a Ray Train trainer's).
    """
    if not is_adaptdl_trainable(trainable_cls):
        name = getattr(trainable_cls, "__name__", repr(trainable_cls))
        if "Trainer" in name:
            raise TypeError(
                f"AdaptDLScheduler cannot resize a Ray Train {name}: Ray Train fixes the "
                "number of workers. Run the same function elastically with "
                "tune.Tuner(AdaptDLTrainableCreator(train_loop_per_worker, "
                "num_cpus_per_worker=..., num_gpus_per_worker=...), param_space="
                "{'train_loop_config': ...}) - see 'Coming from Ray Train' in docs/migrating.md")
        raise TypeError(f"AdaptDLScheduler can only schedule trainables created with "
                        f"adaptdl_ray.tune.AdaptDLTrainableCreator(train_fn); got {name}. "
                        "Wrap your training function: "
                        "tune.Tuner(AdaptDLTrainableCreator(train_fn), ...)")
    return trainable_cls.adaptdl_replica_spec


def stop_timeout_of(trainable_cls: Any) -> float:
    """How long a checkpoint of an AdaptDL trainable's trial may wait for a batch boundary
    (its creator's ``stop_timeout_s``).

    Raises:
        TypeError: as :func:`replica_spec_of`.
    """
    replica_spec_of(trainable_cls)
    return trainable_cls.adaptdl_stop_timeout_s


def _check_seconds(name: str, value: Any, *, optional: bool = False) -> None:
    """A finite number of seconds > 0 (or ``None`` where ``optional``)."""
    if optional and value is None:
        return
    validation.number(name, value, 0.0, low_open=True, what="a finite number of seconds")


def _custom_resources(extra: Any, num_cpus: Any, num_gpus: Any) -> dict[str, float]:
    """``resources_per_worker`` checked: a dict of custom resource name -> finite amount
    ``>= 0`` that leaves CPUs and GPUs to their own arguments (a ``"CPU"`` entry once
    replaced ``num_cpus_per_worker`` without a word)."""
    if extra is None:
        return {}
    if not isinstance(extra, Mapping):
        raise ValueError(f"resources_per_worker must be a dict of custom resource name -> "
                         f"amount per replica (e.g. {{'TPU': 1}}) or None, got {extra!r}")
    own = {"CPU": ("num_cpus_per_worker", num_cpus), "GPU": ("num_gpus_per_worker", num_gpus)}
    out = {}
    for key, value in extra.items():
        # Ray's names are case-sensitive: {'cpu': 2} would ask for a custom resource no node
        # has, and the trial would wait for ever.
        upper = key.upper() if isinstance(key, str) else None
        if upper in own:
            arg, given = own[upper]
            raise ValueError(f"resources_per_worker[{key!r}]={value!r} conflicts with {arg}="
                             f"{given!r}: give {upper}s per replica with {arg} only")
        if not isinstance(key, str) or not key:
            raise ValueError(f"resources_per_worker: resource names must be non-empty "
                             f"strings, got {key!r}")
        out[key] = validation.number(f"resources_per_worker[{key!r}]", value, 0.0)
    return out


def AdaptDLTrainableCreator(train_fn: Callable[..., Any], *,  # noqa: N802 (AdaptDL's name)
                            num_cpus_per_worker: float = 1.0, num_gpus_per_worker: float = 0.0,
                            resources_per_worker: Mapping[str, float] | None = None,
                            min_replicas: int = 1, max_replicas: int | None = None,
                            stop_timeout_s: float = 120.0,
                            collective_timeout_s: float | None = None,
                            single_replica_in_process: bool = True,
                            checkpoint_interval_s: float | None =
                            DEFAULT_CHECKPOINT_INTERVAL_S,
                            name: str | None = None) -> type[AdaptDLTrainable]:
    """Make a Tune trainable that runs ``train_fn(config)`` on N data-parallel replicas.

    ``train_fn`` is an ordinary adaptdl_core training function (``init_process_group``,
    ``AdaptiveDataParallel``, ``AdaptiveDataLoader``, ``remaining_epochs_until``...) that
    calls ``ray.tune.report(metrics, checkpoint=...)``; only rank 0's reports reach Tune,
    with the ``adaptdl/...`` metrics added. The number of replicas is the number of bundles
    after the head bundle of the trial's placement group, which :class:`AdaptDLScheduler`
    sets.

    Args:
        train_fn: ``fn(config)`` (or ``fn(config, **kwargs)`` with ``tune.with_parameters``,
            wrapped around the function or around the returned trainable); it is pickled
            and run in each worker actor.
        num_cpus_per_worker: CPUs of each replica's bundle (also its torch threads).
        num_gpus_per_worker: GPUs of each replica's bundle.
        resources_per_worker: extra custom resources per replica (``{"TPU": 1}``; CPUs and
            GPUs are given by the two arguments above).
        min_replicas, max_replicas: bounds on the replica count (``max`` ``None``: the
            cluster is the limit).
        stop_timeout_s: how long a checkpoint may wait for the replicas to reach a batch
            boundary (also bounds the save on an interrupt of the driver).
        collective_timeout_s: ``ADAPTDL_TIMEOUT`` for the replicas (default: the core's 30 s).
        single_replica_in_process: run the replica of a one-replica launch inside the trial
            actor (saves starting a second process and importing torch twice) when it needs
            only CPUs. The function then runs in a thread of the trial actor: set False if
            it must have a process of its own (e.g. it changes process-wide settings that
            must not outlive the trial, or may kill its process on purpose).
        checkpoint_interval_s: seconds of training between in-place checkpoints (the
            replicas train on while rank 0 writes; each is also written to the trial's
            directory on the run's storage): the most a node lost without notice costs,
            since the trial continues from the newest one in its own placement group, and
            a retry or restore after the trial actor's own node was lost resumes from it;
            ``None``: none (a lost node then costs everything since the launch began, or
            since Tune's last checkpoint).
        name: the trainable's name in Tune (trial names start with it); default
            ``AdaptDL_<function name>``.

    Returns:
        a subclass of :class:`AdaptDLTrainable` to pass to ``tune.run`` or ``tune.Tuner``.

    Raises:
        ValueError: for a non-callable ``train_fn``, a function that cannot take a config
            argument, non-finite or negative resources or timeouts, a
            ``resources_per_worker`` that is not a dict or names ``"CPU"`` / ``"GPU"``
            (those are ``num_cpus_per_worker`` / ``num_gpus_per_worker``), or
            ``min_replicas > max_replicas`` (the message names the argument).
    """
    if not callable(train_fn) or isinstance(train_fn, type):
        raise ValueError(f"train_fn must be a function fn(config), got "
                         f"{type(train_fn).__name__}: pass the training function itself")
    try:
        inspect.signature(train_fn).bind({})
    except TypeError:
        raise ValueError(f"train_fn {getattr(train_fn, '__name__', train_fn)!r} must accept "
                         "one argument (the trial's config dict)") from None
    except ValueError:
        pass  # builtins without a signature: let them fail at run time
    for arg, value in (("num_cpus_per_worker", num_cpus_per_worker),
                       ("num_gpus_per_worker", num_gpus_per_worker)):
        validation.number(arg, value, 0.0)
    _check_seconds("stop_timeout_s", stop_timeout_s)
    _check_seconds("collective_timeout_s", collective_timeout_s, optional=True)
    _check_seconds("checkpoint_interval_s", checkpoint_interval_s, optional=True)
    if not isinstance(single_replica_in_process, bool):
        raise ValueError(f"single_replica_in_process must be True or False, got "
                         f"{single_replica_in_process!r}")
    if name is not None and (not isinstance(name, str) or not name):
        raise ValueError(f"name must be a non-empty string or None, got {name!r}")
    resources = {"CPU": float(num_cpus_per_worker), "GPU": float(num_gpus_per_worker)}
    resources.update(_custom_resources(resources_per_worker, num_cpus_per_worker,
                                       num_gpus_per_worker))
    spec = JobSpec(resources, min_replicas=min_replicas, max_replicas=max_replicas)
    cls_name = name or f"AdaptDL_{getattr(train_fn, '__name__', 'trainable')}"
    return type(cls_name, (AdaptDLTrainable,), {
        "_adaptdl_fn": staticmethod(train_fn),
        "adaptdl_replica_spec": spec,
        "adaptdl_stop_timeout_s": float(stop_timeout_s),
        "_adaptdl_collective_timeout_s": collective_timeout_s,
        "adaptdl_single_replica_in_process": bool(single_replica_in_process),
        "adaptdl_checkpoint_interval_s": None if checkpoint_interval_s is None
        else float(checkpoint_interval_s),
        "__doc__": f"AdaptDL trainable running {cls_name} on N data-parallel replicas.",
    })
