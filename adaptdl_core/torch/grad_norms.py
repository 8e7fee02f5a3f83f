"""Small tensor helpers of the gradient probe: squared norms, accumulated on the device
and read once per step (on a GPU every read is a synchronisation)."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["grad_tensors", "blocked_sqr_norm", "sum_parts", "read_floats"]


def grad_tensors(output: Any) -> list[torch.Tensor]:
    """The tensors in a forward pass's output (nested lists, tuples, dicts) that the
    backward pass will reach."""
    if isinstance(output, torch.Tensor):
        return [output] if output.requires_grad else []
    if isinstance(output, (list, tuple)):
        items = output
    elif isinstance(output, dict):
        items = output.values()
    else:
        return []
    return [t for item in items for t in grad_tensors(item)]


def blocked_sqr_norm(flat: torch.Tensor, block: int = 1 << 16) -> torch.Tensor:
    """|x|^2 with float32 products and float64 accumulation across blocks: as accurate
    as a float64 norm for our purposes (relative error ~1e-7 within a block, the sum of
    blocks exact to ~1e-16) and many times faster. A float64 scalar tensor on ``flat``'s
    device: read the step's sum once (on a GPU, reading it is a synchronisation)."""
    flat = flat.reshape(-1)
    if flat.dtype == torch.float64:
        return torch.dot(flat, flat)
    flat = flat.float()
    if flat.numel() <= block:  # (most parameters: one product, no split)
        return torch.dot(flat, flat).double()
    return torch.stack([torch.dot(c, c) for c in flat.split(block)]).double().sum()


def sum_parts(parts: list[Any]) -> "float | torch.Tensor":
    """The sum of squared norms (float64 tensors on one device, or floats when
    preconditioned), not read from the device yet."""
    if not parts:
        return 0.0
    if isinstance(parts[0], torch.Tensor):
        return parts[0] if len(parts) == 1 else torch.stack(parts).sum()
    return float(sum(parts))


def read_floats(*values: "float | torch.Tensor") -> list[float]:
    """``values`` as floats, the tensors among them read from their device at once (on a
    GPU every read is a synchronisation)."""
    tensors = [v for v in values if isinstance(v, torch.Tensor)]
    read = iter(torch.stack(tensors).tolist() if tensors else ())
    return [next(read) if isinstance(v, torch.Tensor) else float(v) for v in values]
