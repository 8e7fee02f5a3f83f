"""The elastic training API for PyTorch (the ``adaptdl.torch`` API of AdaptDL).

A training script changes a few lines::

    import adaptdl_core.torch as adl

    adl.init_process_group("gloo")
    model = adl.AdaptiveDataParallel(model, optimizer, lr_scheduler)
    loader = adl.AdaptiveDataLoader(dataset, batch_size=128, shuffle=True)
    for epoch in adl.remaining_epochs_until(30):
        for x, y in loader:
            ...
        with accum.synchronized(): ...

and can then be interrupted (Ctrl-C, SIGTERM) at any batch, checkpointed and restarted on
any number of replicas, or checkpointed in place while it trains
(:func:`request_checkpoint`). A custom iterable is made elastic with
:class:`ElasticLoop`. A metric over a whole (sharded) validation set: add each
replica's sums to an :class:`Accumulator` after :func:`drop_padding` (see
:mod:`adaptdl_core.torch.whole_set`).
"""

from adaptdl_core.torch._interrupt import (CheckpointExit, PendingCheckpoint, exit_requested,
                                           request_checkpoint, request_checkpoint_and_exit)
from adaptdl_core.torch.accumulator import Accumulator
from adaptdl_core.torch.data import AdaptiveDataLoader, ElasticSampler, current_dataloader
from adaptdl_core.torch.elastic_loop import ElasticLoop
from adaptdl_core.torch.epoch import (DataProgress, current_epoch, data_progress,
                                      finished_epochs, job_finished, remaining_epochs_until)
from adaptdl_core.torch.parallel import AdaptiveDataParallel, model_state_dict
from adaptdl_core.torch.process_group import init_process_group
from adaptdl_core.torch.whole_set import drop_padding

__all__ = [
    "init_process_group",
    "AdaptiveDataParallel",
    "model_state_dict",
    "AdaptiveDataLoader",
    "ElasticSampler",
    "ElasticLoop",
    "current_dataloader",
    "remaining_epochs_until",
    "current_epoch",
    "finished_epochs",
    "job_finished",
    "data_progress",
    "DataProgress",
    "Accumulator",
    "drop_padding",
    "CheckpointExit",
    "request_checkpoint_and_exit",
    "exit_requested",
    "request_checkpoint",
    "PendingCheckpoint",
]
