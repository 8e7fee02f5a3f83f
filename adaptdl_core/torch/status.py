"""A snapshot of the job's adaptive state, for reporters and schedulers.

:func:`training_status` is what the Ray Tune integration adds to every result under the
``adaptdl/`` prefix; any other reporter (TensorBoard, a progress bar, a log line) can use
it too. It reads only in-process state: no collective, safe to call on any replica.
"""

from __future__ import annotations

from typing import Any

from adaptdl_core import env
from adaptdl_core.torch import _metrics
from adaptdl_core.torch import epoch as _epoch
from adaptdl_core.torch.data import current_dataloader
from adaptdl_core.torch.data import training_loader
from adaptdl_core.torch.parallel import current_model

__all__ = ["training_status", "sched_hints_dict", "first_step_walltime"]


def training_status() -> dict[str, Any]:
    """The job's shape and adaptive state right now.

    Returns:
        A flat dict of plain numbers:

        - ``replicas``, ``nodes``, ``restarts``: the job's shape and restart count;
        - ``batch_size``, ``local_bsz``, ``accum_steps``: the current global batch of an
          optimizer step, the per-replica micro-batch and the extra micro-batches per step
          (0 before a training loader exists);
        - ``goodput`` (samples/s) and ``efficiency`` (statistical efficiency in (0, 1]) of
          the current configuration predicted by the fitted model (0 before a model exists);
        - ``gain``: the AdaScale gain of the current batch (1 before any noise estimate);
        - ``noise_scale``: the gradient noise scale in samples (0 before any estimate);
        - ``progress``: statistical progress in steps at the initial batch size;
        - ``epochs_done`` and ``epochs``: finished epochs and the planned number (the bound
          of the latest ``remaining_epochs_until``; 0 before one is known);
        - ``samples_seen``, ``epoch_samples`` and ``data_passes``: training samples
          consumed in total and in the current epoch, and passes over the training data
          (see :func:`adaptdl_core.torch.data_progress`: with ``autoscale_batch_size`` an
          epoch may consume more or fewer samples than the dataset holds).
    """
    seen = _epoch.data_progress()
    status: dict[str, Any] = {
        "replicas": env.num_replicas(), "nodes": env.num_nodes(),
        "restarts": env.num_restarts(), "batch_size": 0, "local_bsz": 0, "accum_steps": 0,
        "goodput": 0.0, "efficiency": 0.0, "gain": 1.0, "noise_scale": 0.0,
        "progress": float(_metrics.metrics().progress),
        "epochs_done": _epoch.finished_epochs(), "epochs": _epoch.target_epochs() or 0,
        "samples_seen": seen.samples_seen, "epoch_samples": seen.epoch_samples,
        "data_passes": float(seen.data_passes),
    }
    loader = training_loader() or current_dataloader()
    if loader is not None:
        status.update(batch_size=loader.current_batch_size, local_bsz=loader.current_local_bsz,
                      accum_steps=loader.accumulation_steps)
        fn = _metrics.goodput_fn()
        if fn is not None:
            status["goodput"] = float(fn(env.num_nodes(), env.num_replicas(),
                                         loader.current_local_bsz, loader.accumulation_steps))
            status["efficiency"] = float(fn.efficiency(loader.current_batch_size))
    model = current_model()
    if model is not None:
        status["gain"] = float(model.gain)
        if model.gns is not None:
            status["noise_scale"] = float(model.gns.noise_scale())
    return status


def sched_hints_dict() -> dict[str, Any] | None:
    """The job's scheduler hints (:class:`~adaptdl_core.sched_hints.SchedHints` as a
    JSON-serialisable dict), or ``None`` before a training loader exists."""
    hints = _metrics.sched_hints()
    return None if hints is None else hints.to_dict()


def first_step_walltime() -> float | None:
    """Wall-clock time (seconds since the epoch) of this process's first optimizer step
    of a training loop, or ``None`` before it: launchers time restarts and resizes with
    it."""
    return _metrics.first_step_walltime()
