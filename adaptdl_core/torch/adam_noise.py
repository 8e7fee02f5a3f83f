"""Adam-family optimizers and the gradient noise: the preconditioner helpers.

For Adam-type optimizers the gradient noise is measured in the space the optimizer steps
in, ``g / (sqrt(v_hat) + eps)`` (see ``docs/algorithms.md``, "Gradient noise"). These
helpers recognise such optimizers and compute preconditioned squared norms, and
:func:`rescale_adam_state` carries Adam's second moments over a change of batch size.
"""

from __future__ import annotations

import math
from typing import Any, Optional, Protocol, Tuple

import torch

from adaptdl_core import validation

__all__ = ["is_adam_family", "preconditioned_sqr_norm", "adam_preconditioner",
           "rescale_adam_state"]


class NoiseGain(Protocol):
    """What the rescaling reads from a gradient noise estimate (a
    :class:`~adaptdl_core.torch.gradient_noise_scale.GradientNoiseScale`, which imports
    this module: named here by what it offers, not imported)."""

    @property
    def has_estimate(self) -> bool:
        """Whether any noise has been measured."""

    def gain(self, scale: float) -> float:
        """The AdaScale gain at batch scale ``scale``."""


def is_adam_family(optimizer: Any) -> bool:
    """Whether ``optimizer`` preconditions by ``sqrt(v_hat) + eps`` with an ``exp_avg_sq``
    state, Adam-style: ``torch.optim.Adam``, ``AdamW``, ``NAdam``, ``RAdam`` and their
    subclasses.

    Left out on purpose: ``Adamax`` (infinity-norm second moment, no ``exp_avg_sq``),
    ``SparseAdam`` (sparse updates), ``Adagrad``/``RMSprop`` (no bias-corrected EMA); these
    are treated like SGD (AdaScale, plain-gradient noise). For RAdam the preconditioner
    is only used once its variance rectification switches on (after about 5 steps); the
    noise is still measured in the preconditioned space, a close approximation.
    """
    return isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW, torch.optim.NAdam,
                                  torch.optim.RAdam))


def preconditioned_sqr_norm(grad: torch.Tensor, exp_avg_sq: Optional[torch.Tensor],
                            eps: float, bias_correction2: float) -> float:
    """Squared norm of ``grad`` in Adam's preconditioned space:
    ``sum((grad / (sqrt(exp_avg_sq / bias_correction2) + eps)) ** 2)``.

    Args:
        grad: a gradient (any shape, any float dtype, any device).
        exp_avg_sq: Adam's (biased) second-moment state for the same parameter, or
            ``None`` before the first optimizer step; then the plain ``|grad|^2`` is
            returned.
        eps: Adam's ``eps`` (``>= 0``).
        bias_correction2: ``1 - beta2 ** step`` (in ``(0, 1]``).

    Returns:
        A Python float. Elementwise work is done in float32 (float64 for float64 input),
        the sum is accumulated in float64: the two-batch estimators subtract nearly equal
        norms, so accumulation error matters. On a CUDA tensor this synchronises.

    Raises:
        ValueError: if the shapes differ, ``eps < 0`` or ``bias_correction2`` is not in
            ``(0, 1]``.
    """
    g = grad.detach()
    work = torch.float64 if g.dtype == torch.float64 else torch.float32
    if exp_avg_sq is None:
        if not g.numel():
            return 0.0
        return float(g.to(work).pow(2).sum(dtype=torch.float64).item())
    if tuple(exp_avg_sq.shape) != tuple(g.shape):
        raise ValueError(f"exp_avg_sq shape {tuple(exp_avg_sq.shape)} != grad shape "
                         f"{tuple(g.shape)}")
    eps = float(eps)
    bc2 = float(bias_correction2)
    if not (eps >= 0.0 and math.isfinite(eps)):
        raise ValueError(f"eps must be >= 0, got {eps!r}")
    if not 0.0 < bc2 <= 1.0:
        raise ValueError(f"bias_correction2 must be in (0, 1], got {bias_correction2!r}")
    if not g.numel():
        return 0.0
    gw = g.to(work)
    denom = exp_avg_sq.detach().to(device=gw.device, dtype=work).div(bc2).sqrt_()
    denom.add_(eps)
    return float(gw.div(denom).pow_(2).sum(dtype=torch.float64).item())


def adam_preconditioner(optimizer: torch.optim.Optimizer, param: torch.Tensor
                        ) -> Tuple[Optional[torch.Tensor], float, float]:
    """The arguments of :func:`preconditioned_sqr_norm` for one parameter of an
    Adam-family optimizer: ``(exp_avg_sq, eps, bias_correction2)``.

    ``exp_avg_sq`` is ``max_exp_avg_sq`` for AMSGrad groups (what Adam divides by) and
    ``None`` while the parameter has no state yet (before its first step), in which case
    ``bias_correction2`` is 1.0.

    Raises:
        ValueError: if ``param`` is not in any of the optimizer's groups, or the group has
            no ``betas``/``eps`` (not an Adam-family optimizer).
    """
    for group in optimizer.param_groups:
        if any(p is param for p in group["params"]):
            break
    else:
        raise ValueError("param is not managed by this optimizer")
    if "betas" not in group or "eps" not in group:
        raise ValueError(f"{type(optimizer).__name__} is not an Adam-family optimizer")
    eps = float(group["eps"])
    state = optimizer.state.get(param, {})
    key = "max_exp_avg_sq" if group.get("amsgrad", False) else "exp_avg_sq"
    v = state.get(key)
    step = state.get("step")
    if v is None or step is None:
        return None, eps, 1.0
    step_f = float(step.item()) if isinstance(step, torch.Tensor) else float(step)
    if step_f <= 0:
        return None, eps, 1.0
    beta2 = float(group["betas"][1])
    return v, eps, 1.0 - beta2 ** step_f


def _global_adam_factor(old_r: float, new_r: float,
                        gns: Optional[NoiseGain]) -> float:
    """``E|g_new|^2 / E|g_old|^2`` from the estimator, or the conservative bound."""
    if gns is not None and gns.has_estimate:
        # (sqr + var / new) / (sqr + var / old) == gain(old) / gain(new)
        return gns.gain(old_r) / gns.gain(new_r)
    return max(old_r / new_r, 1.0)


def rescale_adam_state(optimizer: torch.optim.Optimizer, old_scale: float, new_scale: float,
                       gns: Optional[NoiseGain] = None) -> float:
    """Rescale Adam's second moments in place when the batch scale changes (do not zero
    them); returns the overall factor applied (``sum(v_new) / sum(v_old)``, 1.0 if there
    was nothing to rescale).

    Why: ``exp_avg_sq`` tracks, per coordinate, ``E[g_j^2] = G_j^2 + S_j / M`` for the
    gradient of a batch of ``M`` samples (``S_j`` the per-sample variance). After a change
    ``M_old -> M_new`` it is stale: too large after growing the batch (steps smaller than
    intended for ~``1 / (1 - beta2)`` steps), too small after shrinking it (steps too
    large: instability). Zeroing it (the original AdaptDL) is worse: with the step count
    kept, ``v_hat`` collapses and the next steps explode.

    How, per coordinate (the default; bias-corrected ``m = exp_avg / (1 - beta1^t)``,
    ``v = exp_avg_sq / (1 - beta2^t)``): Adam's first moment averages about
    ``(1 + beta1) / (1 - beta1)`` gradients, so ``E[m^2] = G^2 + (S / M) * (1 - beta1) /
    (1 + beta1)`` and the noise part of ``v`` is estimated as
    ``noise = clamp((v - m^2) * (1 + beta1) / (2 * beta1), 0, v)``; then
    ``v_new = v + noise * (M_old / M_new - 1)`` (the signal part is kept, the noise part
    rescaled). ``v_new`` always lies between ``v`` and ``v * M_old / M_new`` (the pure-signal
    and pure-noise extremes). On a synthetic stationary problem this cut the mean
    ``|log(v / v_steady)|`` error from 0.55-1.1 (left stale) to 0.2-0.35 (see the tests);
    a slow drift of ``G`` counts as noise, so after growing the batch ``v`` may end
    slightly low.

    Fallback, for parameters whose group has ``beta1 < 0.5`` (the first moment is then too
    short an average) or no ``exp_avg``: one global factor ``(sqr + var / new_scale) /
    (sqr + var / old_scale) = gain(old) / gain(new)`` from ``gns`` (exact when all
    coordinates share the signal/noise split; with the noise measured in Adam's
    preconditioned space it is the plain average of the per-coordinate ratios), or
    without an estimate the conservative ``max(old_scale / new_scale, 1)`` (shrinking:
    assume pure noise; growing: assume pure signal; both err towards smaller steps).

    ``max_exp_avg_sq`` (AMSGrad) is multiplied by the same per-coordinate ratio;
    ``exp_avg`` (an estimate of ``G``, independent of the batch) and ``step`` are kept.

    Args:
        optimizer: any optimizer; parameters without ``exp_avg_sq`` state are skipped (a
            non-Adam optimizer is left unchanged).
        old_scale, new_scale: the batch scales ``M / M0`` before and after.
        gns: the noise estimator, for the fallback only.

    Raises:
        ValueError: if a scale is not a finite number ``> 0``.
    """
    old_r = validation.number("old_scale", old_scale, 0.0, low_open=True)
    new_r = validation.number("new_scale", new_scale, 0.0, low_open=True)
    if old_r == new_r:
        return 1.0
    ratio = old_r / new_r
    sum_old = 0.0
    sum_new = 0.0
    with torch.no_grad():
        for group in optimizer.param_groups:
            betas = group.get("betas")
            beta1 = float(betas[0]) if betas is not None else 0.0
            beta2 = float(betas[1]) if betas is not None else 0.0
            for param in group["params"]:
                state = optimizer.state.get(param)
                if not state:
                    continue
                v = state.get("exp_avg_sq")
                if not isinstance(v, torch.Tensor):
                    continue
                m = state.get("exp_avg")
                step = state.get("step", 0)
                step = float(step.item()) if isinstance(step, torch.Tensor) else float(step)
                if v.is_complex():  # not expected from torch's Adam; keep it simple
                    v.mul_(_global_adam_factor(old_r, new_r, gns))
                    continue
                v32 = v.detach().to(torch.float32 if v.dtype != torch.float64 else v.dtype)
                if isinstance(m, torch.Tensor) and not m.is_complex() and beta1 >= 0.5 \
                        and step > 0 and betas is not None:
                    bc1 = 1.0 - beta1 ** step
                    bc2 = 1.0 - beta2 ** step
                    m_hat = m.detach().to(v32.dtype) / bc1
                    v_hat = v32 / bc2
                    noise = (v_hat - m_hat * m_hat).mul_((1.0 + beta1) / (2.0 * beta1))
                    noise = torch.minimum(noise.clamp_(min=0.0), v_hat)
                    new_v = (v_hat + noise * (ratio - 1.0)).mul_(bc2)
                    factor = torch.where(v32 > 0, new_v / torch.where(v32 > 0, v32, 1.0),
                                         torch.ones_like(v32))
                else:
                    new_v = v32 * _global_adam_factor(old_r, new_r, gns)
                    factor = None
                sum_old += float(v32.double().sum())
                sum_new += float(new_v.double().sum())
                vmax = state.get("max_exp_avg_sq")
                if isinstance(vmax, torch.Tensor):
                    if factor is None:
                        vmax.mul_(_global_adam_factor(old_r, new_r, gns))
                    else:
                        vmax.copy_(vmax.to(factor.dtype) * factor)
                v.copy_(new_v)
    return sum_new / sum_old if sum_old > 0 else 1.0
