"""N replica actors of one trial, inside the trial's placement group.

Bundle ``i`` of the trial's placement group holds replica ``i`` (the trial actor itself
sits in Tune's empty head bundle, which the real placement group does not contain).
Ranks are ordered by node so that replicas sharing a node get consecutive ranks; rank 0
hosts the job's rendezvous store on a free port of its node. Removing the placement group (Tune does that when the trial pauses or ends) kills
the actors; :meth:`WorkerGroup.shutdown` kills them sooner.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Mapping

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from adaptdl_core.launch import replica_env
from adaptdl_ray.tune.worker import ReplicaWorker

LOG = logging.getLogger(__name__)

__all__ = ["WorkerGroup", "WorkerFailed"]

# Threads per worker actor: the training function, result polling, stop requests.
_ACTOR_CONCURRENCY = 4


class WorkerFailed(RuntimeError):
    """A replica of the trial failed; the message carries its traceback."""


class WorkerGroup:
    """Start ``num_replicas`` worker actors and find where they run.

    Args:
        num_replicas: number of replicas (one per bundle of the placement group).
        resources_per_replica: e.g. ``{"CPU": 1}`` or ``{"CPU": 2, "GPU": 1}``.
        placement_group: the trial's placement group (``None`` outside Tune: the actors are
            then scheduled anywhere, for tests and the single-job runner).
        trial_info: passed to each worker for ``tune.get_context``.
        timeout_s: how long to wait for the actors to start.

    Raises:
        TimeoutError: if the actors are not up within ``timeout_s`` (names the ranks).
    """

    def __init__(self, num_replicas: int, resources_per_replica: Mapping[str, float],
                 placement_group: Any, trial_info: dict[str, Any],
                 timeout_s: float = 300.0) -> None:
        self.created_at = time.time()
        self.num_replicas = num_replicas
        self.resources_per_replica = dict(resources_per_replica)
        remote_cls = ray.remote(ReplicaWorker)
        cpus = float(self.resources_per_replica.get("CPU", 0))
        gpus = float(self.resources_per_replica.get("GPU", 0))
        custom = {k: v for k, v in self.resources_per_replica.items() if k not in ("CPU", "GPU")}
        actors = []
        for i in range(num_replicas):
            options: dict[str, Any] = {"num_cpus": cpus, "num_gpus": gpus,
                                       "max_concurrency": _ACTOR_CONCURRENCY}
            if custom:
                options["resources"] = custom
            if placement_group is not None:
                options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                    placement_group, placement_group_bundle_index=i)
            actors.append(remote_cls.options(**options).remote(i, trial_info))
        addresses = self._get([a.node_address.remote() for a in actors], timeout_s,
                              "start the replica actors")
        # Consecutive ranks on the same node: rank 0 on the first node seen.
        order = sorted(range(num_replicas), key=lambda i: (addresses[i][1] != addresses[0][1],
                                                           addresses[i][1], i))
        self.actors = [actors[i] for i in order]
        self.node_ips = [addresses[i][0] for i in order]
        self.num_nodes = len({addresses[i][1] for i in order})
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
        extra = {"ADAPTDL_NUM_NODES": str(self.num_nodes), "ADAPTDL_JOB_ID": job_id}
        if timeout_s is not None:
            extra["ADAPTDL_TIMEOUT"] = str(timeout_s)
        return replica_env(rank, self.num_replicas, self.master_port,
                           master_addr=self.master_addr, num_restarts=num_restarts,
                           extra_env=extra, base_env={})

    def start(self, fn: Callable[[dict], Any], config: dict, *, archive: bytes | None,
              num_restarts: int, job_id: str, timeout_s: float | None) -> None:
        """Run ``fn(config)`` on every replica (returns at once)."""
        archive_ref = ray.put(archive) if archive is not None else None
        threads = max(1, int(self.resources_per_replica.get("CPU", 1)))
        self.started_at = time.time()
        self._runs = [
            actor.run.remote(fn, config, self.env_for(rank, num_restarts=num_restarts,
                                                      job_id=job_id, timeout_s=timeout_s),
                             archive_ref, threads)
            for rank, actor in enumerate(self.actors)]

    @property
    def started(self) -> bool:
        """True once the training function was started on the replicas."""
        return bool(self._runs)

    def next_results(self, timeout_s: float) -> list[dict]:
        """Rank 0's reports, waiting up to ``timeout_s`` for at least one."""
        return ray.get(self.actors[0].next_results.remote(timeout_s))

    def finished(self, wait_s: float = 0.0) -> list[dict] | None:
        """Every replica's outcome once all have returned (waiting up to ``wait_s``),
        else ``None``.

        Raises:
            WorkerFailed: as soon as one replica failed (its traceback in the message).
        """
        done, _ = ray.wait(self._runs, num_returns=len(self._runs), timeout=wait_s)
        for ref in done:
            self._raise_if_failed(ref)
        if len(done) < len(self._runs):
            return None
        return ray.get(self._runs)

    def _raise_if_failed(self, ref: ray.ObjectRef) -> None:
        rank = self._runs.index(ref)
        try:
            outcome = ray.get(ref)
        except ray.exceptions.RayActorError as exc:
            raise WorkerFailed(f"replica {rank} died: {exc}") from exc
        if outcome["status"] == "error":
            raise WorkerFailed(f"replica {rank} of {self.num_replicas} failed:\n"
                               f"{outcome['traceback']}")

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
            ranks = sorted(self._runs.index(ref) for ref in pending)
            raise TimeoutError(
                f"replicas {ranks} did not reach a batch boundary within {timeout_s:.0f} s of "
                "the stop request; the training function must iterate an AdaptiveDataLoader "
                "(the stop is taken at its batch boundaries)")
        for ref in self._runs:
            self._raise_if_failed(ref)
        return ray.get(self._runs)

    def checkpoint_archive(self) -> bytes | None:
        """Rank 0's newest checkpoint as tar bytes (``None`` if it never saved one)."""
        return ray.get(self.actors[0].checkpoint_archive.remote())

    def timeline(self) -> dict[str, float]:
        """Rank 0's launch milestones (see ``ReplicaWorker.timeline``) plus the group's
        ``created`` and ``workers_up`` times."""
        out = ray.get(self.actors[0].timeline.remote())
        out.update(created=self.created_at, workers_up=self.workers_up_at)
        return out

    def shutdown(self) -> None:
        """Remove the workers' local files and kill the actors (idempotent)."""
        actors = getattr(self, "actors", [])
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
        self.actors = []
        self._runs = []
