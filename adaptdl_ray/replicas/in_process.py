"""The one replica of a single-replica CPU trial, run in the trial actor itself: no second
process, and torch is imported once (see ``single_replica_in_process`` of
:func:`~adaptdl_ray.tune.creator.AdaptDLTrainableCreator`). It answers as a
:class:`~adaptdl_ray.replicas.group.WorkerGroup` of one replica does.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from typing import Any, Callable, Mapping

import ray
import ray.cloudpickle as cloudpickle

from adaptdl_ray.replicas.failures import (ReplicaFailure, WorkerFailed, failure_message,
                                           stop_timeout_error)
from adaptdl_ray.replicas.group import job_env
from adaptdl_ray.replicas.worker import ReplicaWorker

LOG = logging.getLogger(__name__)

__all__ = ["InProcessReplica"]


class InProcessReplica:
    """The one replica of a single-replica trial, run in this process (the trial actor).

    The same interface as :class:`WorkerGroup` (``num_replicas`` is 1), so the trainable
    drives either alike. The training function runs in a daemon thread, so the trial actor
    keeps answering Tune's calls; a function that ended leaves the process ready for the
    next job (:meth:`recycle`). Only one job at a time may run in a process
    (:meth:`busy`): the core's job context and the torch process group are process-wide.

    Why this is safe: Tune places a trial actor whose head bundle is empty on bundle 0 of
    the trial's placement group, so the replica runs on the node and CPUs its bundle
    reserved (a replica that needs a GPU must not use this class: the trial actor holds
    none). A failure of the function is reported as :class:`WorkerFailed`, as a remote
    replica's; a function that kills its process kills the trial actor, which Tune
    reports (and retries under ``FailureConfig``) as any dead trial actor.

    Args:
        resources_per_replica: the replica's bundle (its CPUs set torch's threads).
        trial_info: passed to the worker for ``tune.get_context``.
    """

    num_replicas = 1
    _active: "InProcessReplica | None" = None  # the replica whose function runs here
    _active_lock = threading.Lock()

    def __init__(self, resources_per_replica: Mapping[str, float],
                 trial_info: dict[str, Any]) -> None:
        self.created_at = time.time()
        self.resources_per_replica = dict(resources_per_replica)
        self._worker = ReplicaWorker(0, trial_info)
        self.node_ip = ray.util.get_node_ip_address()
        self.node_ids = [ray.get_runtime_context().get_node_id()]  # the trial actor's node
        self.master_addr = "127.0.0.1"  # the store and its only client are this process
        self.master_port = self._worker.free_port()
        self.workers_up_at = time.time()
        self._run: concurrent.futures.Future | None = None

    @classmethod
    def busy(cls) -> bool:
        """Whether a training function started by an :class:`InProcessReplica` is still
        running in this process (then a new job must run in a replica process)."""
        with cls._active_lock:
            active = cls._active
        return active is not None and active.running

    @classmethod
    def _claim_process(cls, replica: "InProcessReplica") -> None:
        """Make ``replica`` the one whose function runs in this process.

        Raises:
            RuntimeError: if another in-process job still runs here.
        """
        with cls._active_lock:
            active = cls._active
            if active is not None and active is not replica and active.running:
                raise RuntimeError("another AdaptDL job still runs in this process; start "
                                   "this one in a replica process (WorkerGroup)")
            cls._active = replica

    @property
    def running(self) -> bool:
        """True while the training function runs."""
        return self._run is not None and not self._run.done()

    @property
    def started(self) -> bool:
        """True once the training function was started."""
        return self._run is not None

    def start(self, fn: Callable[..., Any], config: dict, *, fn_kwargs: Any,
              archive: bytes | None, user_files: bytes | None, num_restarts: int,
              job_id: str, timeout_s: float | None) -> None:
        """Run ``fn(config, **fn_kwargs)`` in a thread of this process (returns at once);
        arguments as for :meth:`WorkerGroup.start`.

        Raises:
            RuntimeError: if another in-process job still runs here (see :meth:`busy`).
        """
        self._claim_process(self)
        if isinstance(fn_kwargs, ray.ObjectRef):
            fn_kwargs = ray.get(fn_kwargs)
        # A replica process gets its own copy of the config (and kwargs); so does this one,
        # so that a function changing them cannot change what a relaunch starts with.
        config, fn_kwargs = cloudpickle.loads(cloudpickle.dumps((config, fn_kwargs)))
        env = job_env(0, 1, self.master_addr, self.master_port, 1, num_restarts=num_restarts,
                       job_id=job_id, timeout_s=timeout_s)
        threads = max(1, int(self.resources_per_replica.get("CPU", 1)))
        world = {"world_rank": 0, "world_size": 1, "local_rank": 0, "local_world_size": 1,
                 "node_rank": 0}
        future: concurrent.futures.Future = concurrent.futures.Future()

        def target() -> None:
            try:
                future.set_result(self._worker.run(fn, config, fn_kwargs, env, archive,
                                                   user_files, threads, world))
            except BaseException as exc:  # noqa: BLE001 - reported by finished()
                future.set_exception(exc)

        self.started_at = time.time()
        self._run = future
        threading.Thread(target=target, daemon=True, name="adaptdl-replica-0").start()

    def next_results(self, timeout_s: float) -> tuple[list[dict], bool]:
        """As :meth:`WorkerGroup.next_results`."""
        return self._worker.next_results(timeout_s)

    def describe(self, rank: int = 0) -> str:
        """The replica in words for an error message (as :meth:`WorkerGroup.describe`)."""
        return f"replica {rank} of 1 on node {self.node_ip} (in the trial actor)"

    def _outcome(self) -> dict:
        """The finished function's outcome, raising :class:`WorkerFailed` if it failed."""
        where = self.describe(0)
        try:
            outcome = self._run.result(timeout=0)
        except Exception as exc:  # noqa: BLE001 - the worker itself broke (e.g. unpacking)
            raise WorkerFailed(f"{where} failed: {type(exc).__name__}: {exc}") from exc
        if outcome["status"] == "error":
            failure = ReplicaFailure.from_outcome(0, self.node_ip, outcome)
            raise WorkerFailed(failure_message(failure, where, []), failure)
        return outcome

    def finished(self, wait_s: float = 0.0) -> list[dict] | None:
        """As :meth:`WorkerGroup.finished`."""
        try:
            self._run.exception(timeout=wait_s)
        except concurrent.futures.TimeoutError:
            return None
        return [self._outcome()]

    def stop(self, timeout_s: float) -> list[dict]:
        """As :meth:`WorkerGroup.stop`."""
        self._worker.request_stop()
        if self.finished(timeout_s) is None:
            raise stop_timeout_error([0], timeout_s)
        return [self._outcome()]

    def save(self, timeout_s: float) -> dict[str, Any]:
        """As :meth:`WorkerGroup.save` (a function that fails first raises
        :class:`WorkerFailed`: its end cancels the request)."""
        answer = self._worker.save(timeout_s)
        if not answer["taken"] and self._run is not None and self._run.done():
            self._outcome()
        return answer

    def checkpoint_archive(self, path: str | None = None) -> bytes | None:
        """As :meth:`WorkerGroup.checkpoint_archive`."""
        return self._worker.checkpoint_archive(path)

    def timeline(self) -> dict[str, float]:
        """As :meth:`WorkerGroup.timeline`."""
        out = self._worker.timeline()
        out.update(created=self.created_at, workers_up=self.workers_up_at)
        return out

    def recycle(self, trial_info: dict[str, Any], timeout_s: float = 60.0) -> bool:
        """Make the replica serve a new job; a function still running (a trial Tune stopped
        early) is first asked to stop at its next batch boundary, for up to ``timeout_s``.

        Returns:
            False if the function did not stop in time (then its thread keeps this
            process's job context, and the next job needs a replica process).
        """
        if self.running:
            self._worker.request_stop()
            try:
                self._run.exception(timeout=timeout_s)
            except concurrent.futures.TimeoutError:
                LOG.warning("the previous trial's function did not stop within %.0f s",
                            timeout_s)
                return False
        self.created_at = time.time()
        if not self._worker.recycle(trial_info):
            return False
        self.master_port = self._worker.free_port()
        self.workers_up_at = time.time()
        self._run = None
        return True

    def shutdown(self) -> None:
        """Ask a running function to stop at its next batch boundary (a thread cannot be
        killed; the trial actor's exit ends it) and remove the local files."""
        if self.running:
            try:
                self._worker.request_stop()
            except Exception:  # noqa: BLE001 - best effort
                LOG.debug("could not ask the in-process replica to stop", exc_info=True)
        else:
            self._worker.remove_local_files()
