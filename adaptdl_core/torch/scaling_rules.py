"""Learning-rate scaling rules for a batch that changes during training.

When the total batch grows from ``M0`` to ``M = r * M0``, the learning rate has to change
too. A rule maps the batch scale ``r`` to a multiplier on every parameter group's lr:

==============  =====================================  ==============================
rule            ``scale_lr(r)``                          default for
==============  =====================================  ==============================
AdaScale        ``gain(r)``                              SGD and everything non-Adam
AdamScale       ``gain(r) ** 0.5``                       Adam, AdamW, NAdam, RAdam
LinearScale     ``r``
SqrtScale       ``sqrt(r)``
LEGWScale       ``sqrt(r) * min(progress / W, 1)``
==============  =====================================  ==============================

(``gain`` and ``progress`` come from a
:class:`~adaptdl_core.torch.gradient_noise_scale.GradientNoiseScale`.)

A rule is attached to an optimizer with :meth:`ScalingRuleBase.attach`. It then multiplies
each group's lr by ``scale_lr(r)`` only for the duration of ``optimizer.step()`` and
restores the exact previous values afterwards (also when ``step`` raises), so LR
schedulers and user code always see and modify the *unscaled* lr. The trainer calls
:meth:`ScalingRuleBase.set_scale` with the current ``r`` before each step.

:func:`rescale_adam_state` adapts Adam's second moments when the batch changes.
"""

from __future__ import annotations

import abc
import math
import types
from typing import Any, Callable, Dict, List, Mapping, Optional

import torch

from adaptdl_core import validation

# (rescale_adam_state lives with the other Adam helpers; it is part of this API too.)
from adaptdl_core.torch.adam_noise import rescale_adam_state
from adaptdl_core.torch.gradient_noise_scale import GradientNoiseScale, is_adam_family

__all__ = [
    "ScalingRuleBase",
    "AdaScale",
    "AdamScale",
    "LinearScale",
    "SqrtScale",
    "LEGWScale",
    "default_rule_for",
    "rescale_adam_state",
]

# Attribute set on an optimizer that has a rule attached (one rule per optimizer).
_ATTACHED_ATTR = "_adaptdl_scaling_rule"
# The mark torch's LR schedulers put on the optimizer.step they wrapped (and look for, to
# know whether step() is still theirs to count): a wrapper that keeps counting correct
# carries it on.
LR_SCHED_MARK = "_wrapped_by_lr_sched"


def _check_scale(scale: Any) -> float:
    """``scale`` as a finite float > 0 (ValueError otherwise, naming it). Every optimizer
    step comes here with a plain float: that is checked inline; anything else gets the
    full check, and its message."""
    if type(scale) is float and 0.0 < scale < math.inf:
        return scale
    return validation.number("scale", scale, 0.0, low_open=True)


class ScalingRuleBase(abc.ABC):
    """Base class of the learning-rate scaling rules.

    Subclasses implement :meth:`scale_lr`. Lifecycle: ``rule.attach(optimizer, gns)``
    once, then before each ``optimizer.step()`` ``rule.set_scale(M / M0)``; ``detach()``
    removes the patch. The scale persists across steps until changed (initially 1.0).

    Class attribute ``needs_gns``: whether the rule reads a
    :class:`~adaptdl_core.torch.gradient_noise_scale.GradientNoiseScale`.
    """

    needs_gns: bool = False

    def __init__(self) -> None:
        self._optimizer: Optional[torch.optim.Optimizer] = None
        self._gns: Optional[GradientNoiseScale] = None
        self._scale = 1.0
        self._step_fn: Optional[Callable[..., Any]] = None
        self._prev_step: Any = None
        self._active = False
        #: The lr multiplier used by the most recent ``optimizer.step()`` (1.0 before).
        self.last_lr_factor: float = 1.0

    # -------------------------------------------------------------- the rule itself

    @abc.abstractmethod
    def scale_lr(self, scale: float) -> float:
        """The multiplier (dimensionless, ``> 0``) applied to every param group's lr for a
        step at batch scale ``scale = M / M0``.

        Raises:
            RuntimeError: if the rule needs a noise estimator and none is attached.
        """

    # -------------------------------------------------------------- state

    @property
    def scale(self) -> float:
        """The current batch scale ``r = M / M0`` (set by :meth:`set_scale`)."""
        return self._scale

    @property
    def optimizer(self) -> Optional[torch.optim.Optimizer]:
        """The attached optimizer, or ``None``."""
        return self._optimizer

    @property
    def gns(self) -> Optional[GradientNoiseScale]:
        """The attached noise estimator, or ``None``."""
        return self._gns

    def set_scale(self, scale: float) -> None:
        """Set the batch scale ``r = M / M0`` used by the following optimizer steps.

        Raises:
            ValueError: if ``scale`` is not a finite number ``> 0``.
        """
        self._scale = _check_scale(scale)

    def lr_factor(self) -> float:
        """``scale_lr(self.scale)``: the multiplier the next step will use."""
        return float(self.scale_lr(self._scale))

    def _require_gns(self) -> GradientNoiseScale:
        if self._gns is None:
            raise RuntimeError(f"{type(self).__name__} needs a GradientNoiseScale: call "
                               "attach(optimizer, gns) or bind(gns) first")
        return self._gns

    def state_dict(self) -> Dict[str, Any]:
        """``{"scale": float}``: plain Python, JSON- and ``weights_only``-safe. (The
        attached optimizer and estimator have their own state.)"""
        return {"scale": float(self._scale)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore from :meth:`state_dict`.

        Raises:
            ValueError: if the state is malformed.
        """
        try:
            scale = state["scale"]
        except (KeyError, TypeError):
            raise ValueError(f"malformed scaling rule state: {state!r}") from None
        self._scale = _check_scale(scale)

    # -------------------------------------------------------------- applying

    def bind(self, gns: GradientNoiseScale) -> None:
        """Give the rule its noise estimator without patching an optimizer: for a caller
        that runs the optimizer step itself through :meth:`apply` (AdaptiveDataParallel's
        one step wrapper does).

        Raises:
            ValueError: if ``gns`` is not a GradientNoiseScale.
        """
        if not isinstance(gns, GradientNoiseScale):
            raise ValueError(f"gns must be a GradientNoiseScale, got {type(gns).__name__}")
        self._gns = gns

    def apply(self, optimizer: torch.optim.Optimizer, step: Callable[..., Any],
              *args: Any, **kwargs: Any) -> Any:
        """Run ``step(*args, **kwargs)`` (an optimizer step) with every parameter group's lr
        of ``optimizer`` multiplied by ``scale_lr(self.scale)``, and restore the lrs
        afterwards (also when the step raises). Records :attr:`last_lr_factor`.

        Returns:
            what ``step`` returned.
        """
        factor = float(self.scale_lr(self._scale))
        self.last_lr_factor = factor
        if factor == 1.0:
            return step(*args, **kwargs)
        groups = list(optimizer.param_groups)
        saved: List[Any] = [group["lr"] for group in groups]
        try:
            for group, lr in zip(groups, saved):
                group["lr"] = lr * factor
            return step(*args, **kwargs)
        finally:
            for group, lr in zip(groups, saved):
                group["lr"] = lr

    # -------------------------------------------------------------- patching

    def attach(self, optimizer: torch.optim.Optimizer,
               gns: Optional[GradientNoiseScale] = None) -> None:
        """Patch ``optimizer.step`` so that each call runs with every group's lr multiplied
        by ``scale_lr(self.scale)`` and restored afterwards.

        The patch is an instance attribute (a bound method), so it composes with LR
        schedulers created before or after it and with ``torch.amp.GradScaler.step``;
        optimizer step pre-hooks see the scaled lr, post-hooks too.

        Args:
            optimizer: a ``torch.optim.Optimizer``.
            gns: the noise estimator giving ``gain`` and ``progress`` (required by
                AdaScale, AdamScale and LEGWScale; optional otherwise).

        Raises:
            RuntimeError: if this rule is already attached, or the optimizer already has
                a rule.
            ValueError: if ``optimizer`` is not an optimizer, or ``gns`` is required but
                missing / of the wrong type.
        """
        if self._optimizer is not None:
            raise RuntimeError(f"{type(self).__name__} is already attached to an optimizer; "
                               "detach() it first")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise ValueError(f"expected a torch.optim.Optimizer, got {type(optimizer).__name__}")
        if getattr(optimizer, _ATTACHED_ATTR, None) is not None:
            raise RuntimeError("this optimizer already has a scaling rule attached")
        if gns is not None and not isinstance(gns, GradientNoiseScale):
            raise ValueError(f"gns must be a GradientNoiseScale, got {type(gns).__name__}")
        if self.needs_gns and gns is None:
            raise ValueError(f"{type(self).__name__} needs a GradientNoiseScale (gns=...)")

        inner = optimizer.step  # bound: the class's step, or a wrapper already installed
        prev = optimizer.__dict__.get("step")

        def step(opt: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
            if not self._active:
                return inner(*args, **kwargs)
            return self.apply(opt, inner, *args, **kwargs)

        if getattr(inner, LR_SCHED_MARK, False):
            # An LR scheduler already counts step calls underneath: tell later schedulers
            # not to wrap again (they would otherwise wrap this function, which also works).
            setattr(step, LR_SCHED_MARK, True)
        optimizer.step = types.MethodType(step, optimizer)  # type: ignore[method-assign]
        setattr(optimizer, _ATTACHED_ATTR, self)
        self._optimizer = optimizer
        self._gns = gns
        self._step_fn = step
        self._prev_step = prev
        self._active = True

    def detach(self) -> None:
        """Undo :meth:`attach`. If something wrapped ``optimizer.step`` after the rule did
        (e.g. an LR scheduler created later), the rule's layer stays in place but becomes a
        pass-through. A no-op when not attached."""
        opt = self._optimizer
        if opt is None:
            return
        self._active = False
        current = opt.__dict__.get("step")
        if getattr(current, "__func__", None) is self._step_fn:
            if self._prev_step is None:
                del opt.step
            else:
                opt.step = self._prev_step  # type: ignore[method-assign]
        if getattr(opt, _ATTACHED_ATTR, None) is self:
            delattr(opt, _ATTACHED_ATTR)
        self._optimizer = None
        self._gns = None
        self._step_fn = None
        self._prev_step = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(scale={self._scale:g})"


class AdaScale(ScalingRuleBase):
    """AdaScale (Johnson et al., 2020): ``scale_lr(r) = gain(r)``, the estimated number of
    ``M0``-batch SGD steps one step at ``r * M0`` is worth (between 1 and ``r``). The
    default rule for SGD-type optimizers."""

    needs_gns = True

    def scale_lr(self, scale: float) -> float:
        """AdaScale: the gain at ``scale`` (``1 <= gain <= scale``)."""
        return self._require_gns().gain(_check_scale(scale))


class AdamScale(ScalingRuleBase):
    """``scale_lr(r) = gain(r) ** 0.5``: the square-root counterpart of AdaScale for
    Adam-type optimizers (their update is normalised by the gradient's second moment, so
    the lr scales like the square root of the noise reduction, as in Pollux). The default
    for Adam, AdamW, NAdam and RAdam; measure the gain in the preconditioned space."""

    needs_gns = True

    def scale_lr(self, scale: float) -> float:
        """AdamScale: the square root of the gain at ``scale``."""
        return math.sqrt(self._require_gns().gain(_check_scale(scale)))


class LinearScale(ScalingRuleBase):
    """``scale_lr(r) = r`` (Goyal et al.'s linear scaling rule). Ignores gradient noise, so
    it overshoots when the batch is far above the noise scale."""

    def scale_lr(self, scale: float) -> float:
        """Linear scaling: ``scale`` itself."""
        return _check_scale(scale)


class SqrtScale(ScalingRuleBase):
    """``scale_lr(r) = sqrt(r)`` (Krizhevsky's square-root scaling)."""

    def scale_lr(self, scale: float) -> float:
        """Square-root scaling: ``sqrt(scale)``."""
        return math.sqrt(_check_scale(scale))


class LEGWScale(ScalingRuleBase):
    """Linear-epoch gradual warmup (You et al., LEGW): ``scale_lr(r) = sqrt(r) *
    min(progress / W, 1)`` with ``W = base_warmup_epochs * r * data_size / M0`` warmup
    steps counted in ``M0``-equivalent progress (``progress`` from the attached
    estimator). Warmup epochs thus grow linearly with the batch scale. The lr is 0 at
    ``progress == 0``; with ``base_warmup_epochs == 0`` it is plain ``sqrt(r)``.

    Args:
        base_warmup_epochs: warmup length in epochs at batch ``M0`` (``>= 0``).
        data_size: number of samples in one epoch (``> 0``).

    Raises:
        ValueError: for out-of-range arguments.
    """

    needs_gns = True

    def __init__(self, base_warmup_epochs: float, data_size: int) -> None:
        super().__init__()
        epochs = validation.number("base_warmup_epochs", base_warmup_epochs, 0.0)
        size = validation.number("data_size", data_size, 0.0, low_open=True)
        self.base_warmup_epochs = epochs
        self.data_size = size

    def scale_lr(self, scale: float) -> float:
        """LEGW: ``sqrt(scale)`` ramped up over the warm-up (see the class docstring)."""
        r = _check_scale(scale)
        gns = self._require_gns()
        steps_per_epoch = self.data_size / gns.init_batch_size
        warmup = self.base_warmup_epochs * r * steps_per_epoch
        if warmup <= 0.0:
            return math.sqrt(r)
        return math.sqrt(r) * min(max(gns.progress, 0.0) / warmup, 1.0)


def default_rule_for(optimizer: torch.optim.Optimizer) -> ScalingRuleBase:
    """A new, unattached :class:`AdamScale` for Adam-family optimizers (see
    :func:`~adaptdl_core.torch.gradient_noise_scale.is_adam_family`), else
    :class:`AdaScale`."""
    return AdamScale() if is_adam_family(optimizer) else AdaScale()
