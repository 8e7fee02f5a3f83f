"""Run an unchanged adaptdl_core training script as one elastic job on a Ray cluster.

::

    python -m adaptdl_ray.cluster.elastic_job --name digits --max-replicas 4 \\
        train.py --epochs 10

is what ``adaptdl-ray submit`` runs as a Ray job's entrypoint (the job's driver). The
driver

* starts N replica actors (:class:`~adaptdl_ray.tune.worker_group.WorkerGroup`), each in
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

from adaptdl_core.decision import JobProgress, JobSpec, estimate_remaining_s
from adaptdl_core.launch import restarts_for

from adaptdl_ray.cluster.job_files import JobFiles, check_name
from adaptdl_ray.cluster.replicas import ReplicaPool, Reservation
from adaptdl_ray.cluster.sizing import DEFAULT_INTERVAL_S, Sizer, default_sizer

LOG = logging.getLogger(__name__)

__all__ = ["ElasticJob", "run_script", "add_job_arguments", "job_spec", "main"]

#: Where a script writes TensorBoard event files (``adaptdl-ray tensorboard`` shows them).
TENSORBOARD_VAR = "ADAPTDL_TENSORBOARD_LOGDIR"
# Seconds a stop or a resize may wait for the replicas to reach a batch boundary.
DEFAULT_STOP_TIMEOUT_S = 120.0
# Seconds between reads of rank 0's status and hints.
_STATUS_EVERY_S = 3.0
# Seconds between checks for draining nodes under the job's replicas.
_DRAIN_CHECK_S = 2.0
#: Seconds of training between in-place checkpoints: what a node lost without notice can
#: cost. A save stops the job at one batch boundary for as long as rank 0 takes to write
#: its state (benchmarks/lost_node.py measures the share of time it costs).
DEFAULT_CHECKPOINT_INTERVAL_S = 300.0
# How long the driver waits for the replicas' resources before giving up.
_PLACEMENT_TIMEOUT_S = 600.0
# How long a grow's new replicas may take to start (the job trains meanwhile) before their
# resources are given back and the grow is tried again.
_GROW_WAIT_S = 120.0
_WAITING_LOG_EVERY_S = 30.0


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
    if opts.min_replicas < 1:
        raise ValueError(f"--min-replicas {opts.min_replicas}: must be >= 1")
    if opts.max_replicas is not None and opts.max_replicas < opts.min_replicas:
        raise ValueError(f"--max-replicas {opts.max_replicas} is below --min-replicas "
                         f"{opts.min_replicas}: raise --max-replicas or lower --min-replicas")
    for option, value in (("--cpus-per-replica", opts.cpus_per_replica),
                          ("--gpus-per-replica", opts.gpus_per_replica)):
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{option} {value:g}: must be a number >= 0")
    if opts.cpus_per_replica == 0 and opts.gpus_per_replica == 0:
        raise ValueError("--cpus-per-replica and --gpus-per-replica are both 0: each replica "
                         "needs some CPU or GPU")
    if not math.isfinite(opts.allocation_interval) or opts.allocation_interval <= 0:
        raise ValueError(f"--allocation-interval {opts.allocation_interval:g}: must be a "
                         "number of seconds > 0")
    if not math.isfinite(opts.checkpoint_interval) or opts.checkpoint_interval < 0:
        raise ValueError(f"--checkpoint-interval {opts.checkpoint_interval:g}: must be a "
                         "number of seconds > 0, or 0 for no in-place checkpoints")
    return JobSpec({"CPU": opts.cpus_per_replica, "GPU": opts.gpus_per_replica},
                   min_replicas=opts.min_replicas, max_replicas=opts.max_replicas)


class _Launch:
    """One launch of the job: its replicas (a worker group) and when it started."""

    def __init__(self, replicas: int, group: Any, started: float) -> None:
        self.replicas = replicas
        self.group = group
        self.started = started
        self.first_step: float | None = None


class ElasticJob:
    """The driver of one elastic job (see the module docstring).

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
            :func:`~adaptdl_ray.tune._ray_private.draining_nodes`.
        nodes_fn: returns the usable cluster (node id -> NodeInfo, draining nodes left
            out), to size a move; default
            :func:`~adaptdl_ray.cluster.nodes.cluster_nodes`.
        checkpoint_interval_s: seconds of training between in-place checkpoints (the
            most a node lost without notice costs); ``None``: none (a lost node then
            costs everything since the last resize or start).
        pool: the replicas' actors and resources (default: a
            :class:`~adaptdl_ray.cluster.replicas.ReplicaPool` of the job's own; tests
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
        if checkpoint_interval_s is not None and (
                isinstance(checkpoint_interval_s, bool)
                or not isinstance(checkpoint_interval_s, (int, float))
                or not math.isfinite(checkpoint_interval_s) or checkpoint_interval_s <= 0):
            raise ValueError(f"checkpoint_interval_s must be a number of seconds > 0 or None "
                             f"(no in-place checkpoints), got {checkpoint_interval_s!r}")
        from adaptdl_ray.cluster.owner import current_owner
        self.checkpoint_interval_s = checkpoint_interval_s
        self.owner = owner or current_owner()
        self.files = files
        self.name = files.name
        self.script = script
        self.args = list(args)
        self.spec = spec
        self.sizer = sizer or default_sizer(files.name, spec, str(files.root),
                                            owner=self.owner,
                                            interval_s=allocation_interval_s)
        self.stop_timeout_s = stop_timeout_s
        self.status_every_s = status_every_s
        self._stop_signal: int | None = None
        self._record: dict[str, Any] = {}
        self._trained_s = 0.0       # seconds trained by earlier launches (all submissions)
        self._resize_from: float | None = None  # when the pending resize was asked for
        self._resize_s: float | None = None
        self._draining_fn = draining_fn or _ray_draining_nodes
        self._nodes_fn = nodes_fn or _ray_cluster_nodes
        self._trial_info = {"trial_name": self.name, "trial_id": self.name,
                            "experiment_name": self.name, "trial_resources": None,
                            "trial_dir": str(files.root)}
        self._pool = pool or ReplicaPool(spec.resources, self._trial_info,
                                         f"adaptdl-{self.name}")
        self._grow: Reservation | None = None  # new replicas starting for a grow
        self._avoid_nodes: set[str] = set()    # nodes a move leaves (being drained)

    # -- signals ----------------------------------------------------------------------
    def install_signal_handlers(self) -> None:
        """SIGTERM and SIGINT ask the job to checkpoint and stop (a second one of them
        ends the driver at once)."""
        def handler(signum: int, frame: Any) -> None:
            if self._stop_signal is not None:
                raise KeyboardInterrupt
            self._stop_signal = signum
            LOG.info("job %s: %s received; stopping at the next batch boundary", self.name,
                     signal.Signals(signum).name)
        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

    def request_stop(self) -> None:
        """Checkpoint at the next batch boundary and end (as SIGTERM does)."""
        self._stop_signal = signal.SIGTERM

    # -- the run ----------------------------------------------------------------------
    def run(self) -> int:
        """Run the job to its end, its stop or its failure; the driver's exit status
        (0: finished or stopped after a checkpoint, 1: failed)."""
        point = self.files.resume_point()
        previous = self.files.read_status() or {}
        self._trained_s = float(previous.get("trained_s") or 0.0)
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
            self._write_status("finished", replicas=0)
            return 0
        restarts = restarts_for(None, point)
        archive = self._checkpoint_archive()
        replicas = self.sizer.start()
        LOG.info("job %s: starting %d replica(s) of %s (restart %d)", self.name, replicas,
                 dict(self.spec.resources), restarts)
        launch = self._launch(replicas, archive, restarts)
        while True:
            if launch is None:  # stopped while waiting for room
                self._teardown()
                self._write_status("stopped", replicas=0)
                self.sizer.end("stopped")
                return 0
            try:
                outcome = self._watch(launch)
            except Exception as exc:  # noqa: BLE001 - the job failed: say why, keep the state
                lost = self._lost_nodes(launch)
                if lost:
                    # Not the job's failure: continue from its newest checkpoint.
                    self._teardown()
                    archive = self._checkpoint_archive() or archive
                    replicas = self._room_elsewhere(launch)
                    restarts += 1
                    self._record["nodes_lost"] = int(self._record.get("nodes_lost", 0)) + \
                        len(lost)
                    LOG.warning("job %s: node(s) %s under its replicas were lost (%s); "
                                "continuing from its newest checkpoint with %d replica(s)",
                                self.name, ", ".join(n[:12] for n in lost),
                                str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
                                replicas)
                    launch = self._launch(replicas, archive, restarts)
                    continue
                LOG.error("job %s failed: %s", self.name, exc)
                self._keep_checkpoint(launch)
                self._teardown()
                self._write_status("failed", replicas=0, error=str(exc).splitlines()[0])
                self.sizer.end("failed")
                return 1
            self._trained_s += time.time() - (launch.first_step or launch.started)
            archive = self._keep_checkpoint(launch) or archive
            kind, target = outcome
            point = self.files.resume_point()
            if point is not None:
                self._record["epochs_done"] = point.finished_epochs
            if kind in ("finished", "stopped"):
                self._teardown()
                self._write_status(kind, replicas=0)
                self.sizer.end(kind)
                LOG.info("job %s %s (%d restarts); checkpoint in %s", self.name, kind,
                         restarts, self.files.checkpoint_path)
                return 0
            restarts += 1
            launch = self._relaunch(launch, target, archive, restarts)

    def _checkpoint_archive(self) -> bytes | None:
        """The job's newest checkpoint as tar bytes (None: a fresh start)."""
        from adaptdl_ray.tune import transfer
        if not self.files.checkpoint_path.is_dir():
            return None
        return transfer.pack_latest_checkpoint(str(self.files.checkpoint_path))

    def _launch(self, replicas: int, archive: bytes | None, restarts: int, *,
                keep: Sequence[Any] = ()) -> _Launch | None:
        """Start the script on ``replicas`` replicas: the idle actors ``keep`` (they keep
        their ranks' order, the first is rank 0) and new ones (the grow started while the
        job trained, if it brings as many, else reserved now). ``None``: a stop came while
        waiting for room.

        Raises:
            TimeoutError: the cluster had no room for them within _PLACEMENT_TIMEOUT_S.
        """
        from adaptdl_ray.tune.worker_group import WorkerGroup

        started = time.time()
        self._resize_s = None  # (measured anew for this launch: an older one is not sent)
        self._write_status("pending", replicas=0, target=replicas)
        need = replicas - len(keep)
        reservation = self._take_grow(need)
        if need > 0 and reservation is None:
            reservation = self._pool.reserve(need)
        logged = started
        while reservation is not None and not reservation.up(wait_s=1.0):
            now = time.time()
            if self._stop_signal is not None or now - started > _PLACEMENT_TIMEOUT_S:
                reservation.cancel()
                self._pool.release(keep)
                if self._stop_signal is not None:
                    return None
                raise TimeoutError(
                    f"the cluster had no room for {need} replica(s) of "
                    f"{dict(self.spec.resources)} within {_PLACEMENT_TIMEOUT_S:.0f} s: lower "
                    "--min-replicas or free resources")
            if now - logged > _WAITING_LOG_EVERY_S:
                LOG.info("job %s: waiting for room for %d replica(s)", self.name, need)
                logged = now
        actors = [*keep, *(self._pool.take(reservation) if reservation is not None else [])]
        try:
            group = WorkerGroup(replicas, self.spec.resources, None, self._trial_info,
                                actors=actors)
            config = {"script": self.script, "args": self.args,
                      "env": {TENSORBOARD_VAR: str(self.files.root / "tensorboard")}}
            group.start(run_script, config, fn_kwargs={},
                        archive=archive, user_files=None, num_restarts=restarts,
                        job_id=self.name, timeout_s=None)
        except BaseException:
            self._pool.release(actors)
            raise
        self._record["restarts"] = restarts
        return _Launch(replicas, group, started)

    def _relaunch(self, launch: _Launch, target: int, archive: bytes | None,
                  restarts: int) -> _Launch | None:
        """Continue a checkpointed launch with ``target`` replicas, keeping the replicas
        that stay (their processes, torch imported): those off the nodes being drained,
        lowest ranks first (rank 0 stays rank 0); the others stop. If the survivors cannot
        be made idle, every replica is replaced."""
        from adaptdl_ray.tune.worker_group import recycle_workers

        group = launch.group
        avoid, self._avoid_nodes = self._avoid_nodes, set()
        stay = [a for a, node in zip(group.actors, group.node_ids) if node not in avoid]
        stay = stay[:target]
        # Every replica leaves the job's process group together (one that loses its peers
        # first waits out the store's timeout); then the extra ones stop.
        if not recycle_workers(group.actors, self._trial_info):
            stay = []
        self._pool.release([a for a in group.actors if a not in stay])
        LOG.info("job %s: %d replica(s) stay, %d start", self.name, len(stay),
                 target - len(stay))
        return self._launch(target, archive, restarts, keep=stay)

    def _watch(self, launch: _Launch) -> tuple[str, int]:
        """Follow a launch until it ends or must end.

        Returns:
            ``("finished", 0)``, ``("stopped", 0)`` (checkpointed on a stop request),
            ``("resize", n)`` (checkpointed for a resize to ``n`` replicas),
            ``("move", n)`` (checkpointed to move off a draining node, relaunching with
            ``n``) or ``("relaunch", n)`` (the script checkpointed and stopped itself).

        Raises:
            WorkerFailed, TimeoutError: a replica failed or did not stop in time.
        """
        group = launch.group
        next_status = next_drain_check = 0.0
        interval = self.checkpoint_interval_s
        next_save = time.monotonic() + interval if interval else math.inf
        self._write_status("running", replicas=launch.replicas)
        while True:
            if self._stop_signal is not None:
                return self._checkpoint_and_end(launch, "stopping", "stopped", 0)
            if time.monotonic() >= next_save:
                self._save_in_place(launch)
                next_save = time.monotonic() + interval
            outcomes = group.finished(min(1.0, self.status_every_s))
            if outcomes is not None:
                if _all_finished(outcomes):
                    return "finished", 0
                LOG.info("job %s checkpointed and stopped itself; relaunching", self.name)
                return "relaunch", launch.replicas
            if time.monotonic() >= next_drain_check:
                next_drain_check = time.monotonic() + _DRAIN_CHECK_S
                target = self._move_target(launch)
                if target is not None:
                    self._resize_from = time.time()  # (its cost is a relaunch's, too)
                    return self._checkpoint_and_end(launch, "moving", "move", target)
            if time.monotonic() >= next_status:
                next_status = time.monotonic() + self.status_every_s
                self._observe(launch)
            decision = self.sizer.decision()
            target = decision.replicas
            self._explain(launch, decision)
            if decision.action != "resize" or target == launch.replicas or \
                    target < self.spec.min_replicas:
                self._cancel_grow()
                continue
            if target > launch.replicas and not self._grow_ready(launch,
                                                                      target - launch.replicas):
                continue  # the new replicas start while the job trains
            LOG.info("job %s: resizing %d -> %d replicas (%s)", self.name, launch.replicas,
                     target, decision.reason)
            self.sizer.begin_resize(decision)
            self._resize_from = time.time()
            return self._checkpoint_and_end(launch, "resizing", "resize", target)

    def _explain(self, launch: _Launch, decision: Any) -> None:
        """Say once, in the log and in status.json (``adaptdl-ray ls``), why the job runs
        below its maximum when its decision says why (the cluster has room, but the
        policy or the resize rule keeps it where it is)."""
        below = self.spec.max_replicas is None or launch.replicas < self.spec.max_replicas
        reason = decision.reason if below and decision.action in ("keep", "hold") and \
            decision.reason != "no change" else None
        if reason == self._record.get("reason"):
            return
        self._record["reason"] = reason
        if reason is not None:
            LOG.info("job %s: on %d replica(s)%s: %s", self.name, launch.replicas,
                     f" of up to {self.spec.max_replicas}" if self.spec.max_replicas else "",
                     reason)
        self._write_status("running", replicas=launch.replicas)

    def _checkpoint_and_end(self, launch: _Launch, status: str, kind: str, target: int
                            ) -> tuple[str, int]:
        """Stop the launch's replicas at their next batch boundary (each checkpoints),
        saying ``status`` meanwhile; ``(kind, target)``, or ``("finished", 0)`` if the
        script had ended anyway."""
        self._write_status(status, replicas=launch.replicas, target=target or launch.replicas)
        outcomes = launch.group.stop(self.stop_timeout_s)
        return ("finished", 0) if _all_finished(outcomes) else (kind, target)

    def _grow_ready(self, launch: _Launch, extra: int) -> bool:
        """Whether ``extra`` new replicas are up for a grow: reserves and starts them when
        their resources are free (others shrink first), and gives them back if they are
        not up within _GROW_WAIT_S (the cluster changed meanwhile)."""
        grow = self._grow
        if grow is not None and grow.count != extra:
            self._cancel_grow()
            grow = None
        try:
            if grow is None:
                if not self._fits(extra):
                    return False
                LOG.info("job %s: starting %d new replica(s) while it trains", self.name,
                         extra)
                # (they import what rank 0 has imported: the script's modules too)
                modules = launch.group.imported_modules()
                self._grow = grow = self._pool.reserve(extra, warm_up=(
                    modules, [os.path.dirname(os.path.abspath(self.script))]))
            if grow.up():
                return True
        except Exception as exc:  # noqa: BLE001 - the job trains on; the grow is retried
            LOG.warning("job %s: new replicas for a grow could not start (%s); trying again",
                        self.name, str(exc).splitlines()[0] if str(exc) else exc)
            self._cancel_grow()
            return False
        if time.monotonic() - grow.created > _GROW_WAIT_S:
            LOG.warning("job %s: %d new replica(s) not up within %.0f s; giving their "
                        "resources back", self.name, extra, _GROW_WAIT_S)
            self._cancel_grow()
        return False

    def _take_grow(self, need: int) -> Any:
        """The grow's reservation if it is up and brings ``need`` replicas, else
        ``None`` (a grow that does not match is given back)."""
        grow, self._grow = self._grow, None
        if grow is not None and grow.count == need and not grow.cancelled:
            return grow
        if grow is not None:
            grow.cancel()
        return None

    def _cancel_grow(self) -> None:
        """Give back the replicas started for a grow that is no longer wanted."""
        if self._grow is not None:
            LOG.info("job %s: grow to %d more replica(s) cancelled", self.name,
                     self._grow.count)
            self._grow.cancel()
            self._grow = None

    def _move_target(self, launch: _Launch) -> int | None:
        """If a node under the launch's replicas is being drained, the replicas to
        relaunch with on the other nodes (as many as now, if they fit there, else as many
        as fit, at least ``min_replicas``); ``None`` otherwise."""
        try:
            draining = self._draining_fn()
        except Exception as exc:  # noqa: BLE001 - keep training; say why once per check
            LOG.warning("job %s: could not ask which nodes are draining (%s)", self.name, exc)
            return None
        from adaptdl_ray.cluster.nodes import draining_under
        under = draining_under(launch.group.node_ids, draining)
        if under is None:
            return None
        hit, when = under
        self._avoid_nodes = set(hit)
        target = self._room_elsewhere(launch)
        LOG.warning("job %s: node(s) %s under its replicas are draining (%s): checkpointing "
                    "at the next batch boundary and moving to the other nodes with %d "
                    "replica(s)", self.name, ", ".join(n[:12] for n in hit), when, target)
        return target

    def _observe(self, launch: _Launch) -> None:
        """Pass rank 0's status and hints to the sizer, and write them to status.json."""
        try:
            snap = launch.group.snapshot()
        except TimeoutError as exc:
            LOG.warning("job %s: %s", self.name, exc)
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
                    LOG.info("job %s: the resize took %.1f s to the first step", self.name,
                             self._resize_s)
                    self._resize_from = None
        trained = self._trained_s + (time.time() - (launch.first_step or launch.started))
        progress = JobProgress(
            remaining_s=estimate_remaining_s(status.get("epochs_done", 0),
                                             status.get("epochs", 0), trained),
            restarts=int(status.get("restarts", 0)),
            resize_cost_s=self._resize_s,
            launch_s=(launch.first_step - launch.started) if launch.first_step else None)
        self.sizer.observe(launch.replicas, hints=snap["hints"], progress=progress)
        self._record.update({k: status.get(k) for k in (
            "batch_size", "goodput", "efficiency", "epochs_done", "epochs", "restarts")})
        self._record["nodes"] = launch.group.num_nodes
        self._write_status("running", replicas=launch.replicas, trained_s=trained)

    def _save_in_place(self, launch: _Launch) -> None:
        """Checkpoint at the next batch boundary, keep training, and keep the checkpoint
        in the job's storage (a save that found no boundary in time is skipped, logged).

        Raises:
            WorkerFailed: a replica failed meanwhile."""
        started = time.time()
        try:
            answer = launch.group.save(self.stop_timeout_s)
        except TimeoutError as exc:
            LOG.warning("job %s: in-place checkpoint skipped: %s", self.name, exc)
            return
        if answer.get("taken") and self._keep_checkpoint(launch, answer.get("path")):
            # (status.json: how many in-place checkpoints and the seconds they took)
            self._record["checkpoints"] = int(self._record.get("checkpoints", 0)) + 1
            self._record["checkpoint_s"] = float(self._record.get("checkpoint_s", 0.0)) + \
                time.time() - started

    def _lost_nodes(self, launch: _Launch) -> list[str]:
        """The nodes under the launch's replicas that are gone (after a replica failed;
        see :func:`~adaptdl_ray.cluster.nodes.lost_nodes_under`)."""
        from adaptdl_ray.cluster.nodes import lost_nodes_under
        return lost_nodes_under(launch.group.node_ids, launch.group.actors,
                                lambda: self._nodes_fn().keys())

    def _room_elsewhere(self, launch: _Launch) -> int:
        """Replicas to continue with after losing a node or moving off a draining one (see
        :func:`~adaptdl_ray.cluster.nodes.replicas_to_move`; the same size if the
        cluster cannot be read: Ray then finds the room)."""
        from adaptdl_ray.cluster.nodes import replicas_to_move
        try:
            return replicas_to_move(self.spec, launch.replicas, self._nodes_fn())
        except Exception as exc:  # noqa: BLE001 - ask for the same size; Ray finds room
            LOG.warning("job %s: could not read the cluster (%s)", self.name, exc)
            return launch.replicas

    def _fits(self, extra: int) -> bool:
        """Whether ``extra`` more replicas' resources are free on the cluster now."""
        import ray
        free = ray.available_resources()
        return all(free.get(k, 0.0) + 1e-9 >= v * extra for k, v in self.spec.resources.items())

    def _keep_checkpoint(self, launch: _Launch, path: str | None = None) -> bytes | None:
        """Move rank 0's checkpoint ``path`` (default: its newest) into the job's storage;
        returns its bytes (``None``: rank 0 wrote none, or it is gone)."""
        import ray
        try:
            archive = launch.group.checkpoint_archive(path)
        except ray.exceptions.RayError as exc:
            LOG.warning("job %s: could not fetch rank 0's checkpoint: %s", self.name, exc)
            return None
        if archive is None:
            return None
        path = self.files.store_checkpoint(archive)
        LOG.info("job %s: checkpoint kept in %s", self.name, path)
        return archive

    def _teardown(self) -> None:
        """Stop every replica of the job, started or starting, and free their resources."""
        self._cancel_grow()
        self._pool.release_all()

    def _write_status(self, status: str, *, replicas: int, target: int | None = None,
                      **extra: Any) -> None:
        self._record.update({"trained_s": self._trained_s, **extra})
        self._record.update(status=status, replicas=replicas,
                            target=replicas if target is None else target)
        try:
            self.files.write_status(self._record)
        except OSError as exc:
            LOG.warning("job %s: could not write its status: %s", self.name, exc)


def _all_finished(outcomes: Sequence[Mapping[str, Any]]) -> bool:
    """Whether every replica's outcome says its script ran to its end."""
    return all(o["status"] == "finished" for o in outcomes)


def _ray_draining_nodes() -> dict[str, float | None]:
    from adaptdl_ray.tune._ray_private import draining_nodes
    return draining_nodes()


def _ray_cluster_nodes() -> dict[str, Any]:
    from adaptdl_ray.cluster.nodes import cluster_nodes
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
