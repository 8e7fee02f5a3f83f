"""AdaptiveDataParallel: DistributedDataParallel whose training state survives restarts."""

from __future__ import annotations

import logging
from typing import IO, Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from adaptdl_core import checkpoint

__all__ = ["AdaptiveDataParallel"]

LOG = logging.getLogger(__name__)


class AdaptiveDataParallel(DistributedDataParallel):
    """A :class:`~torch.nn.parallel.DistributedDataParallel` that checkpoints the model,
    the optimizer, the LR scheduler and the AMP grad scaler, and restores them when the
    job restarts (on the same or a different number of replicas).

    Create it after :func:`~adaptdl_core.torch.init_process_group`, outside data loader
    loops, in the same order on every replica. The torch random number generator state
    is checkpointed too, so a resumed run draws the same random numbers.

    Arguments:
        model: the module to train.
        optimizer: its optimizer.
        lr_scheduler: an optional LR scheduler (anything with ``state_dict``).
        mp_scaler: an optional ``torch.amp.GradScaler``.
        name: unique checkpoint name; set it when a program has several of these.
        **kwargs: passed to ``DistributedDataParallel``.

    Raises:
        RuntimeError: if no process group has been initialised.
        ValueError: if ``optimizer`` is not a torch optimizer or the name is taken.
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 lr_scheduler: Any = None, mp_scaler: Any = None,
                 name: str = "adaptdl-dataparallel", **kwargs: Any):
        if not dist.is_initialized():
            raise RuntimeError("AdaptiveDataParallel needs a process group: call "
                               "adaptdl_core.torch.init_process_group('gloo' or 'nccl') first")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise ValueError(f"AdaptiveDataParallel(optimizer=...): expected a "
                             f"torch.optim.Optimizer, got {type(optimizer).__name__}")
        super().__init__(model, **kwargs)
        self.adaptdl_optimizer = optimizer
        self.adaptdl_lr_scheduler = lr_scheduler
        self.adaptdl_mp_scaler = mp_scaler
        self._state = _TrainingState(name, self)
        if checkpoint.load_state(self._state):
            LOG.info("restored model, optimizer and schedulers from the checkpoint")


class _TrainingState(checkpoint.State):
    def __init__(self, name: str, ddp: AdaptiveDataParallel):
        super().__init__(name)
        self.ddp = ddp

    def save(self, fileobj: IO[bytes]) -> None:
        ddp = self.ddp
        torch.save({
            "model": ddp.module.state_dict(),
            "optimizer": ddp.adaptdl_optimizer.state_dict(),
            "lr_scheduler": (ddp.adaptdl_lr_scheduler.state_dict()
                             if ddp.adaptdl_lr_scheduler is not None else None),
            "mp_scaler": (ddp.adaptdl_mp_scaler.state_dict()
                          if ddp.adaptdl_mp_scaler is not None else None),
            "torch_rng": torch.get_rng_state(),
        }, fileobj)

    def load(self, fileobj: IO[bytes]) -> None:
        ddp = self.ddp
        device = next(ddp.module.parameters()).device
        data = torch.load(fileobj, map_location=device, weights_only=True)
        ddp.module.load_state_dict(data["model"])
        ddp.adaptdl_optimizer.load_state_dict(data["optimizer"])
        if ddp.adaptdl_lr_scheduler is not None and data["lr_scheduler"] is not None:
            ddp.adaptdl_lr_scheduler.load_state_dict(data["lr_scheduler"])
        if ddp.adaptdl_mp_scaler is not None and data["mp_scaler"] is not None:
            ddp.adaptdl_mp_scaler.load_state_dict(data["mp_scaler"])
        torch.set_rng_state(data["torch_rng"].cpu())
