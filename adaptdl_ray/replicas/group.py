"""N replica actors of one trial, inside the trial's placement group.

Bundle ``i`` of the trial's placement group holds replica ``i`` (the trial actor itself
sits in Tune's empty head bundle, which the real placement group does not contain).
Ranks are ordered by node so that replicas sharing a node get consecutive ranks; rank 0
hosts the job's rendezvous store on a free port of its node. Removing the placement group
(Tune does that when the trial pauses or ends) kills the actors; :meth:`WorkerGroup.shutdown`
kills them sooner. :class:`~adaptdl_ray.replicas.in_process.InProcessReplica` runs the one replica of a
single-replica CPU trial inside the trial actor instead.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Mapping, Sequence

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from adaptdl_core.launch import replica_env
from adaptdl_ray.replicas.failures import (ReplicaFailure, WorkerFailed, exception_record,
                                           failure_message, first_in_cause, first_line_of,
                                           stop_timeout_error)
from adaptdl_ray.replicas.worker import ReplicaWorker

LOG = logging.getLogger(__name__)

__all__ = ["WorkerGroup", "job_env", "new_workers", "recycle_workers", "stop_workers"]

# Threads per worker actor: the training function, result polling, checkpoint requests.
_ACTOR_CONCURRENCY = 4
# After one replica failed, how long to wait for the others' outcomes to tell the cause.
_SETTLE_S = 2.0


def job_env(rank: int, num_replicas: int, master_addr: str, master_port: int, num_nodes: int,
             *, num_restarts: int, job_id: str, timeout_s: float | None) -> dict[str, str]:
    """The ``ADAPTDL_*`` variables of replica ``rank`` (the worker adds its checkpoint
    path: a fresh directory on its own node)."""
    extra = {"ADAPTDL_NUM_NODES": str(num_nodes), "ADAPTDL_JOB_ID": job_id}
    if timeout_s is not None:
        extra["ADAPTDL_TIMEOUT"] = str(timeout_s)
    return replica_env(rank, num_replicas, master_port, master_addr=master_addr,
                       num_restarts=num_restarts, extra_env=extra, base_env={})


def new_workers(resources_per_replica: Mapping[str, float], trial_info: dict[str, Any],
                placements: Sequence[tuple[Any, int] | None]) -> list[Any]:
    """Create one replica actor per entry of ``placements`` (returns at once; each actor
    imports torch as it starts, see ``ReplicaWorker``).

    Args:
        resources_per_replica: each actor's resources, e.g. ``{"CPU": 1}``.
        trial_info: passed to each worker for ``tune.get_context``.
        placements: per actor, ``(placement group, bundle index)`` to run in, or ``None``
            to let Ray schedule it anywhere.
    """
    remote_cls = ray.remote(ReplicaWorker)
    resources = dict(resources_per_replica)
    custom = {k: v for k, v in resources.items() if k not in ("CPU", "GPU")}
    actors = []
    for i, placement in enumerate(placements):
        options: dict[str, Any] = {"num_cpus": float(resources.get("CPU", 0)),
                                   "num_gpus": float(resources.get("GPU", 0)),
                                   "max_concurrency": _ACTOR_CONCURRENCY}
        if custom:
            options["resources"] = custom
        if placement is not None:
            options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                placement[0], placement_group_bundle_index=placement[1])
        actors.append(remote_cls.options(**options).remote(i, trial_info))
    return actors


def recycle_workers(actors: Sequence[Any], trial_info: dict[str, Any],
                    timeout_s: float = 60.0) -> bool:
    """Make idle replica actors forget their job (see ``ReplicaWorker.recycle``) so that
    they can run another; False if one is still running its function, died, or did not
    answer within ``timeout_s`` (the caller should then replace them)."""
    try:
        return all(ray.get([a.recycle.remote(trial_info) for a in actors], timeout=timeout_s))
    except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError):
        LOG.warning("could not recycle the replica actors; fresh ones will start",
                    exc_info=True)
        return False


def stop_workers(actors: Sequence[Any]) -> None:
    """Remove the actors' local files and kill them (best effort: some may be gone)."""
    try:
        ray.wait([a.remove_local_files.remote() for a in actors],
                 num_returns=len(actors), timeout=10)
    except Exception:  # noqa: BLE001 - best effort: the actors may be gone already
        pass
    for actor in actors:
        try:
            ray.kill(actor)
        except Exception:  # noqa: BLE001 - already dead is fine
            pass


class WorkerGroup:
    """Start ``num_replicas`` worker actors and find where they run.

    Args:
        num_replicas: number of replicas (one per bundle of the placement group).
        resources_per_replica: e.g. ``{"CPU": 1}`` or ``{"CPU": 2, "GPU": 1}``.
        placement_group: the trial's placement group (``None`` outside Tune: the actors are
            then scheduled anywhere, for tests and the single-job runner).
        trial_info: passed to each worker for ``tune.get_context``.
        timeout_s: how long to wait for the actors to start.
        actors: replica actors to form the group of instead of starting new ones (from
            :func:`new_workers`, or survivors of an earlier group made idle by
            :func:`recycle_workers`); ``placement_group`` is then unused. The first keeps
            rank 0.
        bundles: the placement group's bundle indices to start the replicas in (default
            ``0 .. num_replicas - 1``; fewer than the group's after a lost node whose
            bundles have no room).

    Raises:
        TimeoutError: if the actors are not up within ``timeout_s`` (names the ranks).
        ValueError: ``actors`` (or ``bundles``) does not hold ``num_replicas`` entries.
    """

    def __init__(self, num_replicas: int, resources_per_replica: Mapping[str, float],
                 placement_group: Any, trial_info: dict[str, Any],
                 timeout_s: float = 300.0, *, actors: Sequence[Any] | None = None,
                 bundles: Sequence[int] | None = None) -> None:
        self.created_at = time.time()
        self.num_replicas = num_replicas
        self.resources_per_replica = dict(resources_per_replica)
        if bundles is not None and len(bundles) != num_replicas:
            raise ValueError(f"bundles: {len(bundles)} given for {num_replicas} replicas")
        if actors is None:
            placements = [(placement_group, i) if placement_group is not None else None
                          for i in (range(num_replicas) if bundles is None else bundles)]
            actors = new_workers(self.resources_per_replica, trial_info, placements)
        elif len(actors) != num_replicas:
            raise ValueError(f"actors: {len(actors)} given for {num_replicas} replicas")
        actors = list(actors)
        addresses = self._get([a.node_address.remote() for a in actors], timeout_s,
                              "start the replica actors")
        # Consecutive ranks on the same node: rank 0 on the first node seen.
        order = sorted(range(num_replicas), key=lambda i: (addresses[i][1] != addresses[0][1],
                                                           addresses[i][1], i))
        self.actors = [actors[i] for i in order]
        self.node_ips = [addresses[i][0] for i in order]
        self.node_ids = [addresses[i][1] for i in order]
        self.num_nodes = len(set(self.node_ids))
        self.master_addr = self.node_ips[0]
        self.master_port = self._get(self.actors[0].free_port.remote(), timeout_s,
                                     "pick a port on rank 0's node")
        self.workers_up_at = time.time()
        self._runs: list[ray.ObjectRef] = []
        self.started_at: float | None = None

    @staticmethod
    def _get(refs: Any, timeout_s: float, what: str) -> Any:
        try:
            return ray.get(refs, timeout=timeout_s)
        except ray.exceptions.GetTimeoutError as exc:
            raise TimeoutError(f"could not {what} within {timeout_s:.0f} s: is the cluster "
                               f"short of the resources the trial needs?") from exc

    def env_for(self, rank: int, *, num_restarts: int, job_id: str,
                timeout_s: float | None) -> dict[str, str]:
        """The ``ADAPTDL_*`` variables of replica ``rank`` (the worker adds its checkpoint
        path: a fresh directory on its own node)."""
        return job_env(rank, self.num_replicas, self.master_addr, self.master_port,
                        self.num_nodes, num_restarts=num_restarts, job_id=job_id,
                        timeout_s=timeout_s)

    def describe(self, rank: int) -> str:
        """Replica ``rank`` in words for an error message: ``replica R of N on node IP``."""
        return f"replica {rank} of {self.num_replicas} on node {self.node_ips[rank]}"

    def world_of(self, rank: int) -> dict[str, int]:
        """Replica ``rank``'s place in the job, as Ray Train reports it to its workers:
        ``world_rank``, ``world_size``, ``local_rank`` and ``local_world_size`` (among the
        replicas on its node) and ``node_rank``."""
        nodes = list(dict.fromkeys(self.node_ids))  # in rank order (ranks are node-grouped)
        node = self.node_ids[rank]
        same = [r for r, n in enumerate(self.node_ids) if n == node]
        return {"world_rank": rank, "world_size": self.num_replicas,
                "local_rank": same.index(rank), "local_world_size": len(same),
                "node_rank": nodes.index(node)}

    def start(self, fn: Callable[..., Any], config: dict, *, fn_kwargs: Any,
              archive: bytes | None, user_files: bytes | None, num_restarts: int,
              job_id: str, timeout_s: float | None) -> None:
        """Run ``fn(config, **fn_kwargs)`` on every replica (returns at once).

        Args:
            fn_kwargs: the keyword arguments (a dict, or an ``ObjectRef`` of one, which Ray
                resolves on each replica).
            archive, user_files: the job's checkpoint and the user's checkpoint files to
                resume from (tar bytes, or ``None``); sent once through the object store.
        """
        archive_ref = ray.put(archive) if archive is not None else None
        user_ref = ray.put(user_files) if user_files is not None else None
        threads = max(1, int(self.resources_per_replica.get("CPU", 1)))
        self.started_at = time.time()
        self._runs = [
            actor.run.remote(fn, config, fn_kwargs,
                             self.env_for(rank, num_restarts=num_restarts, job_id=job_id,
                                          timeout_s=timeout_s),
                             archive_ref, user_ref, threads, self.world_of(rank))
            for rank, actor in enumerate(self.actors)]

    def recycle(self, trial_info: dict[str, Any], timeout_s: float = 60.0) -> bool:
        """Make this group's (idle) actors serve a new job: each forgets the previous one
        (see ``ReplicaWorker.recycle``) and rank 0 picks a new port for the job's store.

        Returns:
            False if a replica is still running its function, died, or did not answer
            within ``timeout_s``: the caller should :meth:`shutdown` this group and start a
            fresh one.
        """
        if not self.actors:
            return False
        if self._runs:
            done, _ = ray.wait(self._runs, num_returns=len(self._runs), timeout=0)
            if len(done) < len(self._runs):
                return False
        self.created_at = time.time()
        if not recycle_workers(self.actors, trial_info, timeout_s):
            return False
        try:
            self.master_port = ray.get(self.actors[0].free_port.remote(), timeout=timeout_s)
        except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError):
            LOG.warning("could not pick a port on rank 0's node; fresh replicas will start",
                        exc_info=True)
            return False
        self.workers_up_at = time.time()
        self._runs = []
        self.started_at = None
        return True

    @property
    def started(self) -> bool:
        """True once the training function was started on the replicas."""
        return bool(self._runs)

    def next_results(self, timeout_s: float) -> tuple[list[dict], bool]:
        """Rank 0's new reports, waiting up to ``timeout_s`` for one or for the function's
        end, and whether rank 0's function has returned (then no report follows)."""
        return tuple(ray.get(self.actors[0].next_results.remote(timeout_s)))

    def finished(self, wait_s: float = 0.0) -> list[dict] | None:
        """Every replica's outcome once all have returned (waiting up to ``wait_s``),
        else ``None``.

        Raises:
            WorkerFailed: as soon as one replica failed (see :meth:`_raise_if_failed`).
        """
        done, _ = ray.wait(self._runs, num_returns=len(self._runs), timeout=wait_s)
        for ref in done:
            self._raise_if_failed(ref)
        if len(done) < len(self._runs):
            return None
        return ray.get(self._runs)

    def _raise_if_failed(self, ref: ray.ObjectRef) -> None:
        """Raise :class:`WorkerFailed` if the replica behind ``ref`` failed.

        One replica's failure makes the others fail too (a collective loses its peer), so
        the error names the replica that failed first in cause (see
        :func:`~adaptdl_ray.replicas.failures.first_in_cause`), waiting up to ``_SETTLE_S`` for
        the others' outcomes.
        """
        if self._failure(self._runs.index(ref)) is None:
            return
        ray.wait(self._runs, num_returns=len(self._runs), timeout=_SETTLE_S)
        failures = [f for f in map(self._failure, range(len(self._runs))) if f is not None]
        cause = first_in_cause(failures)
        others = [f.rank for f in failures if f.rank != cause.rank]
        raise WorkerFailed(failure_message(cause, self.describe(cause.rank), others),
                           cause, others)

    def _failure(self, rank: int) -> ReplicaFailure | None:
        """Replica ``rank``'s failure if its function has ended and failed, else None."""
        ref = self._runs[rank]
        done, _ = ray.wait([ref], timeout=0)
        if not done:
            return None
        node = self.node_ips[rank]
        try:
            outcome = ray.get(ref)
        except ray.exceptions.RayActorError as exc:
            return ReplicaFailure(rank, node, died=True, text=first_line_of(exc))
        except ray.exceptions.RayError as exc:
            # run() failed outside the function's own try (its arguments could not be
            # unpickled, the checkpoint not unpacked): no outcome, only Ray's error.
            cause = getattr(exc, "cause", None) or exc
            return ReplicaFailure.from_outcome(rank, node, {
                "traceback": str(exc), **exception_record(cause, time.time())})
        if outcome["status"] != "error":
            return None
        return ReplicaFailure.from_outcome(rank, node, outcome)

    def stop(self, timeout_s: float) -> list[dict]:
        """Ask every replica to checkpoint at the next batch boundary, wait for all to end.

        Returns:
            every replica's outcome (``checkpointed``, or ``finished`` if the job ended first).

        Raises:
            TimeoutError: if a replica has not stopped within ``timeout_s`` (names it).
            WorkerFailed: if a replica failed.
        """
        ray.get([a.request_stop.remote() for a in self.actors])
        _, pending = ray.wait(self._runs, num_returns=len(self._runs), timeout=timeout_s)
        if pending:
            raise stop_timeout_error(sorted(self._runs.index(ref) for ref in pending), timeout_s)
        for ref in self._runs:
            self._raise_if_failed(ref)
        return ray.get(self._runs)

    def save(self, timeout_s: float) -> dict[str, Any]:
        """Checkpoint at the next batch boundary on every replica and keep training.

        Returns:
            rank 0's answer (see ``ReplicaWorker.save``): ``taken`` (False if the function
            ended first), ``path`` of the checkpoint on rank 0, ``index``.

        Raises:
            WorkerFailed: a replica failed before the checkpoint.
            TimeoutError: no batch boundary within ``timeout_s``.
        """
        refs = [actor.save.remote(timeout_s) for actor in self.actors]
        pending = list(refs)
        while pending:
            _, pending = ray.wait(pending, num_returns=len(pending), timeout=1.0)
            if pending:
                # A failed replica never reaches the boundary: do not wait for the timeout
                # (a failure after the checkpoint is the next step's to report).
                done, _ = ray.wait(self._runs, num_returns=len(self._runs), timeout=0)
                for ref in done:
                    self._raise_if_failed(ref)
        try:
            return ray.get(refs)[0]
        except ray.exceptions.RayTaskError as exc:
            if isinstance(exc.cause, TimeoutError):
                raise TimeoutError(str(exc.cause)) from None
            raise

    def checkpoint_archive(self, path: str | None = None) -> bytes | None:
        """Rank 0's checkpoint ``path`` (default: its newest) as tar bytes (``None`` if it
        never saved one)."""
        return ray.get(self.actors[0].checkpoint_archive.remote(path))

    def imported_modules(self, timeout_s: float = 10.0) -> list[str]:
        """The modules rank 0's process has imported (see ``ReplicaWorker.warm_up``).

        Raises:
            TimeoutError: rank 0 did not answer within ``timeout_s``.
        """
        return self._get(self.actors[0].imported_modules.remote(), timeout_s,
                         f"list the modules of {self.describe(0)}")

    def snapshot(self, timeout_s: float = 10.0) -> dict[str, Any] | None:
        """Rank 0's training status and scheduler hints now (see
        ``ReplicaWorker.snapshot``; ``None`` before its first step or after its end).

        Raises:
            TimeoutError: rank 0 did not answer within ``timeout_s``.
        """
        try:
            return ray.get(self.actors[0].snapshot.remote(), timeout=timeout_s)
        except ray.exceptions.GetTimeoutError as exc:
            raise TimeoutError(f"{self.describe(0)} did not report its status within "
                               f"{timeout_s:.0f} s") from exc

    def timeline(self) -> dict[str, float]:
        """Rank 0's launch milestones (see ``ReplicaWorker.timeline``) plus the group's
        ``created`` and ``workers_up`` times."""
        out = ray.get(self.actors[0].timeline.remote())
        out.update(created=self.created_at, workers_up=self.workers_up_at)
        return out

    def shutdown(self) -> None:
        """Remove the workers' local files and kill the actors (idempotent)."""
        stop_workers(getattr(self, "actors", []))
        self.actors = []
        self._runs = []
