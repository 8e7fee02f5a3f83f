"""Run one elastic training job on a Ray cluster, resized by its goodput model.

A single job is a one-trial Tune experiment under :class:`AdaptDLScheduler`: the job
starts at the size the policy gives it, is profiled, and is grown (or shrunk) by
checkpoint-restart as its goodput model says more replicas pay off, within the cluster.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Callable, Mapping

from ray import tune

from adaptdl_core import validation
from adaptdl_ray.tune.scheduler import AdaptDLScheduler
from adaptdl_ray.tune.creator import AdaptDLTrainableCreator

LOG = logging.getLogger(__name__)

__all__ = ["run_job"]


def _check_arguments(config: Any, name: Any, storage_path: Any, verbose: Any) -> None:
    """run_job's own arguments (the creator and the scheduler check theirs)."""
    if config is not None and not isinstance(config, Mapping):
        raise ValueError(f"config must be a dict of the job's settings (passed to train_fn) "
                         f"or None, got {config!r}")
    for arg, value in (("name", name), ("storage_path", storage_path)):
        if value is not None and (not isinstance(value, (str, os.PathLike))
                                  or not os.fspath(value)):
            raise ValueError(f"{arg} must be a non-empty string or None, got {value!r}")
    validation.integer("verbose", verbose, 0, 3, what="Tune's verbosity, an integer")


def run_job(train_fn: Callable[[dict], Any], config: Mapping[str, Any] | None = None, *,
            name: str | None = None, storage_path: str | None = None,
            num_cpus_per_worker: float = 1.0, num_gpus_per_worker: float = 0.0,
            min_replicas: int = 1, max_replicas: int | None = None,
            allocation_interval_s: float = 30.0, verbose: int = 1) -> tune.Result:
    """Train ``train_fn(config)`` as one elastic data-parallel job on the connected (or a
    new local) Ray cluster and return its final :class:`ray.tune.Result`.

    Args:
        train_fn: an adaptdl_core training function that reports with ``tune.report``.
        config: passed to ``train_fn`` (default ``{}``).
        name: experiment name (Tune's default when ``None``).
        storage_path: where results and checkpoints go (Tune's default when ``None``).
        num_cpus_per_worker, num_gpus_per_worker, min_replicas, max_replicas: as for
            :func:`~adaptdl_ray.tune.AdaptDLTrainableCreator`.
        allocation_interval_s: seconds between re-decisions of the job's size.
        verbose: Tune's verbosity (0 silent, 1 status, 2 with results).

    Returns:
        the job's result (``metrics`` holds its last report with the ``adaptdl/`` metrics).

    Raises:
        RuntimeError: if the job failed (the message carries the replica's error).
        ValueError: for invalid arguments, before anything starts: a ``config`` that is not
            a dict, a ``name`` or ``storage_path`` that is not a non-empty string, a
            ``verbose`` outside 0..3, and what the creator and the scheduler refuse.
    """
    _check_arguments(config, name, storage_path, verbose)
    trainable = AdaptDLTrainableCreator(train_fn, num_cpus_per_worker=num_cpus_per_worker,
                                        num_gpus_per_worker=num_gpus_per_worker,
                                        min_replicas=min_replicas, max_replicas=max_replicas)
    tuner = tune.Tuner(
        trainable, param_space=dict(config or {}),
        tune_config=tune.TuneConfig(
            scheduler=AdaptDLScheduler(allocation_interval_s=allocation_interval_s),
            num_samples=1),
        run_config=tune.RunConfig(name=name, storage_path=storage_path, verbose=verbose))
    result = tuner.fit()[0]
    if result.error is not None:
        raise RuntimeError(f"the job failed: {result.error}") from result.error
    return result
