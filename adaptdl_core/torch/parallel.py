"""AdaptiveDataParallel: DistributedDataParallel whose training state survives restarts,
which measures gradient noise and scales the learning rate with the batch size.

Per optimizer step it (1) averages gradients over replicas (DDP's own all-reduce) *and*
accumulation micro-batches, (2) measures the gradient noise on the steps the loader
samples, (3) sets the scaling rule's batch scale ``M / M0`` so the LR is scaled around
``optimizer.step()`` only, and (4) counts statistical progress. What happens around
the all-reduce for (1) and (2), and how the replicas share the stop flag and the batch
size choice, is in ``_gradient_probe.py``.
"""

from __future__ import annotations

import logging
import os
import types
import weakref
from typing import IO, Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from adaptdl_core import checkpoint, context
from adaptdl_core.torch import _metrics
from adaptdl_core.torch._gradient_probe import GradientProbe, Measurement
from adaptdl_core.torch.boundary import current_dataloader, loops, training_loader
from adaptdl_core.torch.gradient_noise_scale import GradientNoiseScale, is_adam_family
from adaptdl_core.torch.scaling_rules import (LR_SCHED_MARK, ScalingRuleBase,
                                              default_rule_for, rescale_adam_state)
from adaptdl_core.torch.step_cycle import StepCycle

__all__ = ["AdaptiveDataParallel", "model_state_dict"]

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
        ValueError: if ``model`` is not a torch Module, ``optimizer`` is not a torch
            optimizer or updates none of the model's parameters, ``lr_scheduler`` or
            ``mp_scaler`` has no ``state_dict``/``load_state_dict``, or the name is taken.
        adaptdl_core.checkpoint.CheckpointError: when resuming from a checkpoint that
            this model or optimizer cannot load (another optimizer type, other parameter
            shapes); the message says what differs.
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 lr_scheduler: Any = None, mp_scaler: Any = None,
                 scaling_rule: ScalingRuleBase | None = None,
                 name: str = "adaptdl-dataparallel", **kwargs: Any):
        if not dist.is_initialized():
            raise RuntimeError("AdaptiveDataParallel needs a process group: call "
                               "adaptdl_core.torch.init_process_group('gloo' or 'nccl') first")
        if not isinstance(model, torch.nn.Module):
            raise ValueError(f"AdaptiveDataParallel(model={model!r}): expected the "
                             f"torch.nn.Module to train, got a {type(model).__name__}")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise ValueError(f"AdaptiveDataParallel(optimizer=...): expected a "
                             f"torch.optim.Optimizer, got {type(optimizer).__name__}")
        _check_optimizer_trains(model, optimizer)
        if mp_scaler is not None and not (callable(getattr(mp_scaler, "state_dict", None))
                                          and callable(getattr(mp_scaler, "load_state_dict",
                                                               None))):
            raise ValueError(f"AdaptiveDataParallel(mp_scaler={mp_scaler!r}): expected a "
                             "torch.amp.GradScaler (anything with state_dict() and "
                             f"load_state_dict()) or None, got a {type(mp_scaler).__name__}")
        if scaling_rule is not None and not isinstance(scaling_rule, ScalingRuleBase):
            raise ValueError("AdaptiveDataParallel(scaling_rule=...): expected a ScalingRuleBase "
                             f"such as AdaScale(), got {type(scaling_rule).__name__}")
        if lr_scheduler is not None and not (callable(getattr(lr_scheduler, "state_dict", None))
                                             and callable(getattr(lr_scheduler, "load_state_dict",
                                                                  None))):
            # Checked now: otherwise the first checkpoint, epochs later, is what fails.
            raise ValueError("AdaptiveDataParallel(lr_scheduler=...): expected an LR scheduler "
                             "with state_dict() and load_state_dict() (e.g. a "
                             "torch.optim.lr_scheduler.LRScheduler) or None, got "
                             f"{type(lr_scheduler).__name__}")
        super().__init__(model, **kwargs)
        self.adaptdl_optimizer = optimizer
        self.adaptdl_lr_scheduler = lr_scheduler
        self.adaptdl_mp_scaler = mp_scaler
        self.scaling_rule = scaling_rule if scaling_rule is not None else default_rule_for(optimizer)
        self._gns: GradientNoiseScale | None = None
        self._gns_saved: dict | None = None
        self._precondition = is_adam_family(optimizer)
        self._inner_step = None  # the optimizer's step below our wrapper
        self._replicas = dist.get_world_size()
        self._probe = GradientProbe([p for p in self.module.parameters() if p.requires_grad],
                                    optimizer, self._replicas, self._precondition,
                                    grads_in_buckets=self.gradient_as_bucket_view)
        self._state = _TrainingState(name, self._save_state, self._load_state)
        if checkpoint.load_state(self._state):
            LOG.info("restored model, optimizer and schedulers from the checkpoint")
        self._install_step_wrapper()
        context.current().model = weakref.ref(self)

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        """Run the model; gradients are synchronised only on the last micro-batch of an
        optimizer step (earlier ones accumulate locally)."""
        # (The job's loop book, read once: the loader being iterated and its steps.)
        book = loops()
        step = book.cycle
        sync = step is None or not step.is_accumulation_step
        # One replica has nothing to exchange: DDP's reduction would only copy. (Set
        # only on a change: a Module's __setattr__ costs more than the comparison.)
        want_sync = sync and self._replicas > 1
        if self.require_backward_grad_sync is not want_sync:
            self.require_backward_grad_sync = want_sync
        if step is not None and torch.is_grad_enabled() and (
                book.training is None or book.training is book.current):
            self._probe.before_forward(step, sync)
        if self._replicas == 1 and not self.device_ids:
            # One replica, inputs where the user put them: DDP's forward would only add
            # its bookkeeping (join checks, buffer-sync checks, input moves) to each step;
            # its reducer does nothing without a sync (benchmarks/step_overhead.py).
            output = self.module(*inputs, **kwargs)
        else:
            output = super().forward(*inputs, **kwargs)
        if self._probe.hook_output:
            self._probe.after_forward(output)
        return output

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
        loader = current_dataloader() or training_loader()
        if self._gns is None or loader is None:
            return 1.0
        return float(self._gns.gain(loader.current_batch_size / loader.batch_size))

    # -- the optimizer step ----------------------------------------------------------
    def _install_step_wrapper(self) -> None:
        optimizer = self.adaptdl_optimizer

        def step(opt: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
            return self._step(*args, **kwargs)

        def zero_grad(opt: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
            # Between micro-batches of one optimizer step the gradients must accumulate.
            if self._probe.accumulating:
                return None
            return self._zero_grad(*args, **kwargs)

        self._inner_step = optimizer.step
        if getattr(optimizer.step, LR_SCHED_MARK, False):
            # LR schedulers check this mark to know that step() is still theirs to count.
            setattr(step, LR_SCHED_MARK, True)
        self._zero_grad = optimizer.zero_grad
        optimizer.step = types.MethodType(step, optimizer)  # type: ignore[method-assign]
        optimizer.zero_grad = types.MethodType(zero_grad, optimizer)  # type: ignore[method-assign]

    def _start_noise_estimate(self, init_batch_size: int) -> None:
        """Create the noise estimator (M0 is known once a training loader runs) and give
        it to the scaling rule."""
        self._gns = GradientNoiseScale(init_batch_size)
        if self._gns_saved is not None and self._gns_saved.get("init_batch_size") == init_batch_size:
            self._gns.load_state_dict(self._gns_saved)
        self.scaling_rule.bind(self._gns)

    def _step(self, *args: Any, **kwargs: Any) -> Any:
        """The one wrapper of ``optimizer.step``; its hooks run in this order: (1) skip the
        step on accumulation micro-batches, (2) the measurements (noise, Adam moments),
        (3) the lr scaling rule around the optimizer's own step, (4) progress."""
        book = loops()
        loader, step = book.current, book.cycle
        if step is None:
            # Outside a loader loop: no batch to account for; the rule keeps its scale.
            if self._gns is None:
                return self._inner_step(*args, **kwargs)
            return self.scaling_rule.apply(self.adaptdl_optimizer, self._inner_step,
                                           *args, **kwargs)
        # (1) (On the probe, a plain object: setting a torch Module's attribute is slow.)
        if step.is_accumulation_step:
            self._probe.accumulating = True
            return None
        self._probe.accumulating = False
        _metrics.metrics()  # make sure the metrics State exists before any checkpoint
        control = step.control
        if book.training is None:
            book.training = loader
            _metrics.set_batch_size_limits(control.init_batch_size, control.max_batch_size,
                                           control.local_bsz_bounds,
                                           control.gradient_accumulation)
        init_bsz = control.init_batch_size
        if self._gns is None:
            self._start_noise_estimate(init_bsz)
        # The loader's batch size, and the samples this step actually has: fewer for the
        # partial last batch of a pass, which then counts (lr and progress) for what it is.
        current = step.batch_size
        nominal = current / init_bsz
        batch = step.step_samples * step.world[1] or current
        scale = batch / init_bsz
        previous = self.scaling_rule.scale
        # (2)
        if self._precondition and self.adaptdl_optimizer.state and previous != nominal:
            # Adam's second moments estimate E[g^2] at the old batch: rescale, not zero.
            rescale_adam_state(self.adaptdl_optimizer, previous, nominal, self._gns)
        self._update_noise(step, batch)
        rule = self.scaling_rule
        if previous != scale:
            rule.set_scale(scale)
        try:  # (3)
            result = rule.apply(self.adaptdl_optimizer, self._inner_step, *args, **kwargs)
        finally:
            # The rule keeps (and checkpoints) the loader's scale, so that a partial batch
            # is not mistaken for a change of batch size.
            if scale != nominal:
                rule.set_scale(nominal)
        _metrics.add_progress(self._gns.accumulate_progress(scale))  # (4)
        step.note_optimizer_step()
        return result

    # -- checkpoint ----------------------------------------------------------------------
    def _save_state(self, fileobj: IO[bytes]) -> None:
        torch.save({
            "model": self.module.state_dict(),
            "optimizer": self.adaptdl_optimizer.state_dict(),
            "optimizer_type": _type_name(self.adaptdl_optimizer),
            "lr_scheduler": (self.adaptdl_lr_scheduler.state_dict()
                             if self.adaptdl_lr_scheduler is not None else None),
            "mp_scaler": (self.adaptdl_mp_scaler.state_dict()
                          if self.adaptdl_mp_scaler is not None else None),
            "torch_rng": torch.get_rng_state(),
            "gns": self._gns.state_dict() if self._gns is not None else self._gns_saved,
            "scaling_rule": self.scaling_rule.state_dict(),
        }, fileobj)

    def _load_state(self, fileobj: IO[bytes]) -> None:
        device = next(self.module.parameters()).device
        data = torch.load(fileobj, map_location=device, weights_only=True)
        try:
            self.module.load_state_dict(data["model"])
        except RuntimeError as exc:
            # torch's first line is only "Error(s) in loading state_dict for Linear:";
            # what differs (sizes, keys) is on the lines below it.
            details = "; ".join(line.strip().rstrip(".") for line in
                                str(exc).splitlines()[1:] if line.strip())
            raise ValueError(f"the checkpoint's model does not fit this "
                             f"{type(self.module).__name__}: {details or exc}. Build the "
                             "model as the run that wrote the checkpoint did, or start from "
                             "an empty checkpoint directory") from exc
        self._load_optimizer(data)
        if self.adaptdl_lr_scheduler is not None and data["lr_scheduler"] is not None:
            self.adaptdl_lr_scheduler.load_state_dict(data["lr_scheduler"])
        if self.adaptdl_mp_scaler is not None and data["mp_scaler"] is not None:
            self.adaptdl_mp_scaler.load_state_dict(data["mp_scaler"])
        torch.set_rng_state(data["torch_rng"].cpu())
        self._gns_saved = data.get("gns")
        if data.get("scaling_rule"):
            self.scaling_rule.load_state_dict(data["scaling_rule"])

    def _load_optimizer(self, data: dict) -> None:
        """Load the saved optimizer state; a state of another optimizer type, or one
        that does not fit, is refused with both types named (torch would say only, for
        example, ``KeyError: 'betas'``)."""
        optimizer = self.adaptdl_optimizer
        saved = data.get("optimizer_type")
        mine = _type_name(optimizer)
        if saved is not None and saved != mine:
            raise ValueError(f"the checkpoint holds the state of a {saved!r} optimizer, but "
                             f"this run's optimizer is {mine!r}; resume with {saved!r}, or "
                             "start from an empty checkpoint directory")
        try:
            optimizer.load_state_dict(data["optimizer"])
        except (KeyError, ValueError, RuntimeError) as exc:
            was = f"{saved!r}" if saved is not None else "the checkpoint's optimizer"
            raise ValueError(f"the optimizer state saved by {was} does not fit this run's "
                             f"{mine!r} ({type(exc).__name__}: {exc}); resume with the "
                             "optimizer and parameter groups that wrote it, or start from "
                             "an empty checkpoint directory") from exc

    # -- gradient noise ----------------------------------------------------------------
    def _update_noise(self, step: StepCycle, batch_size: int) -> None:
        for measurement in self._probe.after_backward(step, batch_size):
            self._record_noise(measurement)

    def _record_noise(self, m: Measurement) -> None:
        gns = self._gns
        before = gns.num_updates
        gns.update(m.local_sqr, m.total_sqr, m.num_grads, m.batch_size, elapsed=m.elapsed)
        if gns.num_updates != before:
            _metrics.record_grad_params(gns.grad_params())


def current_model() -> "AdaptiveDataParallel | None":
    """The most recently created :class:`AdaptiveDataParallel` still alive, or ``None``."""
    ref = context.current().model
    return None if ref is None else ref()



def _type_name(obj: Any) -> str:
    return type(obj).__qualname__


def _check_optimizer_trains(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Raise ValueError if ``optimizer`` updates none of ``model``'s parameters (training
    would then never change the model); warn about parameters it updates outside the
    model (DistributedDataParallel does not average their gradients over replicas)."""
    own = {id(p) for p in model.parameters()}
    params = [p for group in optimizer.param_groups for p in group["params"]]
    inside = sum(id(p) in own for p in params)
    if params and inside == 0:
        raise ValueError(f"AdaptiveDataParallel(model, optimizer): the {type(optimizer).__name__}"
                         f" updates {len(params)} parameter tensor(s), none of them "
                         f"{type(model).__name__}'s, so training would never change the "
                         "model; build the optimizer over model.parameters() of this model")
    if inside < len(params):
        LOG.warning("the %s updates %d parameter tensor(s) that are not the model's: their "
                    "gradients are not averaged over the replicas, nor are they saved with "
                    "the model", type(optimizer).__name__, len(params) - inside)


class _TrainingState(checkpoint.State):
    """The model wrapper's checkpointed state; the wrapper hands it its save and load."""

    def __init__(self, name: str, save: Any, load: Any):
        super().__init__(name)
        self.save = save  # type: ignore[method-assign]
        self.load = load  # type: ignore[method-assign]


def model_state_dict(checkpoint: Any, name: str = "adaptdl-dataparallel",
                     map_location: Any = "cpu") -> dict:
    """The weights an :class:`AdaptiveDataParallel` saved, from any AdaptDL checkpoint,
    without building the model or starting Ray: ``model.load_state_dict(
    model_state_dict(where))``.

    Args:
        checkpoint: a folder (see :func:`adaptdl_core.checkpoint.find_checkpoint`: one
            checkpoint as ``adaptdl-ray cp`` copies it out, a standalone job's
            ``--checkpoint-path``, a command-line job's storage directory, a Ray Tune
            trial's checkpoint folder), or a ``ray.tune.Checkpoint`` such as
            ``result.checkpoint`` (anything with ``as_directory()``).
        name: the ``name=`` given to ``AdaptiveDataParallel`` (its default if not given).
        map_location: as for ``torch.load`` (default: CPU).

    Returns:
        the wrapped module's ``state_dict`` (no ``module.`` prefixes).

    Raises:
        ValueError: ``checkpoint`` is ``None`` (a Tune result without a checkpoint),
            holds no AdaptDL checkpoint, or the checkpoint holds no model called ``name``
            (the message lists the states it holds).
        FileNotFoundError: the folder does not exist.
    """
    if checkpoint is None:
        raise ValueError("model_state_dict(None): no checkpoint was given (a Tune result "
                         "has one when the trial reported one with tune.report(..., "
                         "checkpoint=...) or with tune.CheckpointConfig(checkpoint_at_end="
                         "True))")
    as_directory = getattr(checkpoint, "as_directory", None)
    if as_directory is not None:  # a ray.tune.Checkpoint (which refuses os.fspath)
        with as_directory() as directory:
            return model_state_dict(directory, name, map_location)
    from adaptdl_core.checkpoint import find_checkpoint
    checkpoint_dir = find_checkpoint(checkpoint)
    path = os.path.join(checkpoint_dir, name)
    if not os.path.isfile(path):
        held = sorted(n for n in os.listdir(checkpoint_dir) if n != "MANIFEST.json")
        raise ValueError(f"{checkpoint_dir} holds no AdaptiveDataParallel state named "
                         f"{name!r} (it holds {held}); pass the name= given to "
                         "AdaptiveDataParallel")
    with open(path, "rb") as f:
        return torch.load(f, map_location=map_location, weights_only=True)["model"]
