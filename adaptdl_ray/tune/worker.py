"""One replica of a trial: a Ray actor that runs the user's training function.

The function runs in one of the actor's threads (the actor is threaded), so the trial can
still ask for results or request a checkpoint-and-stop while it trains. Each launch of a
trial uses fresh actors: the core library keeps per-process state (the State registry,
the process group), and a new process per launch keeps every launch clean.

Inside the function ``ray.tune.report`` and ``ray.tune.get_context`` work as in any Tune
function: a minimal session forwards rank 0's reports (with the ``adaptdl/`` metrics and
the scheduler hints added) to the trial; other ranks' reports are dropped.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import queue
import shutil
import socket
import tempfile
import threading
import time
import traceback
from typing import Any, Callable

LOG = logging.getLogger(__name__)

__all__ = ["ReplicaWorker", "HINTS_KEY", "METRIC_PREFIX"]

METRIC_PREFIX = "adaptdl/"
HINTS_KEY = METRIC_PREFIX + "hints"


class _ReportSession:
    """Just enough of Ray Train's session object for ``tune.report`` / ``tune.get_context``
    inside a worker (Ray reads ``ray.train._internal.session._session``)."""

    def __init__(self, worker: "ReplicaWorker", trial_info: dict[str, Any]) -> None:
        self._worker = worker
        self.world_rank = None  # None marks a Tune (not Train) session
        self.loaded_checkpoint = None
        self.trial_name = trial_info.get("trial_name")
        self.trial_id = trial_info.get("trial_id")
        self.experiment_name = trial_info.get("experiment_name")
        self.trial_resources = trial_info.get("trial_resources")
        self.trial_dir = trial_info.get("trial_dir")  # on the trial actor's node
        self.run_id = trial_info.get("trial_id")
        self._warned_checkpoint = False

    def report(self, metrics: dict, checkpoint: Any = None) -> None:
        """Hand rank 0's metrics to the trial (other ranks: dropped)."""
        if checkpoint is not None and not self._warned_checkpoint:
            self._warned_checkpoint = True
            LOG.warning("tune.report(checkpoint=...) is ignored in AdaptDL trials: the job's "
                        "state is checkpointed automatically at every resize and pause")
        self._worker._on_report(metrics)


def _preimport() -> None:
    try:
        importlib.import_module("adaptdl_core.torch")  # imports torch
    except Exception:  # noqa: BLE001 - run() will import again and report the error
        LOG.debug("pre-import of adaptdl_core.torch failed", exc_info=True)


def _install_session(session: _ReportSession) -> None:
    from ray.train._internal import session as train_session
    train_session._session = session


class ReplicaWorker:
    """Actor body (wrapped with ``ray.remote`` by the worker group).

    Args:
        rank: this replica's provisional rank (the final one comes with :meth:`run`).
        trial_info: trial name, id, experiment name and resources, for ``tune.get_context``.
    """

    def __init__(self, rank: int, trial_info: dict[str, Any]) -> None:
        self.rank = rank
        self._trial_info = trial_info
        self._results: queue.Queue = queue.Queue()
        self._checkpoint_root: str | None = None
        # Wall-clock milestones of this launch (seconds since the epoch), for resize costs.
        self._timeline: dict[str, float] = {}
        # Importing torch takes seconds: start now, while the trial sets up, so that
        # run() finds it imported (run's own import waits for this one to finish).
        threading.Thread(target=_preimport, daemon=True, name="adaptdl-preimport").start()

    # -- set-up -------------------------------------------------------------------
    def node_address(self) -> tuple[str, str]:
        """(IP address, Ray node id) of the node this worker runs on."""
        import ray
        return ray.util.get_node_ip_address(), ray.get_runtime_context().get_node_id()

    def free_port(self) -> int:
        """A TCP port free on this node (rank 0 hosts the job's store on it)."""
        with socket.socket() as s:
            s.bind(("", 0))
            return s.getsockname()[1]

    # -- running ------------------------------------------------------------------
    def run(self, fn: Callable[[dict], Any], config: dict, env: dict[str, str],
            archive: bytes | None, num_threads: int) -> dict[str, Any]:
        """Run ``fn(config)`` to its end with the ``ADAPTDL_*`` variables ``env``.

        Args:
            archive: the trial's checkpoint (tar bytes from :mod:`.transfer`), unpacked into
                this worker's local checkpoint path first; ``None`` for a fresh start.
            num_threads: torch intra-op threads (the CPUs of this worker's bundle).

        Returns:
            ``{"status": "finished" | "checkpointed" | "error", "traceback": str | None}``.
        """
        self._timeline["run_called"] = time.time()
        import torch

        from adaptdl_core.torch import _interrupt
        from adaptdl_ray.tune import transfer

        self.rank = int(env["ADAPTDL_REPLICA_RANK"])
        self._checkpoint_root = tempfile.mkdtemp(
            prefix=f"adaptdl-{env.get('ADAPTDL_JOB_ID', 'job')}-r{self.rank}-")
        os.environ.update(env)
        os.environ["ADAPTDL_CHECKPOINT_PATH"] = self._checkpoint_root
        if archive is not None:
            transfer.unpack(archive, self._checkpoint_root)
        torch.set_num_threads(max(1, int(num_threads)))
        _install_session(_ReportSession(self, self._trial_info))
        self._timeline["ready"] = time.time()
        outcome: dict[str, Any] = {"status": "finished", "traceback": None}
        try:
            fn(config)
        except _interrupt.CheckpointExit:
            outcome["status"] = "checkpointed"
        except BaseException:  # noqa: BLE001 - report any failure to the trial
            outcome = {"status": "error", "traceback": traceback.format_exc()}
            LOG.error("replica %d failed:\n%s", self.rank, outcome["traceback"])
        self._results.put(None)  # wakes a reader blocked in next_results
        return outcome

    def _on_report(self, metrics: dict) -> None:
        if self.rank != 0:
            return
        from adaptdl_core.torch import status
        result = dict(metrics)
        for key, value in status.training_status().items():
            result[METRIC_PREFIX + key] = value
        hints = status.sched_hints_dict()
        result[HINTS_KEY] = json.dumps(hints) if hints is not None else ""
        self._results.put(result)

    def next_results(self, timeout_s: float) -> list[dict]:
        """Reports of rank 0 not yet handed out: waits up to ``timeout_s`` for the first,
        then returns everything queued (possibly nothing)."""
        out: list[dict] = []
        try:
            item = self._results.get(timeout=timeout_s)
        except queue.Empty:
            return out
        while True:
            if item is not None:
                out.append(item)
            try:
                item = self._results.get_nowait()
            except queue.Empty:
                return out

    def request_stop(self) -> None:
        """Ask the job to checkpoint at the next batch boundary and stop."""
        from adaptdl_core.torch import _interrupt
        _interrupt.request_checkpoint_and_exit()

    def timeline(self) -> dict[str, float]:
        """Milestones of this launch: ``run_called``, ``ready`` (torch imported, checkpoint
        unpacked, about to call the function) and ``first_step`` (first optimizer step),
        as wall-clock seconds, each present once reached."""
        from adaptdl_core.torch import _metrics
        timeline = dict(self._timeline)
        first_step = _metrics.first_step_walltime()
        if first_step is not None:
            timeline["first_step"] = first_step
        return timeline

    def checkpoint_archive(self) -> bytes | None:
        """The newest checkpoint of this worker's checkpoint path as tar bytes (rank 0 holds
        the job's checkpoint), ``None`` if there is none."""
        from adaptdl_ray.tune import transfer
        if self._checkpoint_root is None:
            return None
        return transfer.pack_latest_checkpoint(self._checkpoint_root)

    def remove_local_files(self) -> None:
        """Delete this worker's local checkpoint directory (the trial keeps its own copy)."""
        if self._checkpoint_root is not None:
            shutil.rmtree(self._checkpoint_root, ignore_errors=True)
            self._checkpoint_root = None
