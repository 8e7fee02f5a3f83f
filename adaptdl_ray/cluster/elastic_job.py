"""Run an unchanged adaptdl_core training script as one elastic job on a Ray cluster.

::

    python -m adaptdl_ray.cluster.elastic_job --name digits --max-replicas 4 \\
        train.py --epochs 10

is what ``adaptdl-ray submit`` runs as a Ray job's entrypoint (the job's driver). The
driver keeps the job's files and records and turns signals into a stop; a
:class:`~adaptdl_ray.supervisor.Supervisor` runs the job:

* it starts N replica actors (:class:`~adaptdl_ray.replicas.group.WorkerGroup`), each in
  a one-bundle placement group of its own (:mod:`.replicas`), each running the script with
  :mod:`runpy` under its own arguments and the ``ADAPTDL_*`` variables of its rank, as
  ``python -m adaptdl_core.launch`` does with local processes;
* keeps the job's checkpoint under its storage path (:mod:`.job_files`): a run resumes
  from the newest one with the restart count + 1, and a job whose checkpoint says it
  finished reports so and exits 0;
* asks its :class:`~adaptdl_ray.cluster.sizing.Sizer` for the job's size, feeding it rank
  0's scheduler hints and progress; a resize is every replica checkpointing at its next
  batch boundary and ending its script, then N' replicas running it again from that
  checkpoint (same epoch, same sample). The replicas that stay keep their processes
  (torch and the script's modules stay imported); a grow reserves and starts only the new
  replicas, while the job trains, once their resources are free, and checkpoints when they
  are up; a shrink stops only the extra ones;
* on SIGTERM or SIGINT (``adaptdl-ray stop``, which Ray's job stop sends) checkpoints at
  the next batch boundary, keeps the checkpoint and exits 0: submitting the same name
  again resumes there;
* when a node holding one of its replicas is being drained (a spot node's preemption
  notice, ``ray drain-node``, Ray's autoscaler removing it), checkpoints at the next batch
  boundary and relaunches on the other nodes (as many replicas as they hold, at least
  ``min_replicas``; Ray places nothing new on a draining node), without waiting for the
  deadline;
* checkpoints in place every ``checkpoint_interval_s`` (the replicas keep training) and,
  when a node under its replicas vanishes without notice, continues on the other nodes
  from that checkpoint: the work since it is repeated, no more, and the loss is no failure.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import runpy
import signal
import sys
import time
from typing import Any, Callable, Mapping, Sequence

from adaptdl_core.decision import JobSpec
from adaptdl_core.launch import restarts_for

from adaptdl_ray.cluster.job_files import JobFiles, check_name
from adaptdl_ray.replicas.pool import ReplicaPool
from adaptdl_ray.cluster.sizing import DEFAULT_INTERVAL_S, Sizer, default_sizer
from adaptdl_ray.supervisor import (DEFAULT_CHECKPOINT_INTERVAL_S, DEFAULT_STOP_TIMEOUT_S,
                                    Ending, JobRunner, StatusUpdate, Supervisor)

LOG = logging.getLogger(__name__)

__all__ = ["ElasticJob", "run_script", "add_job_arguments", "job_spec", "main"]

#: Where a script writes TensorBoard event files (``adaptdl-ray tensorboard`` shows them).
TENSORBOARD_VAR = "ADAPTDL_TENSORBOARD_LOGDIR"
# Seconds between reads of rank 0's status and hints.
_STATUS_EVERY_S = 3.0


def run_script(config: dict[str, Any]) -> None:
    """Run a training script in this process as ``python SCRIPT ARGS`` would (the
    replicas' training function).

    Args:
        config: ``script`` (its path), ``args`` (its arguments) and ``env`` (variables
            set for it, e.g. ``ADAPTDL_TENSORBOARD_LOGDIR``).

    Raises:
        adaptdl_core.torch.CheckpointExit: the job was checkpointed and stopped.
        RuntimeError: the script exited with a status other than 0.
    """
    from adaptdl_core.torch import CheckpointExit
    script, args = config["script"], list(config.get("args", []))
    saved_argv, saved_path = sys.argv, list(sys.path)
    os.environ.update(config.get("env") or {})
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    try:
        runpy.run_path(script, run_name="__main__")
    except CheckpointExit:
        raise
    except SystemExit as exc:
        if exc.code not in (None, 0):
            raise RuntimeError(f"{script} exited with status {exc.code}") from None
    finally:
        sys.argv = saved_argv
        sys.path[:] = saved_path


def add_job_arguments(parser: argparse.ArgumentParser) -> None:
    """The options that shape a job (shared by ``adaptdl-ray submit`` and this module)."""
    parser.add_argument("--name", required=True, help="the job's name (its storage directory "
                        "and how ls, logs, stop and cp find it)")
    parser.add_argument("--min-replicas", type=int, default=1, metavar="N",
                        help="fewest replicas (default 1)")
    parser.add_argument("--checkpoint-interval", type=float,
                        default=DEFAULT_CHECKPOINT_INTERVAL_S, metavar="S",
                        help="seconds of training between in-place checkpoints, the most a "
                             "node lost without notice costs (default "
                             f"{DEFAULT_CHECKPOINT_INTERVAL_S:g}; 0: none)")
    parser.add_argument("--max-replicas", type=int, default=None, metavar="N",
                        help="most replicas (default: as many as the cluster holds)")
    parser.add_argument("--cpus-per-replica", type=float, default=1.0, metavar="C",
                        help="CPUs of each replica (default 1; also its torch threads)")
    parser.add_argument("--gpus-per-replica", type=float, default=0.0, metavar="G",
                        help="GPUs of each replica (default 0)")
    parser.add_argument("--storage-path", default=None, metavar="P",
                        help="where the job keeps its checkpoint and records (default "
                             "$ADAPTDL_STORAGE_PATH, else ~/adaptdl_jobs)")
    parser.add_argument("--allocation-interval", type=float, default=DEFAULT_INTERVAL_S,
                        metavar="S", help="seconds between re-decisions of the job's size "
                                          f"(default {DEFAULT_INTERVAL_S:g}); a change on "
                                          "the cluster reaches it within one")


def job_spec(opts: argparse.Namespace) -> JobSpec:
    """The :class:`JobSpec` of parsed job options.

    Raises:
        ValueError: bad replica bounds or resources (the message names the option and
            the fix).
    """
    check_name(opts.name)
    if not math.isfinite(opts.allocation_interval) or opts.allocation_interval <= 0:
        raise ValueError(f"--allocation-interval {opts.allocation_interval:g}: must be a "
                         "number of seconds > 0")
    if not math.isfinite(opts.checkpoint_interval) or opts.checkpoint_interval < 0:
        raise ValueError(f"--checkpoint-interval {opts.checkpoint_interval:g}: must be a "
                         "number of seconds > 0, or 0 for no in-place checkpoints")
    try:  # (JobSpec checks the bounds and resources; its words become the options')
        return JobSpec({"CPU": opts.cpus_per_replica, "GPU": opts.gpus_per_replica},
                       min_replicas=opts.min_replicas, max_replicas=opts.max_replicas)
    except ValueError as exc:
        message = str(exc)
        for name, option in _OPTION_NAMES:
            message = message.replace(name, option)
        raise ValueError(message) from None


# JobSpec's argument names (and the Python API's) -> this command's options.
_OPTION_NAMES = (("resources['CPU']", "--cpus-per-replica"),
                 ("resources['GPU']", "--gpus-per-replica"),
                 ("num_cpus_per_worker", "--cpus-per-replica"),
                 ("num_gpus_per_worker", "--gpus-per-replica"),
                 ("min_replicas", "--min-replicas"), ("max_replicas", "--max-replicas"))


class ElasticJob:
    """The driver of one elastic job (see the module docstring): a thin front-end of a
    :class:`~adaptdl_ray.supervisor.Supervisor`, which runs it; this class keeps the job's
    files and records, and turns signals into a stop.

    Args:
        files: the job's files (name and storage path).
        script, args: the training script and its arguments.
        spec: the replicas' shape and bounds.
        sizer: decides the job's size (default:
            :func:`~adaptdl_ray.cluster.sizing.default_sizer`).
        stop_timeout_s: how long a stop or resize waits for a batch boundary.
        status_every_s: seconds between reads of rank 0's status and hints.
        draining_fn: returns the nodes being drained now (node id -> deadline in seconds
            since the epoch, or ``None``); default: Ray's, through
            :func:`~adaptdl_ray.replicas._ray_private.draining_nodes`.
        nodes_fn: returns the usable cluster (node id -> NodeInfo, draining nodes left
            out), to size a move; default
            :func:`~adaptdl_ray.replicas.nodes.cluster_nodes`.
        checkpoint_interval_s: seconds of training between in-place checkpoints (the
            most a node lost without notice costs); ``None``: none (a lost node then
            costs everything since the last resize or start).
        pool: the replicas' actors and resources (default: a
            :class:`~adaptdl_ray.replicas.pool.ReplicaPool` of the job's own; tests
            pass a fake).
        owner: who submitted it (``user@host``; default: this process's user and host).
        allocation_interval_s: seconds between re-decisions of its size (for the default
            sizer).

    Raises:
        ValueError: ``checkpoint_interval_s`` is not ``None`` or a finite number > 0.
    """

    def __init__(self, files: JobFiles, script: str, args: Sequence[str], spec: JobSpec, *,
                 sizer: Sizer | None = None, stop_timeout_s: float = DEFAULT_STOP_TIMEOUT_S,
                 status_every_s: float = _STATUS_EVERY_S,
                 draining_fn: Callable[[], Mapping[str, float | None]] | None = None,
                 nodes_fn: Callable[[], Mapping[Any, Any]] | None = None,
                 checkpoint_interval_s: float | None = DEFAULT_CHECKPOINT_INTERVAL_S,
                 pool: ReplicaPool | None = None, owner: str | None = None,
                 allocation_interval_s: float = DEFAULT_INTERVAL_S) -> None:
        from adaptdl_ray.cluster.owner import current_owner
        if checkpoint_interval_s is not None and (
                isinstance(checkpoint_interval_s, bool)
                or not isinstance(checkpoint_interval_s, (int, float))
                or not math.isfinite(checkpoint_interval_s) or checkpoint_interval_s <= 0):
            raise ValueError(f"checkpoint_interval_s must be a number of seconds > 0 or None "
                             f"(no in-place checkpoints), got {checkpoint_interval_s!r}")
        self.owner = owner or current_owner()
        self.files = files
        self.name = files.name
        self.script = script
        self.args = list(args)
        self.spec = spec
        self.sizer = sizer or default_sizer(files.name, spec, str(files.root),
                                            owner=self.owner,
                                            interval_s=allocation_interval_s)
        self._stop_signal: int | None = None
        self._record: dict[str, Any] = {}
        trial_info = {"trial_name": self.name, "trial_id": self.name,
                      "experiment_name": self.name, "trial_resources": None,
                      "trial_dir": str(files.root)}
        runner = JobRunner(run_script, {"script": script, "args": self.args, "env": {
            TENSORBOARD_VAR: str(files.root / "tensorboard")}},
            import_paths=(os.path.dirname(os.path.abspath(script)),))
        #: The supervisor that runs the job.
        self.supervisor = Supervisor(
            self.name, spec, runner, sizer=self.sizer,
            pool=pool or ReplicaPool(spec.resources, trial_info, f"adaptdl-{self.name}"),
            trial_info=trial_info, keep_checkpoint=self._store,
            on_status=self._write_status, draining_fn=draining_fn or _ray_draining_nodes,
            nodes_fn=nodes_fn or _ray_cluster_nodes, stop_timeout_s=stop_timeout_s,
            status_every_s=status_every_s, checkpoint_interval_s=checkpoint_interval_s)

    # -- signals ----------------------------------------------------------------------
    def install_signal_handlers(self) -> None:
        """SIGTERM and SIGINT ask the job to checkpoint and stop (a second one of them
        ends the driver at once)."""
        def handler(signum: int, frame: Any) -> None:
            if self._stop_signal is not None:
                raise KeyboardInterrupt
            self._stop_signal = signum
            self.supervisor.request_stop()
            LOG.info("job %s: %s received; stopping at the next batch boundary", self.name,
                     signal.Signals(signum).name)
        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

    def request_stop(self) -> None:
        """Checkpoint at the next batch boundary and end (as SIGTERM does)."""
        self._stop_signal = signal.SIGTERM
        self.supervisor.request_stop()

    # -- the run ----------------------------------------------------------------------
    def run(self) -> int:
        """Run the job to its end, its stop or its failure; the driver's exit status
        (0: finished or stopped after a checkpoint, 1: failed)."""
        point = self.files.resume_point()
        previous = self.files.read_status() or {}
        submitted = previous.get("submitted") or time.time()
        previous.pop("error", None)
        self._record = {**previous, "name": self.name, "experiment": None,
                        "owner": self.owner, "max_replicas": self.spec.max_replicas,
                        "submitted": submitted, "script": self.script, "args": self.args,
                        "restarts": point.restarts if point else 0,
                        "epochs_done": point.finished_epochs if point else 0}
        if point is not None and point.finished:
            LOG.info("job %s already finished (%s epochs; checkpoint %s): nothing to train",
                     self.name, point.finished_epochs, point.path)
            self._finish(Ending.FINISHED)
            return 0
        restarts = restarts_for(None, point)
        replicas = self.sizer.start()
        kind = getattr(self.sizer, "start_type", None)
        LOG.info("job %s: starting %d replica(s) of %s%s (restart %d)", self.name, replicas,
                 dict(self.spec.resources), f" on {kind} nodes" if kind else "", restarts)
        result = self.supervisor.run(replicas, self._checkpoint_archive(), restarts,
                                     trained_s=float(previous.get("trained_s") or 0.0),
                                     accelerator_type=kind)
        point = self.files.resume_point()
        if point is not None:
            self._record["epochs_done"] = point.finished_epochs
        self._finish(result.ending, error=result.error)
        if result.ending is Ending.FAILED:
            return 1
        LOG.info("job %s %s (%d restarts); checkpoint in %s", self.name, result.ending,
                 result.restarts, self.files.checkpoint_path)
        return 0

    def _finish(self, ending: Ending, error: str | None = None) -> None:
        """Record how the run ended and free the job's share of the cluster."""
        extra = {} if error is None else {"error": error}
        self._record.update(status=str(ending), replicas=0, target=0, **extra)
        self._flush()
        self.sizer.end(str(ending))

    def _checkpoint_archive(self) -> bytes | None:
        """The job's newest checkpoint as tar bytes (None: a fresh start)."""
        from adaptdl_ray.replicas import transfer
        if not self.files.checkpoint_path.is_dir():
            return None
        return transfer.pack_latest_checkpoint(str(self.files.checkpoint_path))

    def _store(self, archive: bytes) -> str:
        """Keep a checkpoint in the job's storage; returns its directory."""
        return self.files.store_checkpoint(archive)

    def _write_status(self, update: StatusUpdate) -> None:
        """The supervisor's news, into status.json (what `adaptdl-ray ls` reads)."""
        self._record.update(update.facts)
        self._record.update(status=str(update.phase), replicas=update.replicas,
                            target=update.target)
        self._flush()

    def _flush(self) -> None:
        try:
            self.files.write_status(self._record)
        except OSError as exc:
            LOG.warning("job %s: could not write its status: %s", self.name, exc)


def _ray_draining_nodes() -> dict[str, float | None]:
    from adaptdl_ray.replicas._ray_private import draining_nodes
    return draining_nodes()


def _ray_cluster_nodes() -> dict[str, Any]:
    from adaptdl_ray.replicas.nodes import cluster_nodes
    return cluster_nodes()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m adaptdl_ray.cluster.elastic_job`` (a Ray job's entrypoint); returns
    the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m adaptdl_ray.cluster.elastic_job",
        description="Run an adaptdl_core training script as an elastic job on the Ray "
                    "cluster this process joins.")
    add_job_arguments(parser)
    parser.add_argument("--stop-timeout", type=float, default=DEFAULT_STOP_TIMEOUT_S,
                        metavar="S", help="seconds a stop or resize waits for a batch boundary")
    parser.add_argument("--owner", default=None, metavar="USER@HOST",
                        help="who submitted the job (adaptdl-ray submit passes it; default: "
                             "this process's user and host)")
    parser.add_argument("script", help="the training script")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    opts = parser.parse_args(argv)
    try:
        spec = job_spec(opts)
    except ValueError as exc:
        parser.error(str(exc))
    if not os.path.isfile(opts.script):
        parser.error(f"script {opts.script!r} not found in {os.getcwd()}")
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    import ray
    ray.init(log_to_driver=True)
    files = JobFiles(opts.name, opts.storage_path)
    files.root.mkdir(parents=True, exist_ok=True)
    job = ElasticJob(files, opts.script, opts.args, spec, stop_timeout_s=opts.stop_timeout,
                     checkpoint_interval_s=opts.checkpoint_interval or None, owner=opts.owner,
                     allocation_interval_s=opts.allocation_interval)
    job.install_signal_handlers()
    return job.run()


if __name__ == "__main__":
    sys.exit(main())
