"""One replica of a trial: a Ray actor that runs the user's training function.

The function runs in one of the actor's threads (the actor is threaded), so the trial can
still collect reports, ask for an in-place checkpoint or a checkpoint-and-stop while it
trains. A worker whose function has ended can serve another job (Tune's ``reuse_actors``:
torch stays imported): :meth:`ReplicaWorker.recycle` forgets the previous job as a new
process would (the core's job context, the torch process group, the local files, the
``ADAPTDL_*`` variables and the Tune session).

Inside the function ``ray.tune.report``, ``ray.tune.get_checkpoint`` and
``ray.tune.get_context()`` work as in any Tune function (the context also knows the
replica's world rank and size, as in Ray Train): rank 0's reports, with the user's
checkpoint packed at once (the function may delete its files right after the call), go to
the trial; other ranks' reports are dropped.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import queue
import shutil
import sys
import tempfile
import threading
import time
import traceback
from typing import Any, Callable

LOG = logging.getLogger(__name__)

__all__ = ["ReplicaWorker"]


def _preimport() -> None:
    """Import torch (through ``adaptdl_core.torch``) now, in the calling thread.

    Never in a background thread: Ray unpickles the arguments of :meth:`ReplicaWorker.run`
    (the training function and what it references, such as ``adaptdl_core.torch``) in
    another thread of the actor, and two threads importing torch at once can break its
    import ("cannot import name ... from partially initialized module 'torch.utils'"):
    the replica then failed before its function began."""
    try:
        importlib.import_module("adaptdl_core.torch")  # imports torch
    except Exception:  # noqa: BLE001 - run() will import again and report the error
        LOG.debug("pre-import of adaptdl_core.torch failed", exc_info=True)


def _checkpoint_files(checkpoint: Any) -> bytes:
    """A ``tune.Checkpoint``'s files as tar bytes (read now: the caller may delete them)."""
    from adaptdl_ray.replicas import transfer
    with checkpoint.as_directory() as directory:
        return transfer.pack_entries(directory, sorted(os.listdir(directory)))


class ReplicaWorker:
    """Actor body (wrapped with ``ray.remote`` by the worker group).

    Args:
        rank: this replica's provisional rank (the final one comes with :meth:`run`).
        trial_info: trial name, id, experiment name, resources and directory, for
            ``tune.get_context``.
    """

    def __init__(self, rank: int, trial_info: dict[str, Any]) -> None:
        self.rank = rank
        self._trial_info = trial_info
        self._results: queue.Queue = queue.Queue()
        self._checkpoint_root: str | None = None
        self._user_root: str | None = None
        # Wall-clock milestones of this launch (seconds since the epoch), for resize costs.
        self._timeline: dict[str, float] = {}
        self._last_report: float | None = None
        # In-place checkpoints requested on this replica (PendingCheckpoint handles, in
        # order) and how many of them were taken: the tag of each report.
        self._saves: list[Any] = []
        self._saves_taken = 0
        self._saves_lock = threading.Lock()
        self._running = False
        self._ended = False  # the function returned (its end was queued after its reports)
        # The ADAPTDL_* variables the process started with: a recycled worker returns to them.
        self._base_env = {k: v for k, v in os.environ.items() if k.startswith("ADAPTDL_")}
        # Torch is imported before any method runs (the group's first call waits for it),
        # so that it is never imported in two threads at once (see _preimport).
        _preimport()

    # -- set-up -------------------------------------------------------------------
    def node_address(self) -> tuple[str, str]:
        """(IP address, Ray node id) of the node this worker runs on."""
        import ray
        return ray.util.get_node_ip_address(), ray.get_runtime_context().get_node_id()

    def free_port(self) -> int:
        """A TCP port of this node, held until rank 0's store (run by this worker) listens
        on it (see ``adaptdl_core.ports``)."""
        from adaptdl_core import ports
        return ports.hold_for_store("")

    def imported_modules(self) -> list[str]:
        """The names of every module this process has imported (a replica joining the job
        imports them first: see :meth:`warm_up`)."""
        return sorted(name for name in list(sys.modules) if not name.startswith("__"))

    def warm_up(self, modules: list[str], paths: list[str]) -> dict[str, float]:
        """Import ``modules`` that this process has not imported yet, with ``paths``
        added to ``sys.path`` meanwhile (the script's directory), so that a replica
        joining a running job (see :meth:`imported_modules` of one that runs it) starts
        the script about as fast as the replicas that stay. A module that fails to import
        is skipped: the script imports what it needs itself.

        Returns:
            ``{"imported": n, "failed": n, "s": seconds}``.
        """
        started = time.time()
        saved = list(sys.path)
        sys.path[:0] = [p for p in paths if p not in sys.path]
        imported = failed = 0
        try:
            for name in modules:
                if name in sys.modules:
                    continue
                try:
                    importlib.import_module(name)
                    imported += 1
                except BaseException:  # noqa: BLE001 - any import error (or exit) skips it
                    failed += 1
        finally:
            sys.path[:] = saved
        LOG.debug("replica %d imported %d module(s) before joining (%d failed) in %.2f s",
                  self.rank, imported, failed, time.time() - started)
        return {"imported": imported, "failed": failed, "s": time.time() - started}

    # -- reuse --------------------------------------------------------------------
    def recycle(self, trial_info: dict[str, Any]) -> bool:
        """Forget the previous job so that the next :meth:`run` starts as in a new process,
        for the trial described by ``trial_info``.

        Returns:
            False (and changes nothing) while the training function is still running; the
            caller then needs a fresh worker.
        """
        if self._running:
            return False
        from adaptdl_core import context
        from adaptdl_ray.replicas import _ray_private
        context.reset()  # States, restore point, stop flag, store connection, bookkeeping
        try:
            import torch.distributed as dist
            if dist.is_available() and dist.is_initialized():
                dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - a broken group must not keep the worker
            LOG.warning("replica %d: could not destroy the previous process group", self.rank,
                        exc_info=True)
        _ray_private.clear_replica_session()
        self.remove_local_files()
        for name in [k for k in os.environ if k.startswith("ADAPTDL_")]:
            if name not in self._base_env:
                del os.environ[name]
        os.environ.update(self._base_env)
        self._trial_info = trial_info
        self._results = queue.Queue()
        self._ended = False
        self._timeline = {}
        self._last_report = None
        with self._saves_lock:
            self._saves, self._saves_taken = [], 0
        return True

    # -- running ------------------------------------------------------------------
    def run(self, fn: Callable[..., Any], config: dict, fn_kwargs: dict, env: dict[str, str],
            archive: bytes | None, user_files: bytes | None, num_threads: int,
            world: dict[str, int]) -> dict[str, Any]:
        """Run ``fn(config, **fn_kwargs)`` to its end with the ``ADAPTDL_*`` variables ``env``.

        Args:
            archive: the job's adaptdl_core checkpoint (tar bytes from :mod:`.transfer`),
                unpacked into this worker's local checkpoint path first; ``None`` for a
                fresh start.
            user_files: the user's checkpoint to resume from (tar bytes), which
                ``tune.get_checkpoint()`` returns inside the function; ``None``: none.
            num_threads: torch intra-op threads (the CPUs of this worker's bundle).
            world: ``world_rank``, ``world_size``, ``local_rank``, ``local_world_size``,
                ``node_rank`` for ``tune.get_context()``.

        Returns:
            ``{"status": "finished" | "checkpointed" | "error", "traceback": str | None}``;
            an error adds the exception's types and time (see
            :func:`adaptdl_ray.replicas.failures.exception_record`).
            A function that returns normally is checkpointed once more at its end (every
            replica takes part), so the final state can be handed to Tune.
        """
        self._timeline["run_called"] = time.time()
        self._ended = False
        import torch
        from ray import tune

        from adaptdl_core import checkpoint
        from adaptdl_core.torch import CheckpointExit
        from adaptdl_ray.replicas import _ray_private, transfer

        self.rank = int(env["ADAPTDL_REPLICA_RANK"])
        job = env.get("ADAPTDL_JOB_ID", "job")
        self._checkpoint_root = tempfile.mkdtemp(prefix=f"adaptdl-{job}-r{self.rank}-")
        os.environ.update(env)
        os.environ["ADAPTDL_CHECKPOINT_PATH"] = self._checkpoint_root
        if archive is not None:
            transfer.unpack(archive, self._checkpoint_root)
        loaded = None
        if user_files is not None:
            self._user_root = tempfile.mkdtemp(prefix=f"adaptdl-{job}-r{self.rank}-user-")
            transfer.unpack(user_files, self._user_root)
            loaded = tune.Checkpoint.from_directory(self._user_root)
        torch.set_num_threads(max(1, int(num_threads)))
        _ray_private.install_replica_session(_ray_private.ReplicaSession(
            self._on_report, self._trial_info, world, loaded))
        self._timeline["ready"] = time.time()
        self._last_report = self._timeline["ready"]
        self._running = True
        outcome: dict[str, Any] = {"status": "finished", "traceback": None}
        try:
            fn(config, **fn_kwargs)
            # No report can follow: say so now, so that the trial can tell its last report
            # is the final one without waiting for the final save below.
            self._results.put(None)
            checkpoint.save_all_states()
        except CheckpointExit:
            outcome["status"] = "checkpointed"
        except BaseException as exc:  # noqa: BLE001 - report any failure to the trial
            from adaptdl_ray.replicas.failures import exception_record
            outcome = {"status": "error", "traceback": traceback.format_exc(),
                       **exception_record(exc, time.time())}
            LOG.error("replica %d failed:\n%s", self.rank, outcome["traceback"])
        finally:
            self._running = False
            with self._saves_lock:
                for handle in self._saves:
                    handle.cancel()
        self._results.put(None)  # the end (again, if it returned): wakes a blocked reader
        return outcome

    def _tag(self) -> int:
        """In-place checkpoints taken before now (called in the training thread, where they
        are taken, so the count is exact)."""
        with self._saves_lock:
            while self._saves and self._saves[0].done:
                self._saves_taken += bool(self._saves.pop(0).taken)
            return self._saves_taken

    def _on_report(self, metrics: dict, checkpoint: Any = None) -> None:
        if self.rank != 0:
            return
        from adaptdl_core.torch import status
        now = time.time()
        hints = status.sched_hints_dict()
        self._results.put({
            "metrics": dict(metrics),
            "status": status.training_status(),
            "hints": json.dumps(hints) if hints is not None else None,
            "time_this_iter_s": now - (self._last_report or now),
            "tag": self._tag(),
            "user_checkpoint": _checkpoint_files(checkpoint) if checkpoint is not None else None,
        })
        self._last_report = now

    def next_results(self, timeout_s: float) -> tuple[list[dict], bool]:
        """Reports of rank 0 not yet handed out, and whether the function has returned.

        Waits up to ``timeout_s`` for a report or the function's end, then returns
        everything queued (possibly nothing); once the function has returned, it never
        waits again (until the next :meth:`run`)."""
        out: list[dict] = []
        if self._ended:
            timeout_s = 0.0
        try:
            item = self._results.get(timeout=timeout_s) if timeout_s > 0 else \
                self._results.get_nowait()
        except queue.Empty:
            return out, self._ended
        while True:
            if item is None:
                self._ended = True
            else:
                out.append(item)
            try:
                item = self._results.get_nowait()
            except queue.Empty:
                return out, self._ended

    # -- checkpoints ---------------------------------------------------------------
    def save(self, timeout_s: float) -> dict[str, Any]:
        """Checkpoint at the next batch boundary and keep training (every replica of the
        job must be asked; they agree on the boundary).

        Returns:
            ``{"taken": bool, "path": str | None, "index": int}``: whether a checkpoint was
            written before the function ended, its directory (rank 0), and how many
            in-place checkpoints this launch has taken including it (a report with
            ``tag < index`` was made before it).

        Raises:
            TimeoutError: no batch boundary within ``timeout_s`` (names this replica).
        """
        if not self._running:
            return {"taken": False, "path": None, "index": self._tag()}
        from adaptdl_core.torch import request_checkpoint
        handle = request_checkpoint()
        with self._saves_lock:
            self._saves.append(handle)
        if not self._running:  # the function ended while the request was made
            handle.cancel()
        if not handle.wait(timeout_s):
            raise TimeoutError(
                f"replica {self.rank} did not reach a batch boundary within {timeout_s:.0f} s "
                "of a checkpoint request; the training function must iterate an "
                "AdaptiveDataLoader (checkpoints are taken at its batch boundaries)")
        return {"taken": handle.taken, "path": handle.path, "index": self._tag_after(handle)}

    def _tag_after(self, handle: Any) -> int:
        """Taken checkpoints up to and including ``handle`` (resolved)."""
        with self._saves_lock:
            taken = self._saves_taken
            for other in self._saves:
                taken += bool(other.done and other.taken)
                if other is handle:
                    break
            return taken

    def request_stop(self) -> None:
        """Ask the job to checkpoint at the next batch boundary and stop."""
        from adaptdl_core.torch import request_checkpoint_and_exit
        request_checkpoint_and_exit()

    def snapshot(self) -> dict[str, Any] | None:
        """The job's training status and scheduler hints now, read beside the training
        thread (for a launcher whose script never calls ``tune.report``).

        Returns:
            ``{"status": training_status(), "hints": sched_hints_dict() or None}``, or
            ``None`` while no training loop has taken an optimizer step in this launch
            (reading earlier would create the job's States from this thread, out of the
            order the training thread creates them in) or when the function has ended.
        """
        if not self._running:
            return None
        from adaptdl_core import context
        from adaptdl_core.torch import status
        ctx = context.current()
        if ctx.metrics is None or ctx.epoch_state is None or \
                status.first_step_walltime() is None:
            return None
        for _ in range(3):
            try:
                return {"status": status.training_status(), "hints": status.sched_hints_dict()}
            except RuntimeError:  # a dict grew while read (a new shape was profiled)
                continue
        return None

    def timeline(self) -> dict[str, float]:
        """Milestones of this launch: ``run_called``, ``ready`` (torch imported, checkpoint
        unpacked, about to call the function) and ``first_step`` (first optimizer step),
        as wall-clock seconds, each present once reached."""
        from adaptdl_core.torch import status
        timeline = dict(self._timeline)
        first_step = status.first_step_walltime()
        if first_step is not None:
            timeline["first_step"] = first_step
        return timeline

    def checkpoint_archive(self, path: str | None = None) -> bytes | None:
        """The checkpoint ``path`` (default: the newest in this worker's checkpoint path) as
        tar bytes (rank 0 holds the job's checkpoints), ``None`` if there is none."""
        from adaptdl_ray.replicas import transfer
        if path is not None:
            return transfer.pack_dir(path, os.path.basename(path))
        if self._checkpoint_root is None:
            return None
        return transfer.pack_latest_checkpoint(self._checkpoint_root)

    def remove_local_files(self) -> None:
        """Delete this worker's local checkpoint directories (the trial keeps its copy)."""
        for root in (self._checkpoint_root, self._user_root):
            if root is not None:
                shutil.rmtree(root, ignore_errors=True)
        self._checkpoint_root = self._user_root = None
