"""Metrics over a whole dataset on any number of replicas.

An :class:`~adaptdl_core.torch.AdaptiveDataLoader` shards every pass: with several
replicas each one loads only its share of the samples, so a metric that replica 0
computes from its own batches describes its shard, not the dataset. And the last batch of
a pass is padded with repeats of the pass's first samples when the samples left do not
divide evenly among the replicas, so shares added up count those samples twice.

The recipe: add each replica's sums into an :class:`~adaptdl_core.torch.Accumulator`,
after :func:`drop_padding` removed the repeats, and read the totals inside
``synchronized()``, where they are summed over the replicas::

    accum = adl.Accumulator()                   # created outside the loops
    for epoch in adl.remaining_epochs_until(30):
        ...                                     # training
        for batch in valid_loader:
            x, y = adl.drop_padding(batch)      # this replica's distinct samples
            if len(y):                          # (a padded batch may hold none)
                accum["correct"] += (model(x).argmax(1) == y).sum().item()
                accum["total"] += len(y)
        with accum.synchronized():              # every replica, together
            accuracy = accum["correct"] / accum["total"]   # the whole validation set
            accum.clear()

``accum["total"]`` is then the dataset's length on any number of replicas, and the metric
is the one a single replica computes.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from adaptdl_core.torch.boundary import current_dataloader

__all__ = ["drop_padding"]


def drop_padding(batch: Any, loader: Any = None) -> Any:
    """``batch`` without its padding: the trailing samples that repeat others, dealt
    only so that every replica's last batch of a pass has the same size (see the module
    docstring). Every other batch comes back unchanged.

    Tensors and numpy arrays are cut along their first dimension; tuples, lists and dicts
    are taken as collated fields (``(x, y)``, ``{"x": ..., "y": ...}``), each cut alike.

    Arguments:
        batch: the batch just handed out by ``loader``.
        loader: the AdaptiveDataLoader that handed it out; default the one being
            iterated now.

    Raises:
        RuntimeError: outside a loop over an AdaptiveDataLoader (and no ``loader``).
        TypeError: for a padded batch holding something that cannot be cut (the message
            names its type; cut it yourself with ``loader.batch_padding``).
    """
    if loader is None:
        loader = current_dataloader()
        if loader is None:
            raise RuntimeError("drop_padding(batch) is called inside a loop over an "
                               "AdaptiveDataLoader (or pass loader=...)")
    padding = loader.batch_padding
    if padding == 0:
        return batch
    return _cut(batch, padding)


def _cut(value: Any, padding: int) -> Any:
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return value[:len(value) - padding]
    if isinstance(value, dict):
        return type(value)((k, _cut(v, padding)) for k, v in value.items())
    if isinstance(value, (tuple, list)):
        cut = [_cut(v, padding) for v in value]
        return type(value)(*cut) if hasattr(value, "_fields") else type(value)(cut)
    raise TypeError(f"drop_padding: cannot cut the {padding} padded samples from a "
                    f"{type(value).__name__}; cut them yourself: the last "
                    "loader.batch_padding samples of the batch are padding")
