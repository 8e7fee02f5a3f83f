"""AdaptDLTrainableCreator: one Tune trial = N data-parallel replicas of a training function.

The trial actor itself does no training. It starts one worker actor per bundle of its
placement group (see :mod:`.worker_group`), runs the user's function on all of them and
hands rank 0's reports to Tune, one result per ``step``. Tune's class-trainable hooks give
exact pauses:

* ``save_checkpoint`` (called by Tune when the trial pauses, e.g. to be resized) asks the
  replicas to checkpoint at the next batch boundary, waits for them, and stores rank 0's
  checkpoint (tar-packed by :mod:`.transfer`) plus a small JSON record in Tune's checkpoint
  directory. Reports made between the request and the stop are kept and handed to Tune
  after the resume, so none is lost or repeated.
* ``load_checkpoint`` (after Tune relaunches the trial, possibly with another number of
  bundles) keeps the bytes; the first ``step`` sends them to every new replica through the
  object store, and the job resumes at the same epoch and sample.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import time
from typing import Any, Callable, Mapping

import numpy as np
from ray import tune
from ray.tune.result import RESULT_DUPLICATE

from adaptdl_ray.tune import transfer
from adaptdl_ray.tune.resources import ReplicaSpec, num_replicas_of, placement_group_factory
from adaptdl_ray.tune.worker import METRIC_PREFIX
from adaptdl_ray.tune.worker_group import WorkerGroup

LOG = logging.getLogger(__name__)

__all__ = ["AdaptDLTrainableCreator", "AdaptDLTrainable", "is_adaptdl_trainable",
           "replica_spec_of"]

_STATE_DIR = "adaptdl"
_RECORD_FILE = "adaptdl_trial.json"
_POLL_S = 1.0
# After a report, how long to wait for the function to end (to mark the report final).
_FINISH_GRACE_S = 0.3


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return repr(value)


class AdaptDLTrainable(tune.Trainable):
    """Base class of the trainables made by :func:`AdaptDLTrainableCreator` (do not
    subclass it directly; the creator fills in the training function and the replica
    spec)."""

    _adaptdl_fn: Callable[[dict], Any] | None = None
    _adaptdl_spec: ReplicaSpec | None = None
    _adaptdl_stop_timeout_s: float = 120.0
    _adaptdl_collective_timeout_s: float | None = None

    @classmethod
    def default_resource_request(cls, config: dict) -> Any:
        """``min_replicas`` replicas until a scheduler decides otherwise."""
        return placement_group_factory(cls._adaptdl_spec, cls._adaptdl_spec.min_replicas)

    # -- Tune hooks -------------------------------------------------------------------
    def setup(self, config: dict) -> None:
        """Start the replica actors (the training function starts at the first step)."""
        if self._adaptdl_fn is None or self._adaptdl_spec is None:
            raise TypeError("AdaptDLTrainable is a base class: create trainables with "
                            "adaptdl_ray.tune.AdaptDLTrainableCreator(train_fn)")
        self._config = config
        self._setup_walltime = time.time()
        self._archive: bytes | None = None
        self._queue: list[dict] = []  # rank 0's reports not yet returned to Tune
        self._record: dict[str, Any] = {"restarts": 0, "finished": False, "resize_s": 0.0,
                                         "pause": None}
        self._measure_resize = False
        self._group = self._new_group()

    def _new_group(self) -> WorkerGroup:
        import ray
        pg = ray.util.get_current_placement_group()
        n = num_replicas_of(self.trial_resources) if pg is not None else \
            self._adaptdl_spec.min_replicas
        info = {"trial_name": self.trial_name, "trial_id": self.trial_id,
                "experiment_name": None, "trial_resources": self.trial_resources,
                "trial_dir": self.logdir}
        return WorkerGroup(n, self._adaptdl_spec.resources, pg, info)

    def load_checkpoint(self, checkpoint_dir: str) -> None:
        """Keep the checkpoint bytes and reports saved at the pause; count a restart."""
        with open(os.path.join(checkpoint_dir, _RECORD_FILE)) as f:
            record = json.load(f)
        self._archive = transfer.pack_latest_checkpoint(os.path.join(checkpoint_dir,
                                                                    _STATE_DIR))
        self._queue = list(record.pop("pending", []))
        record["restarts"] = int(record["restarts"]) + 1
        self._record.update(record)
        self._measure_resize = record.get("pause") is not None

    def step(self) -> dict:
        """Return rank 0's next report (the last one marked done).

        Raises:
            WorkerFailed: a replica failed (its traceback in the message)."""
        if self._record["finished"]:
            return self._next_final()
        if self._queue and not (self._group is not None and self._group.started):
            return self._decorate(self._queue.pop(0))  # reports replayed after a pause
        if self._group is None:
            self._record["restarts"] += 1
            self._setup_walltime = time.time()
            self._group = self._new_group()
        if not self._group.started:
            self._group.start(self._adaptdl_fn, self._config, archive=self._archive,
                              num_restarts=self._record["restarts"], job_id=self.trial_id,
                              timeout_s=self._adaptdl_collective_timeout_s)
        while True:
            if not self._queue:
                self._queue.extend(self._group.next_results(_POLL_S))
            if len(self._queue) > 1:
                return self._decorate(self._queue.pop(0))
            # With one report in hand, wait briefly for the function to end: its last
            # report then goes to Tune as the final result, so no scheduler decides a
            # resize for a trial that is done. Raises WorkerFailed on a failure.
            outcomes = self._group.finished(_FINISH_GRACE_S if self._queue else 0.0)
            if outcomes is None:
                if self._queue:
                    return self._decorate(self._queue.pop(0))
                continue
            self._queue.extend(self._group.next_results(0.0))
            if any(o["status"] == "checkpointed" for o in outcomes):
                # The job stopped itself (request_checkpoint_and_exit in the function):
                # continue from its checkpoint in fresh processes.
                self._relaunch_from_checkpoint()
                continue
            self._record["finished"] = True
            return self._next_final()

    def save_checkpoint(self, checkpoint_dir: str) -> dict | None:
        """Stop the replicas at the next batch boundary and store their checkpoint here.

        Raises:
            TimeoutError: the replicas did not stop within stop_timeout_s."""
        t0 = time.time()
        stopped = t0
        if self._group is not None and self._group.started and not self._record["finished"]:
            outcomes = self._group.stop(self._adaptdl_stop_timeout_s)
            stopped = time.time()
            self._queue.extend(self._group.next_results(0.0))
            if all(o["status"] == "finished" for o in outcomes):
                self._record["finished"] = True
        if self._group is not None and self._group.started:
            self._archive = self._group.checkpoint_archive() or self._archive
            self._group.shutdown()
            self._group = None
        if self._archive is not None:
            transfer.unpack(self._archive, os.path.join(checkpoint_dir, _STATE_DIR))
        record = dict(self._record, pending=self._queue,
                      pause={"requested": t0, "stopped": stopped, "saved": time.time()})
        with open(os.path.join(checkpoint_dir, _RECORD_FILE), "w") as f:
            json.dump(record, f, default=_jsonable)
        LOG.info("trial %s checkpointed in %.2f s (%d pending results)", self.trial_id,
                 record["pause"]["saved"] - t0, len(self._queue))
        return None

    def cleanup(self) -> None:
        """Kill the replica actors."""
        if getattr(self, "_group", None) is not None:
            self._group.shutdown()
            self._group = None

    def reset_config(self, new_config: dict) -> bool:
        """Never reuse a trial actor: every trial gets fresh replica processes."""
        return False  # fresh worker processes for every trial

    # -- helpers ---------------------------------------------------------------------
    def _next_final(self) -> dict:
        """After the function ended: its remaining reports, the last marked done."""
        if not self._queue:
            return self._final_result()
        result = self._decorate(self._queue.pop(0))
        return dict(result, done=True) if not self._queue else result

    def _relaunch_from_checkpoint(self) -> None:
        self._archive = self._group.checkpoint_archive() or self._archive
        self._group.shutdown()
        self._group = None
        self._record["restarts"] += 1
        self._setup_walltime = time.time()
        self._group = self._new_group()
        self._group.start(self._adaptdl_fn, self._config, archive=self._archive,
                          num_restarts=self._record["restarts"], job_id=self.trial_id,
                          timeout_s=self._adaptdl_collective_timeout_s)

    def _decorate(self, result: dict) -> dict:
        result = dict(result)
        if self._measure_resize and self._group is not None and result.get(
                METRIC_PREFIX + "restarts") == self._record["restarts"]:
            # The first report of the resumed job: how long the resize took, by phase.
            self._measure_resize = False
            phases = resize_phases(self._record["pause"], self._setup_walltime,
                                   self._group.timeline())
            self._record["resize_s"] = phases.pop("total_s")
            result.update({f"{METRIC_PREFIX}resize/{k}": v for k, v in phases.items()})
        result[METRIC_PREFIX + "resize_s"] = self._record["resize_s"]
        return result

    def _final_result(self) -> dict:
        # Tune then completes the trial with its last reported result, without logging a
        # repeated row.
        return {RESULT_DUPLICATE: True, "done": True}


def resize_phases(pause: Mapping[str, float], setup_at: float,
                  timeline: Mapping[str, float]) -> dict[str, float]:
    """Split one pause-resize-resume cycle into phases (seconds).

    Args:
        pause: wall-clock times the pause was ``requested``, the replicas ``stopped`` (the
            checkpoint written) and the checkpoint was ``saved`` into Tune's directory.
        setup_at: when the relaunched trial actor began its setup.
        timeline: the new launch's milestones (``created``, ``workers_up``, ``ready``,
            ``first_step``; see ``WorkerGroup.timeline``); a missing ``first_step`` means
            "not seen", and the current time stands in for it.

    Returns:
        ``checkpoint_s`` (stop at a batch boundary, rank 0 writes), ``save_s`` (checkpoint
        bytes into Tune's directory, old replicas gone), ``relaunch_s`` (Tune persists the
        checkpoint, frees and re-creates the placement group, starts the trial actor; also
        any time the trial waited for resources), ``worker_start_s`` (replica actors up),
        ``restore_s`` (checkpoint handed over, torch imported, files unpacked),
        ``first_step_s`` (process group, states loaded, first optimizer step), and their sum
        ``total_s``.
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
    phases = {k: max(float(v), 0.0) for k, v in phases.items()}
    phases["total_s"] = max(first - pause["requested"], 0.0)
    return phases


def is_adaptdl_trainable(trainable_cls: Any) -> bool:
    """True for a class made by :func:`AdaptDLTrainableCreator`."""
    return isinstance(trainable_cls, type) and issubclass(trainable_cls, AdaptDLTrainable) \
        and trainable_cls._adaptdl_spec is not None


def replica_spec_of(trainable_cls: Any) -> ReplicaSpec:
    """The :class:`ReplicaSpec` of an AdaptDL trainable.

    Raises:
        TypeError: if ``trainable_cls`` was not made by :func:`AdaptDLTrainableCreator`.
    """
    if not is_adaptdl_trainable(trainable_cls):
        name = getattr(trainable_cls, "__name__", repr(trainable_cls))
        raise TypeError(f"AdaptDLScheduler can only schedule trainables created with "
                        f"adaptdl_ray.tune.AdaptDLTrainableCreator(train_fn); got {name}. "
                        "Wrap your training function: "
                        "tune.run(AdaptDLTrainableCreator(train_fn), ...)")
    return trainable_cls._adaptdl_spec


def AdaptDLTrainableCreator(train_fn: Callable[[dict], Any], *,  # noqa: N802 (AdaptDL's name)
                            num_cpus_per_worker: float = 1.0, num_gpus_per_worker: float = 0.0,
                            resources_per_worker: Mapping[str, float] | None = None,
                            min_replicas: int = 1, max_replicas: int | None = None,
                            stop_timeout_s: float = 120.0,
                            collective_timeout_s: float | None = None,
                            name: str | None = None) -> type[AdaptDLTrainable]:
    """Make a Tune trainable that runs ``train_fn(config)`` on N data-parallel replicas.

    ``train_fn`` is an ordinary adaptdl_core training function (``init_process_group``,
    ``AdaptiveDataParallel``, ``AdaptiveDataLoader``, ``remaining_epochs_until``...) that
    calls ``ray.tune.report(metrics)``; only rank 0's reports reach Tune, with the
    ``adaptdl/...`` metrics added. The number of replicas is the number of bundles after
    the head bundle of the trial's placement group, which :class:`AdaptDLScheduler` sets.

    Args:
        train_fn: ``fn(config)``; it is pickled and run in each worker actor.
        num_cpus_per_worker: CPUs of each replica's bundle (also its torch threads).
        num_gpus_per_worker: GPUs of each replica's bundle.
        resources_per_worker: extra custom resources per replica.
        min_replicas, max_replicas: bounds on the replica count (``max`` ``None``: the
            cluster is the limit).
        stop_timeout_s: how long a pause may wait for the replicas to reach a batch
            boundary and checkpoint.
        collective_timeout_s: ``ADAPTDL_TIMEOUT`` for the replicas (default: the core's 30 s).
        name: the trainable's name in Tune (trial names start with it); default
            ``AdaptDL_<function name>``.

    Returns:
        a subclass of :class:`AdaptDLTrainable` to pass to ``tune.run`` or ``tune.Tuner``.

    Raises:
        ValueError: for a non-callable ``train_fn``, a function that cannot take a config
            argument, non-positive resources, or ``min_replicas > max_replicas`` (the message
            names the argument).
    """
    if not callable(train_fn):
        raise ValueError(f"train_fn must be a function fn(config), got {type(train_fn).__name__}")
    try:
        inspect.signature(train_fn).bind({})
    except TypeError:
        raise ValueError(f"train_fn {getattr(train_fn, '__name__', train_fn)!r} must accept "
                         "one argument (the trial's config dict)") from None
    except ValueError:
        pass  # builtins without a signature: let them fail at run time
    for arg, value in (("num_cpus_per_worker", num_cpus_per_worker),
                       ("num_gpus_per_worker", num_gpus_per_worker),
                       ("stop_timeout_s", stop_timeout_s)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise ValueError(f"{arg} must be a number >= 0, got {value!r}")
    if stop_timeout_s <= 0:
        raise ValueError(f"stop_timeout_s must be > 0, got {stop_timeout_s!r}")
    resources = {"CPU": float(num_cpus_per_worker), "GPU": float(num_gpus_per_worker)}
    resources.update(resources_per_worker or {})
    spec = ReplicaSpec(resources, min_replicas=min_replicas, max_replicas=max_replicas)
    cls_name = name or f"AdaptDL_{getattr(train_fn, '__name__', 'trainable')}"
    return type(cls_name, (AdaptDLTrainable,), {
        "_adaptdl_fn": staticmethod(train_fn),
        "_adaptdl_spec": spec,
        "_adaptdl_stop_timeout_s": float(stop_timeout_s),
        "_adaptdl_collective_timeout_s": collective_timeout_s,
        "__doc__": f"AdaptDL trainable running {cls_name} on N data-parallel replicas.",
    })
