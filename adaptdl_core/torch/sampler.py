"""Samplers of the adaptive data loader: the dataset's order, its local batches, and
which steps measure the gradient noise.

:class:`ElasticSampler` orders the dataset for an epoch (a deterministic shuffle) and
deals positions of that order to replicas round-robin, starting at a global position, so
that a restarted job on any number of replicas continues at the same sample.
:class:`LocalBatchSampler` groups this replica's share into local batches of a size that
may change between passes, and hands the steps the noise schedule samples out as two
micro-batches.

The noise schedules: :class:`NoiseSampling` decides which optimizer steps of a single
replica measure the gradient noise (two micro-batches instead of one), densely at first
and then sparser, spaced so that those steps cost a bounded share of the training time;
with several replicas every step has a gradient per replica, and
:func:`replicas_measure` says which steps measure them. Both are pure (no torch, no
clock): the loader feeds them step numbers and step costs.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Iterator, Sized

import numpy as np
import torch
from torch.utils.data import Sampler

from adaptdl_core import env, validation

__all__ = ["ElasticSampler", "LocalBatchSampler", "NoiseSampling", "replicas_measure",
           "noise_interval", "cost_floor", "NOISE_MAX_INTERVAL", "NOISE_COST_SHARE",
           "NOISE_QUICK_SAMPLES", "NOISE_DENSE_STEPS", "NOISE_MULTI_INTERVAL"]

# A single replica without gradient accumulation has one gradient per step, which says
# nothing about the gradient noise: sampled steps take two micro-batches (see
# AdaptiveDataLoader.autoscale_batch_size). Sampling gets sparser with the step count, to
# at most one step in this many (a sampled step costs one more forward/backward call).
NOISE_MAX_INTERVAL = 16
# ...and, after the first NOISE_QUICK_SAMPLES sampled steps (a quick first estimate), so
# that sampled steps cost at most this share of the training time. For a small model two
# half batches cost clearly more than one whole batch (fixed per-call costs dominate),
# for a large one little more; each run measures its own excess (note_step_cost).
NOISE_COST_SHARE = 0.05
NOISE_QUICK_SAMPLES = 5
# With several replicas every optimizer step has one gradient per replica, and measuring
# costs a hook, an engine callback and two squared norms of every gradient (local and
# averaged): measure every step for the first NOISE_DENSE_STEPS steps of a run (a quick
# first estimate), then one step in NOISE_MULTI_INTERVAL.
NOISE_DENSE_STEPS = 64
NOISE_MULTI_INTERVAL = 4


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
    :class:`NoiseSampling`) samples come as two
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

    def configure(self, local_bsz: int, measure_from: int | None, lo: int,
                  max_batch_size: int | None) -> None:
        """Set up the next pass: local batches of ``local_bsz``; with ``measure_from``
        (the number of the pass's first optimizer step; ``None``: no step measures the
        noise) the sampled steps come as two halves when a half is within the micro-batch
        lower bound ``lo``, else as two whole batches when twice the batch is within
        ``max_batch_size``, else not at all."""
        if local_bsz != self.local_bsz:  # (step costs are per local batch)
            self.local_bsz = local_bsz
            self.schedule.forget_costs()
        halves = local_bsz >= 2 * lo
        self.pairs = measure_from is not None and not halves \
            and 2 * local_bsz <= max_batch_size
        self.measure_from = measure_from if halves or self.pairs else None

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


def noise_interval(step: int, cost_floor: int = 2) -> int:
    """Steps from a sampled step ``step`` to the next one (single replica), at least
    ``cost_floor`` (from what sampled steps cost, see ``NOISE_COST_SHARE``)."""
    return min(NOISE_MAX_INTERVAL, max(2, step // 2, cost_floor))


def cost_floor(extra: float) -> int:
    """The sampling interval at which sampled steps whose samples take ``extra`` (0.4 =
    40%) more time than other steps' cost ``NOISE_COST_SHARE`` of the training time."""
    return max(2, math.ceil(extra / NOISE_COST_SHARE - 1e-9))


def replicas_measure(step: int) -> bool:
    """Whether the replicas measure the gradient noise in the step that ``step`` steps
    of this run preceded (the same schedule on every replica)."""
    return step < NOISE_DENSE_STEPS or step % NOISE_MULTI_INTERVAL == 0


class NoiseSampling:
    """Which steps of a single replica sample the gradient noise.

    Every other step at first, then sparser with the step count (:func:`noise_interval`),
    and, after ``NOISE_QUICK_SAMPLES`` samples, no denser than the cost floor set from the
    measured step costs (:meth:`note_step_cost`).

    Arguments:
        floor: the initial least interval between sampled steps (>= 2).
    """

    def __init__(self, floor: int = 2):
        self.next_sample = 0   # the first step that may be sampled
        self.sampled = 0       # sampled steps so far
        self.cost_floor = floor
        # Seconds per sample of plain steps (an average), and the relative excess of
        # sampled steps per sample.
        self._plain_s_per_sample: float | None = None
        self._sampled_extra: float | None = None

    def due(self, step: int) -> bool:
        """Whether optimizer step number ``step`` should be sampled."""
        return step >= self.next_sample

    def mark_sampled(self, step: int) -> None:
        """Step ``step`` is sampled: schedule the next one."""
        self.sampled += 1
        floor = self.cost_floor if self.sampled >= NOISE_QUICK_SAMPLES else 2
        self.next_sample = step + noise_interval(step, floor)

    def forget_costs(self) -> None:
        """The local batch changed: plain step costs measured so far no longer apply."""
        self._plain_s_per_sample = None

    def note_step_cost(self, seconds: float, samples: int, sampled: bool) -> None:
        """Account one optimizer step (``seconds`` from its start to the next step's, for
        ``samples`` local samples; ``sampled``: it measured the noise) and set the cost
        floor from what sampled steps cost beyond plain ones."""
        per_sample = seconds / max(samples, 1)
        if not sampled:
            last = self._plain_s_per_sample
            self._plain_s_per_sample = per_sample if last is None \
                else 0.8 * last + 0.2 * per_sample
        elif self._plain_s_per_sample:
            extra = max(0.0, per_sample / self._plain_s_per_sample - 1.0)
            last = self._sampled_extra
            self._sampled_extra = extra if last is None else 0.5 * (last + extra)
            self.cost_floor = cost_floor(self._sampled_extra)
