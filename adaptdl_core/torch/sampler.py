"""Samplers of the adaptive data loader: the dataset's order, and its local batches.

:class:`ElasticSampler` orders the dataset for an epoch (a deterministic shuffle) and
deals positions of that order to replicas round-robin, starting at a global position, so
that a restarted job on any number of replicas continues at the same sample.
:class:`LocalBatchSampler` groups this replica's share into local batches of a size that
may change between passes, and hands the steps the noise schedule samples out as two
micro-batches.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Iterator, Sized

import numpy as np
import torch
from torch.utils.data import Sampler

from adaptdl_core import env, validation
from adaptdl_core.torch.batch_control import NoiseSampling

__all__ = ["ElasticSampler", "LocalBatchSampler"]


class ElasticSampler(Sampler[int]):
    """Yields this replica's share of the dataset for one epoch, from a global position.

    The epoch's order is a permutation seeded by ``(seed, epoch, pass)`` when shuffling
    (the same on every replica and after restarts), else the identity. Position ``p`` of
    that order goes to replica ``p % num_replicas`` (counting from the start index), so a
    global batch of ``num_replicas * local_bsz`` consecutive positions is shared evenly.

    Arguments:
        dataset: a map-style dataset (anything with ``__len__``).
        shuffle: shuffle the order every epoch.
        seed: base seed of the shuffle.

    Raises:
        ValueError: for an empty or unsized dataset, or a ``shuffle`` that is not a bool.
    """

    def __init__(self, dataset: Sized, shuffle: bool = True, seed: int = 0):
        if not hasattr(dataset, "__len__"):
            raise ValueError("ElasticSampler(dataset=...): the dataset must have __len__ "
                             "(map-style); iterable datasets are not supported")
        if len(dataset) == 0:
            raise ValueError("ElasticSampler(dataset=...): the dataset is empty")
        if not isinstance(shuffle, bool):
            raise ValueError(f"ElasticSampler(shuffle={shuffle!r}): pass True or False")
        self.dataset = dataset
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.num_replicas = env.num_replicas()
        self.rank = env.replica_rank()
        self.epoch = 0
        self.index = 0

    def set_epoch(self, epoch: int, index: int = 0) -> None:
        """Choose the epoch's order and the global position to start from.

        Arguments:
            epoch: epoch number (selects the shuffle).
            index: global position (samples already consumed by all replicas in this
                epoch); positions past the dataset length start further passes, each
                with its own order.

        Raises:
            ValueError: for a negative epoch or index.
        """
        if epoch < 0 or index < 0:
            raise ValueError(f"set_epoch(epoch={epoch}, index={index}): both must be >= 0")
        self.epoch = int(epoch)
        self.index = int(index)

    def _order(self) -> list[int]:
        n = len(self.dataset)
        if not self.shuffle:
            return list(range(n))
        generator = torch.Generator()
        pass_number = self.index // n
        seed = np.random.SeedSequence([self.seed, self.epoch, pass_number]).generate_state(1)[0]
        generator.manual_seed(int(seed))
        return torch.randperm(n, generator=generator).tolist()

    def __iter__(self) -> Iterator[int]:
        order = self._order()
        n = len(order)
        base = self.index % n
        count = len(self)
        # Position base + rank + k * replicas, wrapping to the start of the order for the
        # padding that evens out the last batch (by a slice: this runs for every sample).
        start, step = base + self.rank, self.num_replicas
        if start + (count - 1) * step >= 2 * n:  # (more replicas than samples left)
            return iter([order[(start + k * step) % n] for k in range(count)])
        return iter((order + order[:step])[start:start + count * step:step])

    def distinct_count(self, index: int, size: int) -> int:
        """How many leading samples of this replica's local batch of ``size`` samples
        from global position ``index`` are distinct samples of the pass; the rest (at
        the end of the batch) repeat samples from the pass's start, dealt only so that
        every replica's last batch has the same size.

        Raises:
            ValueError: for a negative ``index`` or ``size``.
        """
        validation.integer("index", index, low=0)
        validation.integer("size", size, low=0)
        n = len(self.dataset)
        pass_end = (index // n + 1) * n
        # Position index + rank + k * replicas is this replica's k-th sample.
        left = pass_end - index - self.rank
        return max(0, min(size, -(-left // self.num_replicas)))

    def __len__(self) -> int:
        """Number of indices this replica yields from the current position."""
        n = len(self.dataset)
        return math.ceil((n - self.index % n) / self.num_replicas)

class LocalBatchSampler(Sampler[list[int]]):
    """Groups the elastic sampler's indices into local batches of a changeable size.

    With ``measure_from`` set (a step number), the steps that :attr:`schedule` (a
    :class:`~adaptdl_core.torch.batch_control.NoiseSampling`) samples come as two
    micro-batches: a full batch split in two halves, or with ``pairs`` two
    full batches (when a whole second batch is left in the pass). Every yielded batch
    also appends ``(opens_measured_step, size)`` to :attr:`kinds`, which the loader pops
    in the same order
    (the DataLoader keeps the order, also with worker processes prefetching ahead).
    """

    def __init__(self, sampler: ElasticSampler, local_bsz: int, drop_last: bool):
        self.sampler = sampler
        self.local_bsz = local_bsz
        self.drop_last = drop_last
        self.measure_from: int | None = None
        self.pairs = False
        self.schedule = NoiseSampling()
        self.kinds: deque = deque()

    def __iter__(self) -> Iterator[list[int]]:
        kinds = self.kinds
        kinds.clear()
        step = self.measure_from
        pairs = self.pairs
        schedule = self.schedule
        bsz = self.local_bsz
        indices = list(self.sampler)  # (sliced into batches, not appended one by one)
        end = len(indices) - bsz
        pos = 0
        while pos <= end:
            batch = indices[pos:pos + bsz]
            pos += bsz
            if step is not None:
                if schedule.due(step) and (not pairs or pos <= end):
                    schedule.mark_sampled(step)
                    if pairs:
                        kinds.append((True, bsz))
                        yield batch
                        batch = indices[pos:pos + bsz]
                        pos += bsz
                        kinds.append((False, bsz))
                        yield batch
                    else:
                        half = bsz // 2
                        kinds.append((True, half))
                        yield batch[:half]
                        kinds.append((False, bsz - half))
                        yield batch[half:]
                    step += 1
                    continue
                step += 1
            kinds.append((False, bsz))
            yield batch
        if pos < len(indices) and not self.drop_last:
            kinds.append((False, len(indices) - pos))
            yield indices[pos:]

    def __len__(self) -> int:
        return self.count(self.local_bsz)

    def count(self, local_bsz: int) -> int:
        """Batches of ``local_bsz`` in the sampler's pass from its position (a sampled
        step's two micro-batches counted as one batch)."""
        if self.drop_last:
            return len(self.sampler) // local_bsz
        return math.ceil(len(self.sampler) / local_bsz)
