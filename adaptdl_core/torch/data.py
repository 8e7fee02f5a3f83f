"""Data loading that survives checkpoint-restarts and changes of the replica count.

:class:`ElasticSampler` orders the dataset for an epoch (a deterministic shuffle) and
deals positions of that order to replicas round-robin, starting at a global position.
:class:`AdaptiveDataLoader` tracks the global position (samples consumed by all replicas)
in a checkpointed State, so a restarted job, on any number of replicas, continues the same
epoch at the same sample. Within an epoch every sample is used exactly once, except that
the last batch of a pass is padded with a few repeated samples when the remaining samples
do not divide evenly among replicas (``drop_last=True`` drops that batch instead).

Every batch boundary of every adaptive loader is also where the replicas agree on a
pending stop request (SIGINT/SIGTERM or
:func:`adaptdl_core.torch.request_checkpoint_and_exit`), checkpoint, and exit.
"""

from __future__ import annotations

import collections
import logging
import math
from typing import IO, Any, Iterator, Sized

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, Sampler

from adaptdl_core import checkpoint, collective, env
from adaptdl_core.torch import _interrupt
from adaptdl_core.torch.epoch import current_epoch

__all__ = ["ElasticSampler", "AdaptiveDataLoader", "current_dataloader"]

LOG = logging.getLogger(__name__)


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
        ValueError: for an empty or unsized dataset.
    """

    def __init__(self, dataset: Sized, shuffle: bool = True, seed: int = 0):
        if not hasattr(dataset, "__len__"):
            raise ValueError("ElasticSampler(dataset=...): the dataset must have __len__ "
                             "(map-style); iterable datasets are not supported")
        if len(dataset) == 0:
            raise ValueError("ElasticSampler(dataset=...): the dataset is empty")
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
        # padding that evens out the last batch.
        return iter(order[(base + self.rank + k * self.num_replicas) % n] for k in range(count))

    def __len__(self) -> int:
        """Number of indices this replica yields from the current position."""
        n = len(self.dataset)
        return math.ceil((n - self.index % n) / self.num_replicas)


class _LocalBatchSampler(Sampler[list[int]]):
    """Groups the elastic sampler's indices into local batches of a changeable size."""

    def __init__(self, sampler: ElasticSampler, local_bsz: int, drop_last: bool):
        self.sampler = sampler
        self.local_bsz = local_bsz
        self.drop_last = drop_last

    def __iter__(self) -> Iterator[list[int]]:
        batch: list[int] = []
        for idx in self.sampler:
            batch.append(idx)
            if len(batch) == self.local_bsz:
                yield batch
                batch = []
        if batch and not self.drop_last:
            yield batch

    def __len__(self) -> int:
        if self.drop_last:
            return len(self.sampler) // self.local_bsz
        return math.ceil(len(self.sampler) / self.local_bsz)


class _LoaderState(checkpoint.State):
    """Position of one loader: where its current loop is, and which loops it finished."""

    def __init__(self, name: str):
        super().__init__(name)
        self.current_index = 0
        # epoch -> the loop position (see _Loops) this loader last completed in it.
        self.last_position: dict[str, int] = {}
        self.local_bsz: int | None = None
        self.accum_steps = 0

    def save(self, fileobj: IO[bytes]) -> None:
        checkpoint.dump_json({"current_index": self.current_index,
                              "last_position": self.last_position,
                              "local_bsz": self.local_bsz,
                              "accum_steps": self.accum_steps}, fileobj)

    def load(self, fileobj: IO[bytes]) -> None:
        data = checkpoint.load_json(fileobj)
        self.current_index = int(data["current_index"])
        self.last_position = {str(k): int(v) for k, v in data["last_position"].items()}
        self.local_bsz = data.get("local_bsz")
        self.accum_steps = int(data.get("accum_steps", 0))


class _Loops:
    """Process-wide bookkeeping of data loader loops (reset with the State registry)."""

    def __init__(self) -> None:
        # epoch -> number of adaptive loader loops entered so far in this run. A loop's
        # position identifies it when the program replays an epoch after a restart.
        self.position: collections.Counter = collections.Counter()
        self.current: "AdaptiveDataLoader | None" = None
        self.pending_exit = None  # future of the last stop-flag allreduce


_LOOPS = _Loops()


def _reset_loops() -> None:
    global _LOOPS
    _LOOPS = _Loops()


checkpoint._RESET_HOOKS.append(_reset_loops)


def current_dataloader() -> "AdaptiveDataLoader | None":
    """The :class:`AdaptiveDataLoader` being iterated right now, or ``None``."""
    return _LOOPS.current


def _checkpoint_and_exit() -> None:
    _LOOPS.pending_exit = None
    ckpt_dir = checkpoint.save_all_states()
    LOG.info("checkpointed%s; exiting with status %d",
             f" to {ckpt_dir}" if ckpt_dir else "", _interrupt.EXIT_CODE)
    raise _interrupt.CheckpointExit(ckpt_dir)


def _batch_boundary() -> None:
    """Stop here, on every replica at once, if any replica was asked to stop.

    With several replicas the flag is all-reduced asynchronously: the reduction started
    at one boundary is read at the next, so no boundary waits on the network, and every
    replica sees the same answer at the same boundary.
    """
    loops = _LOOPS
    if not collective.is_initialized():
        if _interrupt.exit_requested():
            _checkpoint_and_exit()
        return
    if loops.pending_exit is not None and loops.pending_exit.result():
        _checkpoint_and_exit()
    loops.pending_exit = collective.allreduce_async(_interrupt.exit_requested(),
                                                    lambda a, b: a or b)


class AdaptiveDataLoader(DataLoader):
    """A :class:`torch.utils.data.DataLoader` that survives restarts and resizes.

    Use it like a DataLoader, with these differences:

    1. ``batch_size`` is the *global* batch size across all replicas; each replica loads
       ``ceil(batch_size / num_replicas)`` samples per batch.
    2. Custom ``sampler`` and ``batch_sampler`` are not supported (the loader needs its
       own to resume at any sample), nor are iterable datasets.
    3. Iterate it inside ``for epoch in remaining_epochs_until(...)``. A loop that
       finished before a restart is skipped when the epoch is replayed, and an
       interrupted loop resumes at the sample where it stopped. Only one adaptive loader
       may be iterated at a time.

    Arguments:
        dataset: a map-style dataset.
        batch_size: global batch size (int >= 1).
        shuffle: reshuffle every epoch (deterministically, the same on all replicas).
        **kwargs: other DataLoader arguments (``num_workers``, ``collate_fn``,
            ``drop_last``, ``pin_memory``, ...).

    Raises:
        ValueError: for a bad ``batch_size``, a ``sampler``/``batch_sampler``/``shuffle``
            conflict, or an iterable dataset.
    """

    def __init__(self, dataset: Any, batch_size: int = 1, shuffle: bool = False, **kwargs: Any):
        for key in ("sampler", "batch_sampler"):
            if kwargs.get(key) is not None:
                raise ValueError(
                    f"AdaptiveDataLoader does not accept {key}=...: it uses its own elastic "
                    "sampler so that it can resume at any sample on any number of replicas. "
                    "Use shuffle=True/False, or shuffle the dataset yourself.")
            kwargs.pop(key, None)
        if isinstance(dataset, IterableDataset):
            raise ValueError("AdaptiveDataLoader(dataset=...): iterable datasets are not "
                             "supported; wrap the data in a map-style Dataset with __len__")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"AdaptiveDataLoader(batch_size={batch_size!r}): the global batch "
                             "size must be an integer >= 1")
        drop_last = bool(kwargs.pop("drop_last", False))
        sampler = ElasticSampler(dataset, shuffle=shuffle)
        batch_sampler = _LocalBatchSampler(sampler, 1, drop_last)
        super().__init__(dataset, batch_sampler=batch_sampler, **kwargs)
        self._elastic_sampler = sampler
        self._local_batch_sampler = batch_sampler
        self._target_batch_size = batch_size
        existing = sum(1 for n in checkpoint._STATES if n.startswith("adaptdl-dataloader-"))
        self._state = _LoaderState(f"adaptdl-dataloader-{existing}")
        checkpoint.load_state(self._state)
        self._decide_batch_size()

    # -- batch size ------------------------------------------------------------------
    def _decide_batch_size(self) -> None:
        self._state.local_bsz = math.ceil(self._target_batch_size / env.num_replicas())
        self._state.accum_steps = 0

    @property
    def current_local_bsz(self) -> int:
        """Samples each replica loads per batch (micro-batch size)."""
        return int(self._state.local_bsz)

    @property
    def accumulation_steps(self) -> int:
        """Extra micro-batches per optimizer step (0 without gradient accumulation)."""
        return int(self._state.accum_steps)

    @property
    def current_batch_size(self) -> int:
        """Global batch of one optimizer step: local batch x (accumulation steps + 1) x
        replicas."""
        return self.current_local_bsz * (self.accumulation_steps + 1) * env.num_replicas()

    @property
    def current_index(self) -> int:
        """Global position in the current pass (samples consumed by all replicas)."""
        return self._state.current_index

    # -- iteration -------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        loops = _LOOPS
        epoch = current_epoch()
        key = str(epoch)
        position = loops.position[key]
        loops.position[key] += 1
        if loops.current is not None:
            raise RuntimeError("overlapping AdaptiveDataLoader loops: another adaptive loader "
                               "is still being iterated")
        if position <= self._state.last_position.get(key, -1):
            LOG.info("skipping loop %d of epoch %s: it finished before the restart", position, epoch)
            return
        loops.current = self
        interrupted = False
        try:
            yield from self._iterate(epoch)
        except _interrupt.CheckpointExit:
            interrupted = True
            raise
        finally:
            loops.current = None
            if not interrupted:
                self._state.current_index = 0
                # Only the current epoch's entries can matter for a replay.
                self._state.last_position = {key: position}

    def _iterate(self, epoch: int | None) -> Iterator[Any]:
        n = len(self.dataset)  # type: ignore[arg-type]
        replicas = env.num_replicas()
        self._local_batch_sampler.local_bsz = self.current_local_bsz
        self._elastic_sampler.set_epoch(epoch or 0, self._state.current_index)
        if self._state.current_index >= n:
            return
        for batch in super().__iter__():
            _batch_boundary()
            yield batch
            # The caller finished with the batch: it counts as consumed.
            self._state.current_index = min(
                self._state.current_index + replicas * self.current_local_bsz, n)
        _batch_boundary()
