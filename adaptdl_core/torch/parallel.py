"""AdaptiveDataParallel: DistributedDataParallel whose training state survives restarts,
which measures gradient noise and scales the learning rate with the batch size.

Per optimizer step it (1) averages gradients over replicas *and* accumulation
micro-batches (a DDP communication hook), (2) measures the squared norms of the local
and averaged gradients in the same hook (on the steps the loader samples: see
``data.NOISE_DENSE_STEPS``), preconditioned for Adam-family optimizers, to estimate the
gradient noise, (3) sets the scaling rule's batch scale ``M / M0`` so the LR
is scaled around ``optimizer.step()`` only, and (4) counts statistical progress.

With several replicas, five numbers ride along with the first gradient bucket's
all-reduce of every optimizer step (no collective of their own): the replicas' local
squared norms of the *previous* step (complete only once its last bucket was measured),
how many replicas measured them, the graceful-stop flag and replica 0's batch size
choice; the data loader applies the last two at the batch boundary after the step.
A single replica has one gradient per step: on sampled steps the adaptive loader splits
the batch into two micro-batches; the first one's gradient, copied when the second one's
forward starts, and the step's averaged gradient give the two-batch estimate (see
``data.py`` and :meth:`AdaptiveDataParallel._update_noise`).
"""

from __future__ import annotations

import logging
import time
import types
import weakref
from typing import IO, Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from adaptdl_core import checkpoint
from adaptdl_core.torch import _interrupt, _metrics
from adaptdl_core.torch import data as _data
from adaptdl_core.torch.data import current_dataloader
from adaptdl_core.torch.gradient_noise_scale import (GradientNoiseScale, adam_preconditioner,
                                                     is_adam_family, preconditioned_sqr_norm)
from adaptdl_core.torch.scaling_rules import (ScalingRuleBase, default_rule_for,
                                              rescale_adam_state)

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
        scaling_rule: how the LR follows the batch size (a
            :class:`~adaptdl_core.torch.scaling_rules.ScalingRuleBase`); default
            AdamScale for Adam-family optimizers, else AdaScale.
        name: unique checkpoint name; set it when a program has several of these.
        **kwargs: passed to ``DistributedDataParallel``.

    Raises:
        RuntimeError: if no process group has been initialised.
        ValueError: if ``optimizer`` is not a torch optimizer or the name is taken.
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 lr_scheduler: Any = None, mp_scaler: Any = None,
                 scaling_rule: ScalingRuleBase | None = None,
                 name: str = "adaptdl-dataparallel", **kwargs: Any):
        if not dist.is_initialized():
            raise RuntimeError("AdaptiveDataParallel needs a process group: call "
                               "adaptdl_core.torch.init_process_group('gloo' or 'nccl') first")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise ValueError(f"AdaptiveDataParallel(optimizer=...): expected a "
                             f"torch.optim.Optimizer, got {type(optimizer).__name__}")
        if scaling_rule is not None and not isinstance(scaling_rule, ScalingRuleBase):
            raise ValueError("AdaptiveDataParallel(scaling_rule=...): expected a ScalingRuleBase "
                             f"such as AdaScale(), got {type(scaling_rule).__name__}")
        super().__init__(model, **kwargs)
        self.adaptdl_optimizer = optimizer
        self.adaptdl_lr_scheduler = lr_scheduler
        self.adaptdl_mp_scaler = mp_scaler
        self.scaling_rule = scaling_rule if scaling_rule is not None else default_rule_for(optimizer)
        self._gns: GradientNoiseScale | None = None
        self._gns_saved: dict | None = None
        self._precondition = is_adam_family(optimizer)
        self._inner_step = None  # the optimizer's step below our wrapper (with the rule)
        self._accumulating = False
        self._replicas = dist.get_world_size()
        # Single replica: a copy of the first micro-batch's gradient of a measured step.
        self._first_grads: list[torch.Tensor] = []
        self._first_params: list[torch.Tensor] | None = None
        self._since_measure = 0  # samples trained since the last noise measurement
        # Several replicas: this replica's local |g|^2 of the last step, to be sent with
        # the next step's first bucket; that step's (|mean g|^2, batch size) to pair the
        # replicas' sum with; the sums received in this step; the separate side
        # all-reduce (tensor, work) used when the first bucket is not float32/64.
        self._outgoing: float | None = None
        self._previous: tuple[float, int] | None = None
        self._incoming: list[float] | None = None
        self._side_work: tuple[torch.Tensor, Any] | None = None
        self._reset_step_measurements()
        self._state = _TrainingState(name, self)
        if checkpoint.load_state(self._state):
            LOG.info("restored model, optimizer and schedulers from the checkpoint")
        self.register_comm_hook(self, _average_and_measure_hook)
        self._install_step_wrapper()
        global _CURRENT
        _CURRENT = weakref.ref(self)

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        """Run the model; gradients are synchronised only on the last micro-batch of an
        optimizer step (earlier ones accumulate locally)."""
        loader = current_dataloader()
        if loader is None:
            self.require_backward_grad_sync = True
        else:
            self.require_backward_grad_sync = not loader.is_accumulation_step
            if loader._measure_first:
                # The accumulated gradient is still the first micro-batch's alone.
                loader._measure_first = False
                self._copy_first_grads()
        return super().forward(*inputs, **kwargs)

    # -- public measurements -------------------------------------------------------
    @property
    def gns(self) -> GradientNoiseScale | None:
        """The gradient noise estimator (``sqr_avg()``, ``var_avg()``, ``gain(scale)``);
        None until the first optimizer step inside a training loader loop."""
        return self._gns

    @property
    def gain(self) -> float:
        """The AdaScale gain of the current batch scale: how many steps at the initial
        batch size one step is worth (1.0 before any estimate)."""
        loader = current_dataloader() or _training_loader()
        if self._gns is None or loader is None:
            return 1.0
        return float(self._gns.gain(loader.current_batch_size / loader._target_batch_size))

    # -- the optimizer step ----------------------------------------------------------
    def _install_step_wrapper(self) -> None:
        optimizer = self.adaptdl_optimizer
        ddp = self

        def step(opt: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
            return ddp._step(*args, **kwargs)

        def zero_grad(opt: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
            # Between micro-batches of one optimizer step the gradients must accumulate.
            if ddp._accumulating:
                return None
            return ddp._zero_grad(*args, **kwargs)

        self._below_wrapper = optimizer.__dict__.get("step")
        self._inner_step = optimizer.step
        if getattr(optimizer.step, "_wrapped_by_lr_sched", False):
            # LR schedulers check this mark to know that step() is still theirs to count.
            step._wrapped_by_lr_sched = True  # type: ignore[attr-defined]
        self._zero_grad = optimizer.zero_grad
        optimizer.step = types.MethodType(step, optimizer)  # type: ignore[method-assign]
        optimizer.zero_grad = types.MethodType(zero_grad, optimizer)  # type: ignore[method-assign]

    def _attach_rule(self, init_batch_size: int) -> None:
        """Create the noise estimator (M0 is known once a training loader runs) and put
        the scaling rule directly below our step wrapper."""
        optimizer = self.adaptdl_optimizer
        self._gns = GradientNoiseScale(init_batch_size)
        if self._gns_saved is not None and self._gns_saved.get("init_batch_size") == init_batch_size:
            self._gns.load_state_dict(self._gns_saved)
        ours = optimizer.__dict__["step"]
        if self._below_wrapper is None:
            del optimizer.step
        else:
            optimizer.step = self._below_wrapper  # type: ignore[method-assign]
        self.scaling_rule.attach(optimizer, self._gns)
        self._inner_step = optimizer.step
        optimizer.step = ours  # type: ignore[method-assign]

    def _step(self, *args: Any, **kwargs: Any) -> Any:
        loader = current_dataloader()
        if loader is None:
            return self._inner_step(*args, **kwargs)
        if loader.is_accumulation_step:
            self._accumulating = True
            return None
        self._accumulating = False
        _metrics.metrics()  # make sure the metrics State exists before any checkpoint
        if _training_loader() is None:
            _data._LOOPS.training = loader
            _metrics.set_batch_size_limits(loader._target_batch_size, loader.max_batch_size,
                                           loader.local_bsz_bounds,
                                           loader._gradient_accumulation)
        init_bsz = loader._target_batch_size
        if self._gns is None:
            self._attach_rule(init_bsz)
        # The loader's batch size, and the samples this step actually has: fewer for the
        # partial last batch of a pass, which then counts (lr and progress) for what it is.
        nominal = loader.current_batch_size / init_bsz
        batch = loader._step_batch_size or loader.current_batch_size
        scale = batch / init_bsz
        previous = self.scaling_rule.scale
        if self._precondition and self.adaptdl_optimizer.state and previous != nominal:
            # Adam's second moments estimate E[g^2] at the old batch: rescale, not zero.
            rescale_adam_state(self.adaptdl_optimizer, previous, nominal, self._gns)
        self._update_noise(loader, batch)
        self.scaling_rule.set_scale(scale)
        try:
            result = self._inner_step(*args, **kwargs)
        finally:
            # The rule keeps (and checkpoints) the loader's scale, so that a partial batch
            # is not mistaken for a change of batch size.
            self.scaling_rule.set_scale(nominal)
        _metrics.add_progress(self._gns.accumulate_progress(scale))
        loader._stepped = True
        return result

    # -- gradient noise ----------------------------------------------------------------
    def _reset_step_measurements(self) -> None:
        self._measured = False    # the hook measured this step's norms
        self._local_sqr = 0.0     # sum over buckets of the replica-mean local |g_i|^2
        self._total_sqr = 0.0     # sum over buckets of |mean g|^2
        self._last_ready = 0.0    # when the last bucket was handed to the hook
        self._last_done = 0.0     # when the last all-reduce finished

    def _sqr_norm(self, params: list[torch.Tensor], flat: torch.Tensor) -> "float | torch.Tensor":
        if not self._precondition:
            return _blocked_sqr_norm(flat)
        total, offset = 0.0, 0
        for param in params:
            n = param.numel()
            v, eps, bc2 = adam_preconditioner(self.adaptdl_optimizer, param)
            total += preconditioned_sqr_norm(flat[offset:offset + n].view_as(param), v, eps, bc2)
            offset += n
        return total

    def _copy_first_grads(self) -> None:
        """Keep a copy of the gradients accumulated so far (the first micro-batch's), in
        buffers reused from one measured step to the next."""
        params = [p for p in self.module.parameters() if p.grad is not None]
        if not params or (self._precondition and not self.adaptdl_optimizer.state):
            # (Adam before its first step has no preconditioner to measure in.)
            self._first_params = None
            return
        grads = [p.grad.detach() for p in params]
        buffers = self._first_grads
        if len(buffers) != len(grads) or any(b.shape != g.shape or b.dtype != g.dtype
                                             for b, g in zip(buffers, grads)):
            buffers = self._first_grads = [torch.empty_like(g) for g in grads]
        torch._foreach_copy_(buffers, grads)
        self._first_params = params

    def _single_replica_norms(self) -> tuple[float, float]:
        """``(|m|^2, |g_1 - m|^2)`` for the step's averaged gradient ``m`` (now in the
        parameters' ``.grad``) and the first micro-batch's copied gradient ``g_1``."""
        params = self._first_params
        grads = [p.grad.detach() for p in params]
        diffs = self._first_grads
        torch._foreach_sub_(diffs, grads)
        if self._precondition:
            total = sum(self._sqr_norm([p], g.reshape(-1)) for p, g in zip(params, grads))
            spread = sum(self._sqr_norm([p], d.reshape(-1)) for p, d in zip(params, diffs))
            return total, spread
        # Fused float32 norms, squared and summed in float64.
        total = torch.stack(torch._foreach_norm(grads)).double().pow_(2).sum()
        spread = torch.stack(torch._foreach_norm(diffs)).double().pow_(2).sum()
        return float(total.item()), float(spread.item())

    def _update_noise(self, loader: "_data.AdaptiveDataLoader", batch_size: int) -> None:
        replicas = self._replicas
        self._since_measure += batch_size
        if self._last_done > self._last_ready:
            _metrics.record_sync_time(self._last_done - self._last_ready)
        if replicas == 1:
            micros = loader._step_micros
            if self._first_params is not None and micros > 1:
                # n micro-batches of b = M / n samples, averaged into m, the first one
                # g_1: with local = |m|^2 + |g_1 - m|^2, E[local] = |G|^2 + tr(Sigma) / b
                # (g_1 - m is pure noise: E|g_1 - m|^2 = tr(Sigma) / b * (n - 1) / n), so
                # the two-batch estimators stay unbiased; for n = 2 local is exactly
                # (|g_1|^2 + |g_2|^2) / 2.
                total, spread = self._single_replica_norms()
                self._record_noise(total + spread, total, micros, batch_size)
            self._first_params = None
        else:
            self._receive_side_values(loader, batch_size)
        self._reset_step_measurements()

    def _record_noise(self, local: float, total: float, num_grads: int, batch_size: int) -> None:
        gns = self._gns
        before = gns.num_updates
        gns.update(local, total, num_grads, batch_size, elapsed=self._since_measure)
        self._since_measure = 0
        if gns.num_updates != before:
            _metrics.record_grad_params(gns.grad_params())

    def _side_values(self, loader: "_data.AdaptiveDataLoader | None") -> torch.Tensor:
        """This replica's five numbers for the step's first bucket: [local |g|^2 of the
        previous step, 1 if it was measured, stop flag, replica 0's choice of (local
        batch, accumulation steps) or zeros]. Summed over replicas by the all-reduce."""
        local, self._outgoing = self._outgoing, None
        proposal = None
        if loader is not None:
            proposal, loader._proposal = loader._proposal, None
        return torch.tensor([local or 0.0, 0.0 if local is None else 1.0,
                             1.0 if _interrupt.exit_requested() else 0.0,
                             float(proposal[0]) if proposal else 0.0,
                             float(proposal[1]) if proposal else 0.0], dtype=torch.float64)

    def _receive_side_values(self, loader: "_data.AdaptiveDataLoader", batch_size: int) -> None:
        """After a step's backward: record the previous step's noise from the replicas'
        sums, hand the stop flag and batch choice to the loader's next boundary, and keep
        this step's norms for the next step's first bucket."""
        if self._side_work is not None:
            tensor, work = self._side_work
            self._side_work = None
            work.wait()
            self._incoming = tensor.tolist()
        received, self._incoming = self._incoming, None
        previous = self._previous
        measured = self._measured and not (self._precondition
                                           and not self.adaptdl_optimizer.state)
        self._previous = (float(self._total_sqr), batch_size) if measured else None
        self._outgoing = float(self._local_sqr) if measured else None
        if received is None:  # no first bucket this step (should not happen in a loop)
            return
        local_sum, count, flag, bsz, accum = received
        replicas = self._replicas
        if previous is not None and round(count) == replicas:
            # The local gradient of each replica is its mean over its micro-batches.
            self._record_noise(local_sum / replicas, previous[0], replicas, previous[1])
        loops = _data._LOOPS
        # A boundary not reached since an earlier step (the loop was left between steps)
        # still owes its stop request.
        stop, choice = loops.side_channel or (False, None)
        if bsz > 0:
            choice = (int(round(bsz)), int(round(accum)))
        loops.side_channel = (stop or flag > 0, choice)

_CURRENT: "weakref.ref[AdaptiveDataParallel] | None" = None


def current_model() -> "AdaptiveDataParallel | None":
    """The most recently created :class:`AdaptiveDataParallel` still alive, or ``None``."""
    return None if _CURRENT is None else _CURRENT()


def _training_loader() -> "_data.AdaptiveDataLoader | None":
    return _data._LOOPS.training


def _blocked_sqr_norm(flat: torch.Tensor, block: int = 1 << 16) -> torch.Tensor:
    """|x|^2 with float32 products and float64 accumulation across blocks: as accurate
    as a float64 norm for our purposes (relative error ~1e-9) and many times faster.
    A float64 scalar tensor on ``flat``'s device: read it once per step, not per bucket
    (on a GPU, reading it is a synchronisation in the middle of the backward pass)."""
    flat = flat.reshape(-1)
    if flat.dtype == torch.float64:
        return torch.dot(flat, flat)
    if flat.numel() == 0:
        return torch.zeros((), dtype=torch.float64, device=flat.device)
    flat = flat.float()
    return torch.stack([torch.dot(c, c) for c in flat.split(block)]).double().sum()


def _average_and_measure_hook(ddp, bucket):  # no annotations: DDP checks them as classes
    """DDP communication hook: average the bucket over replicas and accumulation
    micro-batches (in place, as DDP's default hook does), and measure the squared norms
    of the local gradient before and of the averaged gradient after the all-reduce.
    """
    loader = current_dataloader()
    micro = loader._step_micros if loader is not None else 1
    replicas = ddp._replicas
    buffer = bucket.buffer()
    if replicas == 1:
        # Nothing to exchange: average the micro-batches and hand the bucket back at once
        # (the noise is measured in _update_noise).
        if micro > 1:
            buffer.div_(micro)
        future = torch.futures.Future()
        future.set_result(buffer)
        return future
    ddp._last_ready = time.perf_counter()
    params = bucket.parameters()
    measure = loader is not None and loader._measure_norms
    if measure:
        # The local gradient is this replica's mean over its micro-batches: buffer / micro.
        ddp._measured = True
        ddp._local_sqr += ddp._sqr_norm(params, buffer) / (micro * micro)
    buffer.div_(micro * replicas)
    size = buffer.numel()
    if bucket.index() != 0:
        future = dist.all_reduce(buffer, async_op=True).get_future()
    else:
        # (On the bucket's device: nccl reduces GPU tensors only.)
        side = ddp._side_values(loader).to(buffer.device)
        if buffer.dtype in (torch.float32, torch.float64):
            # The side values ride along (one copy of the first bucket, at most ~1 MB by
            # DDP's default): no second round trip per step.
            future = dist.all_reduce(torch.cat([buffer, side.to(buffer.dtype)]),
                                     async_op=True).get_future()
        else:
            # Half-precision gradients cannot carry the sums exactly: send them beside.
            future = dist.all_reduce(buffer, async_op=True).get_future()
            ddp._side_work = (side, dist.all_reduce(side, async_op=True))

    def done(fut: torch.futures.Future) -> torch.Tensor:
        reduced = fut.value()[0]
        if reduced.numel() > size:
            ddp._incoming = reduced[size:].tolist()
            reduced = reduced[:size]
        if measure:
            ddp._total_sqr += ddp._sqr_norm(params, reduced)
        ddp._last_done = time.perf_counter()
        return reduced

    return future.then(done)


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
            "gns": ddp._gns.state_dict() if ddp._gns is not None else ddp._gns_saved,
            "scaling_rule": ddp.scaling_rule.state_dict(),
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
        ddp._gns_saved = data.get("gns")
        if data.get("scaling_rule"):
            ddp.scaling_rule.load_state_dict(data["scaling_rule"])
