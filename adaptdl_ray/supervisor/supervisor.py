"""One running elastic job: its launches, resizes, moves and recoveries, in one loop.

A :class:`Supervisor` runs a training function on replica actors that each hold a
one-bundle reservation of their own (:class:`~adaptdl_ray.replicas.pool.ReplicaPool`), and
follows it until it finishes, is stopped or fails:

* **start**: reserve and start the replicas (waiting for room at most
  ``placement_timeout_s``), run the function on them from the job's checkpoint;
* **resize** (the sizer's decision): a grow reserves and starts only the new replicas while
  the job trains, and checkpoints once they are up; a shrink stops only the extra ones; the
  replicas that stay keep their processes and continue from the checkpoint;
* **accelerator types**: on a cluster of several types, every replica is reserved on the
  type the decision names (:attr:`~adaptdl_core.decision.Decision.accelerator_type`); a
  resize to another type checkpoints and relaunches on it (only replicas already on that
  type stay);
* **move** off a node Ray is draining, before its deadline: checkpoint at the next batch
  boundary and continue on the other nodes (as many replicas as they hold, at least
  ``min_replicas``);
* **in-place checkpoints** every ``checkpoint_interval_s`` (the replicas train on), kept
  by the front-end (``keep_checkpoint``);
* **lost nodes**: when a replica fails because its node vanished, continue on the nodes
  left from the newest checkpoint (the work since it is repeated, no more);
* **stop** at the next batch boundary when asked (:meth:`Supervisor.request_stop`);
* the **final state**: a :class:`~adaptdl_ray.supervisor.outcomes.RunResult`.

Every launch's end is a :class:`~adaptdl_ray.supervisor.outcomes.LaunchEnd`. The front-end
(a submitted job's driver) supplies the sizer, where checkpoints are kept and where its
status goes; tests pass fake replicas and pools.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any, Callable, Mapping, Sequence

from adaptdl_core.decision import Decision, JobSpec, progress_from_status
from adaptdl_core.policy import nodes_off_type
from adaptdl_ray.replicas.nodes import DrainWatch
from adaptdl_ray.replicas.pool import Grow
from adaptdl_ray.supervisor.in_place import InPlaceCheckpoints
from adaptdl_ray.supervisor.outcomes import (Boundary, Change, Ending, LaunchEnd, Phase,
                                             RunResult, boundary_of)
from adaptdl_ray.supervisor.recovery import (ResizeStep, Verdict, hand_over, judge_failure,
                                             resize_step)

LOG = logging.getLogger(__name__)

__all__ = ["Supervisor", "JobRunner", "StatusUpdate", "DEFAULT_STOP_TIMEOUT_S",
           "DEFAULT_CHECKPOINT_INTERVAL_S"]

#: Seconds a stop or a resize may wait for the replicas to reach a batch boundary.
DEFAULT_STOP_TIMEOUT_S = 120.0
#: Seconds of training between in-place checkpoints: what a node lost without notice can
#: cost. A save stops the job at one batch boundary for as long as rank 0 takes to write
#: its state (benchmarks/node_loss.py measures the share of time it costs).
DEFAULT_CHECKPOINT_INTERVAL_S = 300.0
# Seconds between reads of rank 0's status and hints.
_STATUS_EVERY_S = 3.0
# Seconds between checks for draining nodes under the job's replicas.
_DRAIN_CHECK_S = 2.0
# How long a launch waits for its replicas' resources before giving up.
_PLACEMENT_TIMEOUT_S = 600.0
_WAITING_LOG_EVERY_S = 30.0


@dataclasses.dataclass(frozen=True)
class JobRunner:
    """What runs on every replica: ``fn(config, **fn_kwargs)``.

    Attributes:
        fn: the training function (pickled to each replica).
        config: its first argument.
        fn_kwargs: its keyword arguments (a dict, or a Ray ``ObjectRef`` of one).
        user_files: files to hand the function as its checkpoint (tar bytes), if any.
        collective_timeout_s: ``ADAPTDL_TIMEOUT`` for the replicas (``None``: the core's).
        import_paths: directories new replicas put on their ``sys.path`` before they import
            what rank 0 has imported (a script's own directory).
    """

    fn: Callable[..., Any]
    config: dict
    fn_kwargs: Any = dataclasses.field(default_factory=dict)
    user_files: bytes | None = None
    collective_timeout_s: float | None = None
    import_paths: tuple = ()


@dataclasses.dataclass(frozen=True)
class StatusUpdate:
    """The job's state for its front-end's record.

    Attributes:
        phase: what it does now.
        replicas: replicas it runs on (0 while none runs).
        target: replicas it is going to (its size when nothing changes).
        facts: what the supervisor knows of it (batch size, goodput, epochs, restarts,
            nodes, seconds trained, why it runs below its maximum, in-place checkpoints,
            lost nodes); a copy.
    """

    phase: Phase
    replicas: int
    target: int
    facts: dict


class _Launch:
    """One launch: its replicas (a worker group), when it started and the accelerator
    type its new replicas were reserved on (``None``: any node)."""

    def __init__(self, replicas: int, group: Any, started: float,
                 accelerator_type: str | None = None) -> None:
        self.replicas = replicas
        self.group = group
        self.started = started
        self.accelerator_type = accelerator_type
        self.first_step: float | None = None


def _worker_group(actors: list, resources: Mapping[str, float],
                  trial_info: dict[str, Any]) -> Any:
    """A worker group of replica ``actors`` (the first is rank 0)."""
    from adaptdl_ray.replicas.group import WorkerGroup
    return WorkerGroup(len(actors), resources, None, trial_info, actors=actors)


class Supervisor:
    """Follows one elastic job through its launches (see the module docstring).

    Args:
        job_id: the job's name (its replicas' ``ADAPTDL_JOB_ID``; in log lines).
        spec: the replicas' shape and bounds.
        runner: what the replicas run.
        sizer: decides the job's size (``observe``, ``decision``, ``begin_resize`` of
            :class:`~adaptdl_ray.cluster.sizing.Sizer`).
        pool: the replicas' actors and reservations
            (:class:`~adaptdl_ray.replicas.pool.ReplicaPool`, or a fake).
        trial_info: what each replica's ``tune.get_context()`` says.
        keep_checkpoint: makes a checkpoint (tar bytes) durable; returns where it went,
            or ``None`` if it could not.
        on_status: receives every :class:`StatusUpdate`.
        draining_fn: the nodes being drained now (node id -> deadline in seconds since the
            epoch, or ``None``).
        nodes_fn: the usable cluster (node id -> NodeInfo, draining nodes left out).
        fits_fn: whether ``extra`` more replicas' resources are free now (default: Ray's
            count of free resources).
        stop_timeout_s: how long a stop or resize waits for a batch boundary.
        status_every_s: seconds between reads of rank 0's status and hints.
        checkpoint_interval_s: seconds of training between in-place checkpoints
            (``None``: none).
        kind: what the front-end calls the job, first word of log lines.
        make_group: forms a launch's worker group, ``make_group(actors, resources,
            trial_info)`` (default: a
            :class:`~adaptdl_ray.replicas.group.WorkerGroup` of the actors; tests pass
            fakes).
    """

    def __init__(self, job_id: str, spec: JobSpec, runner: JobRunner, *, sizer: Any,
                 pool: Any, trial_info: dict[str, Any],
                 keep_checkpoint: Callable[[bytes], str | None],
                 on_status: Callable[[StatusUpdate], None] = lambda update: None,
                 draining_fn: Callable[[], Mapping[str, float | None]],
                 nodes_fn: Callable[[], Mapping[Any, Any]],
                 fits_fn: Callable[[int], bool] | None = None,
                 stop_timeout_s: float = DEFAULT_STOP_TIMEOUT_S,
                 status_every_s: float = _STATUS_EVERY_S,
                 checkpoint_interval_s: float | None = DEFAULT_CHECKPOINT_INTERVAL_S,
                 kind: str = "job",
                 make_group: Callable[[list, Mapping[str, float], dict], Any] | None = None
                 ) -> None:
        self.job_id = job_id
        self.spec = spec
        self.runner = runner
        self.sizer = sizer
        self.trial_info = trial_info
        self.stop_timeout_s = stop_timeout_s
        self.status_every_s = status_every_s
        self.kind = kind
        #: What the supervisor knows of the job (see :class:`StatusUpdate`'s ``facts``).
        self.facts: dict[str, Any] = {}
        self._pool = pool
        self._keep = keep_checkpoint
        self._on_status = on_status
        self._drains = DrainWatch(_DRAIN_CHECK_S, draining_fn)
        self._nodes_fn = nodes_fn
        self._grow = Grow(pool, fits_fn, name=self.name)
        self._make_group = make_group or _worker_group
        self._stop_requested = False
        self._trained_s = 0.0
        self._resize_from: float | None = None  # when the pending resize was asked for
        self._resize_s: float | None = None     # what the current launch's cost (measured)
        self._avoid_nodes: set[str] = set()     # nodes a move leaves (being drained)
        self._type: str | None = None           # the accelerator type replicas go on
        self._last_kept: bytes | None = None    # the newest checkpoint kept
        self._in_place = InPlaceCheckpoints(checkpoint_interval_s, stop_timeout_s,
                                            name=self.name)

    @property
    def checkpoint_interval_s(self) -> float | None:
        """Seconds of training between in-place checkpoints (``None``: none)."""
        return self._in_place.interval_s

    @property
    def name(self) -> str:
        """``kind job_id``, as log lines name the job."""
        return f"{self.kind} {self.job_id}"

    # -- control --------------------------------------------------------------------------
    def request_stop(self) -> None:
        """Checkpoint at the next batch boundary and end the run (``STOPPED``); also ends a
        launch that waits for room."""
        self._stop_requested = True

    @property
    def stop_requested(self) -> bool:
        """Whether :meth:`request_stop` was called."""
        return self._stop_requested

    # -- the run --------------------------------------------------------------------------
    def run(self, replicas: int, archive: bytes | None, restarts: int, *,
            trained_s: float = 0.0, accelerator_type: str | None = None) -> RunResult:
        """Run the job from ``archive`` (``None``: from scratch) on ``replicas`` replicas,
        its first launch numbered ``restarts``, to its end; its resources are given back
        whatever happens.

        Args:
            trained_s: seconds it trained in earlier runs (for its remaining time).
            accelerator_type: the type its first replicas go on (the start decision's;
                ``None``: any node).
        """
        self._trained_s = float(trained_s)
        self._type = accelerator_type
        try:
            return self._run(replicas, archive, restarts)
        finally:
            self._teardown()

    def _run(self, replicas: int, archive: bytes | None, restarts: int) -> RunResult:
        self.facts["restarts"] = restarts
        launch = self._launch(replicas, archive, restarts)
        while True:
            if launch is None:  # stopped while waiting for room
                return RunResult(Ending.STOPPED, restarts)
            try:
                end = self._watch(launch)
            except Exception as exc:  # noqa: BLE001 - a lost node, or the job's failure
                verdict = judge_failure(exc, launch.group, lambda: self._nodes_fn().keys(),
                                        name=self.name)
                if verdict.verdict is Verdict.FAIL:
                    LOG.error("%s failed: %s", self.name, exc)
                    self._keep_checkpoint(launch)
                    return RunResult(Ending.FAILED, restarts, verdict.error)
                # Not the job's failure: continue from its newest checkpoint.
                self._teardown()
                archive = self._newest_kept(archive)
                replicas = self._room_elsewhere(launch)
                restarts += 1
                self.facts["nodes_lost"] = int(self.facts.get("nodes_lost", 0)) + \
                    len(verdict.lost_nodes)
                LOG.info("%s: continuing with %d replica(s)", self.name, replicas)
                launch = self._launch(replicas, archive, restarts)
                continue
            self._trained_s += time.time() - (launch.first_step or launch.started)
            archive = self._keep_checkpoint(launch) or archive
            if end.final:
                return RunResult(end.kind, restarts)
            restarts += 1
            launch = self._relaunch(launch, end.replicas, archive, restarts)

    def _newest_kept(self, archive: bytes | None) -> bytes | None:
        """After a lost node: the newest checkpoint the job kept (its in-place ones)."""
        return self._last_kept if self._last_kept is not None else archive

    # -- launches -------------------------------------------------------------------------
    def _status(self, phase: Phase, replicas: int, target: int | None = None) -> None:
        self._on_status(StatusUpdate(phase, replicas, replicas if target is None else target,
                                     dict(self.facts, trained_s=self._trained_s)))

    def _launch(self, replicas: int, archive: bytes | None, restarts: int, *,
                keep: Sequence[Any] = ()) -> _Launch | None:
        """Start the function on ``replicas`` replicas: the idle actors ``keep`` (they keep
        their ranks' order, the first is rank 0) and new ones (the grow started while the
        job trained, if it brings as many, else reserved now). ``None``: a stop came while
        waiting for room.

        Raises:
            TimeoutError: the cluster had no room for them within _PLACEMENT_TIMEOUT_S.
        """
        started = time.time()
        self._resize_s = None  # (measured anew for this launch: an older one is not sent)
        self._status(Phase.PENDING, 0, replicas)
        need = replicas - len(keep)
        kind = self._type
        reservation = self._grow.take(need, kind)
        if need > 0 and reservation is None:
            reservation = self._pool.reserve(need, accelerator_type=kind)
        logged = started
        while reservation is not None and not reservation.up(wait_s=1.0):
            now = time.time()
            if self._stop_requested or now - started > _PLACEMENT_TIMEOUT_S:
                reservation.cancel()
                self._pool.release(keep)
                if self._stop_requested:
                    return None
                on = f" on {kind} nodes" if kind else ""
                raise TimeoutError(
                    f"the cluster had no room for {need} replica(s) of "
                    f"{dict(self.spec.resources)}{on} within {_PLACEMENT_TIMEOUT_S:.0f} s: "
                    "lower the minimum number of replicas or free resources")
            if now - logged > _WAITING_LOG_EVERY_S:
                LOG.info("%s: waiting for room for %d replica(s)", self.name, need)
                logged = now
        actors = [*keep, *(self._pool.take(reservation) if reservation is not None else [])]
        try:
            group = self._make_group(actors, self.spec.resources, self.trial_info)
            group.start(self.runner.fn, self.runner.config, fn_kwargs=self.runner.fn_kwargs,
                        archive=archive, user_files=self.runner.user_files,
                        num_restarts=restarts, job_id=self.job_id,
                        timeout_s=self.runner.collective_timeout_s)
        except BaseException:
            self._pool.release(actors)
            raise
        self.facts["restarts"] = restarts
        return _Launch(replicas, group, started, kind)

    def _relaunch(self, launch: _Launch, target: int, archive: bytes | None,
                  restarts: int) -> _Launch | None:
        """Continue a checkpointed launch with ``target`` replicas, keeping the replicas
        that stay (their processes, torch imported): those off the nodes being drained and
        on the accelerator type asked for, lowest ranks first (rank 0 stays rank 0); the
        others stop. If the survivors cannot be made idle, every replica is replaced."""
        group = launch.group
        avoid, self._avoid_nodes = self._avoid_nodes, set()
        avoid |= self._off_type(group.node_ids, self._type)
        stay = [a for a, node in zip(group.actors, group.node_ids) if node not in avoid]
        stay = hand_over(group.actors, stay[:target], self.trial_info,
                         release=self._pool.release)
        LOG.info("%s: %d replica(s) stay, %d start", self.name, len(stay), target - len(stay))
        return self._launch(target, archive, restarts, keep=stay)

    # -- following a launch -----------------------------------------------------------------
    def _watch(self, launch: _Launch) -> LaunchEnd:
        """Follow a launch until it ends or must end.

        Raises:
            WorkerFailed, TimeoutError: a replica failed or did not stop in time.
        """
        group = launch.group
        next_status = 0.0
        self._drains.reset()
        self._in_place.restart()
        self._status(Phase.RUNNING, launch.replicas)
        while True:
            if self._stop_requested:
                return self._checkpoint_and_end(launch, Phase.STOPPING, Ending.STOPPED, 0)
            self._save_in_place(launch)
            outcomes = group.finished(min(1.0, self.status_every_s))
            if outcomes is not None:
                if boundary_of(outcomes) is Boundary.FINISHED:
                    return LaunchEnd(Ending.FINISHED)
                LOG.info("%s checkpointed and stopped itself; relaunching", self.name)
                return LaunchEnd(Change.RELAUNCH, launch.replicas)
            target = self._move_target(launch)
            if target is not None:
                self._resize_from = time.time()  # (its cost is a relaunch's, too)
                return self._checkpoint_and_end(launch, Phase.MOVING, Change.MOVE, target)
            if time.monotonic() >= next_status:
                next_status = time.monotonic() + self.status_every_s
                self._observe(launch)
            decision = self.sizer.decision()
            target = decision.replicas
            kind = decision.accelerator_type
            self._explain(launch, decision)
            # (A move to another type is a resize, also at the same size.)
            moves = decision.action == "resize" and \
                bool(self._off_type(launch.group.node_ids, kind))
            if decision.action != "resize" or target < self.spec.min_replicas:
                self._grow.cancel()
                continue
            # A grow starts its new replicas while the job trains; a move first gives its
            # replicas back (the type's room may be what a job moving the other way frees).
            step = resize_step(launch.replicas, target, moves=moves,
                               grow_ready=lambda extra: self._grow_ready(launch, extra, kind),
                               cancel_grow=self._grow.cancel)
            if step is not ResizeStep.GO:
                continue
            LOG.info("%s: resizing %d -> %d replicas%s (%s)", self.name, launch.replicas,
                     target, f" on {kind}" if kind else "", decision.reason)
            if moves:
                self._grow.cancel()
            self._type = kind
            self.sizer.begin_resize(decision)
            self._resize_from = time.time()
            return self._checkpoint_and_end(launch, Phase.RESIZING, Change.RESIZE, target)

    def _explain(self, launch: _Launch, decision: Decision) -> None:
        """Say once, in the log and in the job's facts (``adaptdl-ray ls``), why the job
        runs below its maximum when its decision says why (the cluster has room, but the
        policy or the resize rule keeps it where it is)."""
        below = self.spec.max_replicas is None or launch.replicas < self.spec.max_replicas
        reason = decision.reason if below and decision.action in ("keep", "hold") and \
            decision.reason != "no change" else None
        if reason == self.facts.get("reason"):
            return
        self.facts["reason"] = reason
        if reason is not None:
            LOG.info("%s: on %d replica(s)%s: %s", self.name, launch.replicas,
                     f" of up to {self.spec.max_replicas}" if self.spec.max_replicas else "",
                     reason)
        self._status(Phase.RUNNING, launch.replicas)

    def _checkpoint_and_end(self, launch: _Launch, phase: Phase, kind: Ending | Change,
                            target: int) -> LaunchEnd:
        """Stop the launch's replicas at their next batch boundary (each checkpoints),
        saying ``phase`` meanwhile; ``LaunchEnd(kind, target)``, or ``FINISHED`` if the
        function had ended anyway."""
        self._status(phase, launch.replicas, target or launch.replicas)
        outcomes = launch.group.stop(self.stop_timeout_s)
        return LaunchEnd(Ending.FINISHED) if boundary_of(outcomes) is Boundary.FINISHED \
            else LaunchEnd(kind, target)

    # -- growing while training -----------------------------------------------------------
    def _grow_ready(self, launch: _Launch, extra: int, kind: str | None = None) -> bool:
        """Whether ``extra`` new replicas are up for a grow (see
        :class:`~adaptdl_ray.replicas.pool.Grow`) on nodes of ``kind`` (``None``: any),
        warmed with what rank 0 imported (the function's modules too) and the runner's
        import paths."""
        return self._grow.ready(extra, lambda: (launch.group.imported_modules(),
                                                list(self.runner.import_paths)), kind)

    def _off_type(self, node_ids: Sequence[Any], kind: str | None) -> set:
        """The nodes of ``node_ids`` not of ``kind`` (see :func:`nodes_off_type`; none
        when ``kind`` is ``None``). If the cluster cannot be read, none (the replicas stay
        where they are)."""
        if kind is None:
            return set()
        try:
            return nodes_off_type(self._nodes_fn(), node_ids, kind)
        except Exception as exc:  # noqa: BLE001 - keep the replicas; say why
            LOG.warning("%s: could not read the cluster's node types (%s)", self.name, exc)
            return set()

    # -- nodes ------------------------------------------------------------------------------
    def _move_target(self, launch: _Launch) -> int | None:
        """If a node under the launch's replicas is being drained (checked every
        ``_DRAIN_CHECK_S``), the replicas to relaunch with on the other nodes (as many as
        now, if they fit there, else as many as fit, at least ``min_replicas``); ``None``
        otherwise."""
        moves = self._drains.check(lambda: {self.job_id: launch.group.node_ids})
        if not moves:
            return None
        _, hit, reason = moves[0]
        self._avoid_nodes = set(hit)
        target = self._room_elsewhere(launch)
        LOG.warning("%s: %s under its replicas: checkpointing at the next batch boundary and "
                    "moving to the other nodes with %d replica(s)", self.name, reason, target)
        return target

    def _room_elsewhere(self, launch: _Launch) -> int:
        """Replicas to continue with after losing a node or moving off a draining one (see
        :meth:`~adaptdl_core.decision.JobSpec.fitted`; the same size if the cluster
        cannot be read: Ray then finds the room)."""
        try:
            return self.spec.fitted(launch.replicas, self._nodes_fn())
        except Exception as exc:  # noqa: BLE001 - ask for the same size; Ray finds room
            LOG.warning("%s: could not read the cluster (%s)", self.name, exc)
            return launch.replicas

    # -- what the replicas say ------------------------------------------------------------
    def _observe(self, launch: _Launch) -> None:
        """Pass rank 0's status and hints to the sizer, and to the job's facts."""
        try:
            snap = launch.group.snapshot()
        except TimeoutError as exc:
            LOG.warning("%s: %s", self.name, exc)
            return
        if snap is None:
            return
        status = snap["status"]
        if launch.first_step is None:
            first = launch.group.timeline().get("first_step")
            if first is not None:
                launch.first_step = first
                if self._resize_from is not None:
                    self._resize_s = max(first - self._resize_from, 0.0)
                    LOG.info("%s: the resize took %.1f s to the first step", self.name,
                             self._resize_s)
                    self._resize_from = None
        trained = self._trained_s + (time.time() - (launch.first_step or launch.started))
        progress = progress_from_status(
            status, trained_s=trained, resize_cost_s=self._resize_s,
            launch_s=(launch.first_step - launch.started) if launch.first_step else None)
        self.sizer.observe(launch.replicas, nodes=list(launch.group.node_ids),
                           hints=snap["hints"], progress=progress)
        self.facts.update({k: status.get(k) for k in (
            "batch_size", "goodput", "efficiency", "epochs_done", "epochs", "restarts")})
        self.facts["nodes"] = launch.group.num_nodes
        self._on_status(StatusUpdate(Phase.RUNNING, launch.replicas, launch.replicas,
                                     dict(self.facts, trained_s=trained)))

    # -- checkpoints --------------------------------------------------------------------------
    def _save_in_place(self, launch: _Launch) -> None:
        """When one is due, checkpoint at the next batch boundary, keep training, and keep
        the checkpoint (see :class:`~adaptdl_ray.supervisor.in_place.InPlaceCheckpoints`).

        Raises:
            WorkerFailed: a replica failed meanwhile.
            ray.exceptions.RayError: rank 0's checkpoint could not be fetched."""
        saved = self._in_place.save_if_due(launch.group)
        if saved is not None and self._keep_archive(saved.archive) is not None:
            # (how many in-place checkpoints, and the seconds they took)
            self.facts["checkpoints"] = int(self.facts.get("checkpoints", 0)) + 1
            self.facts["checkpoint_s"] = float(self.facts.get("checkpoint_s", 0.0)) + \
                saved.seconds

    def _keep_checkpoint(self, launch: _Launch) -> bytes | None:
        """Hand rank 0's newest checkpoint to the front-end to keep; returns its bytes
        (``None``: rank 0 wrote none, it is gone, or it was not kept)."""
        import ray
        try:
            archive = launch.group.checkpoint_archive()
        except ray.exceptions.RayError as exc:
            LOG.warning("%s: could not fetch rank 0's checkpoint: %s", self.name, exc)
            return None
        return self._keep_archive(archive)

    def _keep_archive(self, archive: bytes | None) -> bytes | None:
        """Hand ``archive`` to the front-end to keep; returns it (``None``: there was none
        or it was not kept)."""
        if archive is None:
            return None
        where = self._keep(archive)
        if where is None:
            return None
        self._last_kept = archive
        LOG.info("%s: checkpoint kept in %s", self.name, where)
        return archive

    def _teardown(self) -> None:
        """Stop every replica of the job, started or starting, and free their resources."""
        self._grow.cancel()
        self._pool.release_all()
