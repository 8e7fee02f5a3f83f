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
:func:`adaptdl_core.torch.request_checkpoint_and_exit`), checkpoint, and exit, or on a
pending in-place checkpoint request (:func:`adaptdl_core.torch.request_checkpoint`),
checkpoint, and go on. While AdaptiveDataParallel steps on the loader's batches the
agreement rides on the small all-reduce it does every few optimizer steps anyway;
otherwise (a validation loop, plain DDP) it goes through the job's store every few
batches.
"""

from __future__ import annotations

import bisect
import collections
import concurrent.futures
import logging
from collections import deque
import math
import time
from typing import IO, Any, Iterator, Sized

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, Sampler

from adaptdl_core import checkpoint, collective, context, env
from adaptdl_core.torch import _interrupt, _metrics
from adaptdl_core.torch.epoch import current_epoch

__all__ = ["ElasticSampler", "AdaptiveDataLoader", "current_dataloader",
           "preferred_local_sizes"]

LOG = logging.getLogger(__name__)

# Switch batch size only when the predicted goodput improves by more than this factor.
SWITCH_THRESHOLD = 1.05
# Re-decide the batch size every this many optimizer steps (same count on all replicas),
# when the noise estimate or the throughput model moved since the last decision.
DECIDE_EVERY_STEPS = 5
# ...and at least this often, whatever moved.
DECIDE_AT_LEAST_EVERY_STEPS = 50
# Relative change of the noise scale that counts as "moved".
DECIDE_NOISE_CHANGE = 0.1
# Without AdaptiveDataParallel's per-step all-reduce, agree on a stop request through the
# store every this many batch boundaries (a store round trip costs ~1 ms of Python).
STORE_STOP_CHECK_EVERY = 4
# A single replica without gradient accumulation has one gradient per step, which says
# nothing about the gradient noise. On sampled steps an autoscaled loader hands the batch
# out as two halves (two micro-batches of one optimizer step): the two half-batch
# gradients give an unbiased two-batch estimate. When a half would fall below the
# micro-batch lower bound, a sampled step takes two full batches instead (a step at twice
# the batch, if max_batch_size allows; AdaScale scales its lr). Sampling gets sparser with
# the step count, to at most one step in this many (a sampled step costs one more
# forward/backward call).
NOISE_MAX_INTERVAL = 16
# ...and, after the first NOISE_QUICK_SAMPLES sampled steps (a quick first estimate), so
# that sampled steps cost at most this share of the training time: a small model's step
# is mostly fixed per-call costs, so two half batches can cost 1.4x one whole batch (the
# digits CNN at 64) and call for sampling one step in 9; a large one's halves cost
# little more than the whole.
NOISE_COST_SHARE = 0.05
NOISE_QUICK_SAMPLES = 5
# With several replicas every optimizer step has one gradient per replica, and measuring
# costs a hook, an engine callback and two squared norms of every gradient (local and
# averaged):
# measure every step for the first NOISE_DENSE_STEPS steps of a run (a quick first
# estimate), then one step in NOISE_MULTI_INTERVAL.
NOISE_DENSE_STEPS = 64
NOISE_MULTI_INTERVAL = 4


def _noise_interval(step: int, cost_floor: int = 2) -> int:
    """Steps from a sampled step ``step`` to the next one (single replica), at least
    ``cost_floor`` (from what sampled steps cost, see ``NOISE_COST_SHARE``)."""
    return min(NOISE_MAX_INTERVAL, max(2, step // 2, cost_floor))


def preferred_local_sizes(lo: int, hi: int, keep: tuple[int, ...] = ()) -> list[int]:
    """The local batch sizes an autoscaled loader chooses among, ascending: powers of two
    and 1.5 x powers of two (1, 2, 3, 4, 6, 8, 12, 16, 24, ...) within ``[lo, hi]``, plus
    ``lo``, ``hi`` and the sizes in ``keep`` that lie within (the initial batch).

    Why a grid: every new input shape costs a one-off set-up -- oneDNN primitives on CPU
    (the digits CNN's first step at a new batch size takes 1.3-2.6 ms more than the next
    ones, about one step: ``benchmarks/new_shape_cost.py``), cuDNN autotuning under
    ``cudnn.benchmark``, a recompile under ``torch.compile`` -- while goodput is flat near
    its optimum, so two sizes per octave lose little (``tests/core/test_batch_size_grid.py``
    checks at least 98% of the predicted optimum over random one-replica models). Halving
    a grid size gives a grid size again, so the halves of sampled steps add few shapes.

    Raises:
        ValueError: if ``lo < 1`` or ``hi < lo``.
    """
    if lo < 1 or hi < lo:
        raise ValueError(f"preferred_local_sizes(lo={lo}, hi={hi}): need 1 <= lo <= hi")
    sizes = {lo, hi}
    sizes.update(v for v in keep if lo <= v <= hi)
    for k in range(hi.bit_length()):
        sizes.update(v for v in (1 << k, (3 << k) >> 1) if lo <= v <= hi)
    return sorted(sizes)


def _cost_floor(extra: float) -> int:
    """The sampling interval at which sampled steps whose samples take ``extra`` (0.4 =
    40%) more time than other steps' cost ``NOISE_COST_SHARE`` of the training time."""
    return max(2, math.ceil(extra / NOISE_COST_SHARE - 1e-9))


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
        # padding that evens out the last batch (by a slice: this runs for every sample).
        start, step = base + self.rank, self.num_replicas
        if start + (count - 1) * step >= 2 * n:  # (more replicas than samples left)
            return iter([order[(start + k * step) % n] for k in range(count)])
        return iter((order + order[:step])[start:start + count * step:step])

    def __len__(self) -> int:
        """Number of indices this replica yields from the current position."""
        n = len(self.dataset)
        return math.ceil((n - self.index % n) / self.num_replicas)


class _LocalBatchSampler(Sampler[list[int]]):
    """Groups the elastic sampler's indices into local batches of a changeable size.

    With ``measure_from`` set (a step number), sampled steps (see :func:`_noise_interval`)
    come as two micro-batches: a full batch split in two halves, or with ``pairs`` two
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
        self.next_split = 0
        self.sampled = 0      # sampled steps handed out so far
        self.cost_floor = 2   # least interval between them, set by the loader
        self.kinds: deque = deque()

    def __iter__(self) -> Iterator[list[int]]:
        kinds = self.kinds
        kinds.clear()
        step = self.measure_from
        pairs = self.pairs
        bsz = self.local_bsz
        indices = list(self.sampler)  # (sliced into batches, not appended one by one)
        end = len(indices) - bsz
        pos = 0
        while pos <= end:
            batch = indices[pos:pos + bsz]
            pos += bsz
            if step is not None:
                if step >= self.next_split and (not pairs or pos <= end):
                    self.sampled += 1
                    self.next_split = step + _noise_interval(
                        step, self.cost_floor if self.sampled >= NOISE_QUICK_SAMPLES else 2)
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


class _LoaderState(checkpoint.State):
    """Position of one loader: where its current loop is, and which loops it finished."""

    def __init__(self, name: str):
        super().__init__(name)
        self.current_index = 0
        # epoch -> the loop position (see _Loops) this loader last completed in it.
        self.last_position: dict[str, int] = {}
        self.local_bsz: int | None = None
        self.accum_steps = 0
        # Outside remaining_epochs_until: the statistical progress when the current loop
        # began (an autoscaled loop then lasts one epoch's progress from there).
        self.loop_start_progress: float | None = None

    def save(self, fileobj: IO[bytes]) -> None:
        checkpoint.dump_json({"current_index": self.current_index,
                              "last_position": self.last_position,
                              "local_bsz": self.local_bsz,
                              "accum_steps": self.accum_steps,
                              "loop_start_progress": self.loop_start_progress}, fileobj)

    def load(self, fileobj: IO[bytes]) -> None:
        data = checkpoint.load_json(fileobj)
        self.current_index = int(data["current_index"])
        self.last_position = {str(k): int(v) for k, v in data["last_position"].items()}
        self.local_bsz = data.get("local_bsz")
        self.accum_steps = int(data.get("accum_steps", 0))
        self.loop_start_progress = data.get("loop_start_progress")


class Loops:
    """The job's bookkeeping of data loader loops (held by the job context, see
    :func:`loops`): runtime-internal, shared by the loader and the model wrapper."""

    def __init__(self) -> None:
        # epoch -> number of adaptive loader loops entered so far in this run. A loop's
        # position identifies it when the program replays an epoch after a restart.
        self.position: collections.Counter = collections.Counter()
        self.current: "AdaptiveDataLoader | None" = None
        # Future of the last all-reduce of the replicas' requests through the store.
        self.pending_requests: "concurrent.futures.Future | None" = None
        self.store_boundaries = 0  # boundaries that used the store path (its schedule)
        self.training: "AdaptiveDataLoader | None" = None  # the loader optimizer steps follow
        # Set by AdaptiveDataParallel after every optimizer step with several replicas
        # (from its side values, summed every few steps; see _gradient_probe): (the
        # requests of any replica, replica 0's batch size choice or None).
        self.side_channel: tuple[_interrupt.Requests, tuple[int, int] | None] | None = None


def loops() -> Loops:
    """The job's :class:`Loops` (created in the job context on first use)."""
    ctx = context.current()
    if ctx.loops is None:
        ctx.loops = Loops()
    return ctx.loops


def current_dataloader() -> "AdaptiveDataLoader | None":
    """The :class:`AdaptiveDataLoader` being iterated right now, or ``None``."""
    return loops().current


def training_loader() -> "AdaptiveDataLoader | None":
    """The loader whose batches the optimizer steps on (the one that called
    :meth:`AdaptiveDataLoader.autoscale_batch_size`, or that AdaptiveDataParallel first
    stepped on), or ``None``."""
    return loops().training


def _save_for(requests: list[_interrupt.PendingCheckpoint]) -> str | None:
    """Checkpoint every State (all replicas together) and resolve ``requests`` with it;
    returns the checkpoint directory (replica 0) or None."""
    try:
        ckpt_dir = checkpoint.save_all_states()
    except BaseException:
        # (No checkpoint: whoever waits on a request learns it was not taken.)
        _interrupt.resolve_checkpoint_requests(requests, False)
        raise
    _interrupt.resolve_checkpoint_requests(requests, True, ckpt_dir)
    return ckpt_dir


def _checkpoint_and_exit() -> None:
    loops().pending_requests = None
    # In-place requests of this replica are settled by the same checkpoint: no boundary
    # follows where they could be.
    ckpt_dir = _save_for(_interrupt.take_checkpoint_requests())
    LOG.info("checkpointed%s; exiting with status %d",
             f" to {ckpt_dir}" if ckpt_dir else "", _interrupt.EXIT_CODE)
    raise _interrupt.CheckpointExit(ckpt_dir)


def _checkpoint_in_place(replicas: int) -> None:
    requests = _interrupt.take_checkpoint_requests()
    start = time.perf_counter()
    ckpt_dir = _save_for(requests)
    if replicas > 1:
        # Replica 0 writes while the others would run ahead into the next step and wait
        # there for it, which would inflate that step's measured time: resume together.
        collective.broadcast(None)
    loader = loops().current
    LOG.info("in-place checkpoint%s at epoch %s, position %s, in %.3f s (%d request(s) on "
             "this replica); training goes on", f" to {ckpt_dir}" if ckpt_dir else "",
             current_epoch(), loader.current_index if loader is not None else None,
             time.perf_counter() - start, len(requests))


def _honour(agreed: _interrupt.Requests, replicas: int) -> None:
    """Act on the requests the replicas agreed on at this boundary (the same on all)."""
    if agreed.exit:
        _checkpoint_and_exit()
    elif agreed.save:
        _checkpoint_in_place(replicas)


def _batch_boundary(replicas: int) -> tuple[int, int] | None:
    """Checkpoint here, on every replica at once, if any replica asked for a checkpoint,
    and stop if any replica asked to stop.

    With several replicas the requests must be agreed on: the exit and the in-place
    checkpoint flags travel separately, so that a replica that has not been asked
    itself learns which one the others agreed on. After an optimizer step of
    AdaptiveDataParallel they came with that model's side values (summed over the
    replicas every few steps, overlapped with the steps), and the choice of batch size
    that replica 0 put there is returned. Otherwise the flags are
    all-reduced through the store asynchronously, every ``STORE_STOP_CHECK_EVERY``
    boundaries: the reduction started at one such boundary is read at the next, so no
    boundary waits on the network. All replicas run the same sequence of boundaries and
    steps, so every replica sees the same answer at the same boundary.
    """
    book = loops()
    if replicas == 1 or not collective.is_initialized():
        book.side_channel = None
        # (Two flag reads, no allocation: this runs at every boundary of one replica.)
        if _interrupt.exit_requested() or _interrupt.checkpoint_requested():
            _honour(_interrupt.local_requests(), 1)
        return None
    side, book.side_channel = book.side_channel, None
    if side is not None:
        agreed, choice = side
        if book.pending_requests is not None:  # started at an earlier store-path boundary
            agreed = agreed | book.pending_requests.result()
            book.pending_requests = None
        _honour(agreed, replicas)
        return choice
    book.store_boundaries += 1
    if book.store_boundaries % STORE_STOP_CHECK_EVERY == 1:
        if book.pending_requests is not None:
            agreed, book.pending_requests = book.pending_requests.result(), None
            _honour(agreed, replicas)
        book.pending_requests = collective.allreduce_async(_interrupt.local_requests(),
                                                            _interrupt.Requests.__or__)
    return None


class AdaptiveDataLoader(DataLoader):
    """A :class:`torch.utils.data.DataLoader` that survives restarts and resizes.

    Use it like a DataLoader, with these differences:

    1. ``batch_size`` is the *global* batch size across all replicas; each replica loads
       ``ceil(batch_size / num_replicas)`` samples per batch. ``loader.batch_size`` reads
       it back (the target; :attr:`current_batch_size` is the batch in use), and
       ``loader.sampler`` is the :class:`ElasticSampler`.
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
        # (nodes, replicas, rank): fixed for the life of the process (a resize restarts
        # it), read once rather than from the environment at every batch.
        self._world = (env.num_nodes(), sampler.num_replicas, sampler.rank)
        self._target_batch_size = batch_size
        self._max_batch_size: int | None = None
        self._local_bsz_bounds: tuple[int | None, int | None] | None = None
        self._gradient_accumulation = False
        self._micro_in_step = 0  # micro-batches of the current optimizer step handed out
        self._stepped = False    # set by AdaptiveDataParallel when the optimizer stepped
        self._steps = 0          # optimizer steps taken in this run (decision schedule)
        self._sync_steps = 0     # optimizer steps started in this run (any mode)
        # Several replicas: AdaptiveDataParallel measures the gradient norms in this step
        # (the same schedule on every replica).
        self._measure_norms = True
        # The batch handed out is the first of a single-replica step's two measured
        # micro-batches (halves of its batch, or two whole batches).
        self._pair_first = False
        # Micro-batches in the current optimizer step, and the first one's gradient is
        # complete: AdaptiveDataParallel measures its norm at the next forward.
        self._step_micros = 1
        self._measure_first = False
        self._step_samples = 0   # local samples of the current optimizer step so far
        self._last_micro = 0     # local samples of the micro-batch handed out last
        self._last_step_samples = 0
        # What a single replica's sampled steps cost (seconds per sample of other steps
        # at the batch sampler's local batch, and the relative excess of sampled steps):
        # sets the sampling interval (see NOISE_COST_SHARE).
        self._plain_s_per_sample: float | None = None
        self._sampled_extra: float | None = None
        # Goodput decisions: what they were based on, so that they are re-made only when
        # something moved, and replica 0's choice waiting for the next step's all-reduce.
        self._decided_on: tuple[float, int] | None = None
        self._steps_since_decision = 0
        self._proposal: tuple[int, int] | None = None
        existing = context.current().states.count_prefix("adaptdl-dataloader-")
        self._state = _LoaderState(f"adaptdl-dataloader-{existing}")
        checkpoint.load_state(self._state)
        self._decide_batch_size(initial=True)

    # -- DataLoader attributes ---------------------------------------------------------
    # DataLoader.__init__ assigns batch_size (None, as a batch_sampler is given) and
    # sampler (a SequentialSampler it makes); after __init__ its __setattr__ refuses both.
    # With a batch_sampler, torch 2.13 reads neither for a map-style dataset (iteration,
    # len() and the worker processes go through batch_sampler), so they can be
    # properties that report the adaptive values, one source of truth with nothing
    # stored: the setters only absorb DataLoader.__init__'s assignments.

    @property
    def batch_size(self) -> int:  # type: ignore[override]
        """The global target batch size: the ``batch_size`` given to the constructor, over
        all replicas (as in AdaptDL). The batch of an optimizer step actually in use is
        :attr:`current_batch_size` (rounded up to a multiple of the replicas, or chosen by
        :meth:`autoscale_batch_size`). Read-only, as on a DataLoader."""
        return self._target_batch_size

    @batch_size.setter
    def batch_size(self, value: Any) -> None:
        pass  # (DataLoader.__init__'s None; see above)

    @property
    def sampler(self) -> ElasticSampler:  # type: ignore[override]
        """The :class:`ElasticSampler` that orders the dataset and deals this replica its
        share. Read-only, as on a DataLoader."""
        return self._elastic_sampler

    @sampler.setter
    def sampler(self, value: Any) -> None:
        pass  # (DataLoader.__init__'s default sampler; see above)

    def __len__(self) -> int:
        """Batches this replica loads in the current pass from the sampler's position (the
        start of the pass that is being or was last iterated, else of the dataset), at
        the current local batch size. A sampled single-replica step's two half batches
        count as one batch; an autoscaled loop may take more than one pass."""
        return self._local_batch_sampler.count(self.current_local_bsz)

    # -- batch size ------------------------------------------------------------------
    def autoscale_batch_size(self, max_batch_size: int,
                             local_bsz_bounds: tuple[int | None, int | None] | None = None,
                             gradient_accumulation: bool = False) -> None:
        """Let the loader choose the batch size that maximises goodput (call once, right
        after creating the loader; this also marks it as the training loader).

        The batch size starts at ``batch_size`` and is re-decided at optimizer-step
        boundaries from the measured throughput model and gradient noise, switching only
        when the predicted goodput improves by more than 5%. The choice is checkpointed.
        Epochs then end by statistical progress: an epoch lasts until the training has
        made as much progress as one pass at the initial batch size would.

        A single replica without gradient accumulation has one gradient per step, which
        says nothing about the gradient noise: on sampled steps (every 2nd step at first,
        at most every 16th later, and sparse enough that their extra time stays within
        5% of the training time) it hands the step's batch out as two halves, two
        micro-batches that AdaptiveDataParallel accumulates into one optimizer step (as
        with gradient accumulation), when a half is within ``local_bsz_bounds``; else
        (a batch below twice the lower bound) such a step takes two whole batches, if
        twice the batch is within ``max_batch_size``, and its lr is scaled by AdaScale
        for the larger batch. (With neither, the noise is not measured on one replica
        and the batch size stays where it is.)

        The local batch sizes chosen are powers of two and 1.5x powers of two within the
        bounds, plus the bounds and the initial size (see :func:`preferred_local_sizes`):
        each new input shape costs a one-off set-up (cuDNN autotuning, a
        ``torch.compile`` recompile, oneDNN primitives).

        Arguments:
            max_batch_size: largest global batch size allowed (>= ``batch_size``).
            local_bsz_bounds: ``(min, max)`` per-replica micro-batch size, either may be
                None (no bound); for example what fits in device memory.
            gradient_accumulation: allow several micro-batches per optimizer step.

        Raises:
            ValueError: for a max_batch_size below batch_size or not an int, or bounds
                that are not a pair of positive ints with min <= max <= max_batch_size.
        """
        if isinstance(max_batch_size, bool) or not isinstance(max_batch_size, int) \
                or max_batch_size < self._target_batch_size:
            raise ValueError(f"autoscale_batch_size(max_batch_size={max_batch_size!r}): must "
                             f"be an int >= the loader's batch_size ({self._target_batch_size})")
        if local_bsz_bounds is not None:
            ok = isinstance(local_bsz_bounds, (tuple, list)) and len(local_bsz_bounds) == 2 \
                and all(b is None or (isinstance(b, int) and not isinstance(b, bool) and b >= 1)
                        for b in local_bsz_bounds)
            lo, hi = local_bsz_bounds if ok else (None, None)
            if not ok or (lo is not None and hi is not None and lo > hi) \
                    or (lo is not None and lo > max_batch_size):
                raise ValueError(f"autoscale_batch_size(local_bsz_bounds={local_bsz_bounds!r}): "
                                 "use (min, max) with positive ints or None, min <= max, "
                                 "and min <= max_batch_size")
            local_bsz_bounds = (lo, hi)
        self._max_batch_size = max_batch_size
        self._local_bsz_bounds = local_bsz_bounds
        self._gradient_accumulation = bool(gradient_accumulation)
        loops().training = self
        _metrics.set_batch_size_limits(self._target_batch_size, max_batch_size,
                                       local_bsz_bounds, gradient_accumulation)
        self._decide_batch_size(initial=True)

    def _initial_local_bsz(self, micros: int = 1) -> int:
        """The local batch that makes the initial batch size with ``micros`` micro-batches
        per step on this job's replicas (rounded up; before the bounds)."""
        return math.ceil(self._target_batch_size / (self._world[1] * micros))

    def _bounded_local_bsz(self, local_bsz: int) -> int:
        lo, hi = self._local_bsz_bounds or (None, None)
        return max(local_bsz if hi is None else min(local_bsz, hi), lo or 1)

    def _note_step_cost(self, seconds: float, samples: int, sampled: bool) -> None:
        """Account one optimizer step of a single replica (from its start to the next
        step's) and set the least interval between sampled steps from their cost."""
        per_sample = seconds / max(samples, 1)
        if not sampled:
            last = self._plain_s_per_sample
            self._plain_s_per_sample = per_sample if last is None \
                else 0.8 * last + 0.2 * per_sample
        elif self._plain_s_per_sample:
            extra = max(0.0, per_sample / self._plain_s_per_sample - 1.0)
            last = self._sampled_extra
            self._sampled_extra = extra if last is None else 0.5 * (last + extra)
            self._local_batch_sampler.cost_floor = _cost_floor(self._sampled_extra)

    def _decision_due(self) -> bool:
        """Whether a goodput decision could change anything: the noise scale moved by
        more than ``DECIDE_NOISE_CHANGE`` or the throughput model was refitted since the
        last one (or ``DECIDE_AT_LEAST_EVERY_STEPS`` passed). Local to this replica."""
        self._steps_since_decision += DECIDE_EVERY_STEPS
        m = _metrics.metrics()
        grad = m.grad_params
        phi = grad.var / grad.sqr if grad is not None and grad.sqr > 0 else 0.0
        basis = (phi, m.fits)
        last = self._decided_on
        if last is not None and self._steps_since_decision < DECIDE_AT_LEAST_EVERY_STEPS \
                and basis[1] == last[1] \
                and abs(phi - last[0]) <= DECIDE_NOISE_CHANGE * max(abs(last[0]), 1e-300):
            return False
        self._decided_on = basis
        self._steps_since_decision = 0
        return True

    def _decide_batch_size(self, initial: bool = False) -> bool:
        """Choose (local batch, accumulation steps); returns True if they changed.

        Replica 0 decides from its goodput model and broadcasts, so that all replicas
        always agree.
        """
        _, replicas, rank = self._world
        current = (self._state.local_bsz, self._state.accum_steps)
        if self._max_batch_size is None:
            choice = (self._bounded_local_bsz(self._initial_local_bsz()), 0)
        else:
            choice = current if current[0] is not None else \
                (self._bounded_local_bsz(self._initial_local_bsz()), 0)
            if rank == 0:
                choice = self._goodput_choice(choice, initial)
            choice = collective.broadcast(choice)
        self._state.local_bsz, self._state.accum_steps = int(choice[0]), int(choice[1])
        changed = current != (self._state.local_bsz, self._state.accum_steps)
        if changed and not initial:
            LOG.info("batch size now %d (local %d x %d micro-batches x %d replicas)",
                     self.current_batch_size, self.current_local_bsz,
                     self.accumulation_steps + 1, replicas)
        return changed

    def _goodput_choice(self, current: tuple[int, int], initial: bool) -> tuple[int, int]:
        _metrics.maybe_refit()
        goodput_fn = _metrics.goodput_fn()
        if goodput_fn is None:
            return current
        nodes, replicas, _ = self._world
        best, bsz, accum = goodput_fn.optimize(nodes, replicas, self._max_batch_size,
                                               self._local_bsz_bounds or (None, None),
                                               self._gradient_accumulation)
        best, bsz = self._on_grid(goodput_fn, float(best), int(bsz), int(accum))
        now = float(goodput_fn(nodes, replicas, current[0], current[1]))
        # A new shape (restart on another replica count) takes the best choice outright;
        # otherwise switch only for a clear gain, so the batch size does not oscillate.
        if float(best) > SWITCH_THRESHOLD * now or (initial and now <= 0):
            return int(bsz), int(accum)
        return current

    def _on_grid(self, goodput_fn: Any, best: float, bsz: int, accum: int) -> tuple[float, int]:
        """The better of the two :func:`preferred_local_sizes` around the optimal local
        batch ``bsz`` (same accumulation steps), and its goodput. A ``bsz`` outside the
        bounds (forced: the initial batch over more replicas than the bounds allow) stays."""
        nodes, replicas, _ = self._world
        lo, hi = self._local_bsz_bounds or (None, None)
        lo = lo or 1
        # (the total batch K * b * (s + 1) stays within max_batch_size)
        hi = min(hi or self._max_batch_size, self._max_batch_size // (replicas * (accum + 1)))
        if not lo <= bsz <= hi:
            return best, bsz
        sizes = preferred_local_sizes(lo, hi, (self._initial_local_bsz(accum + 1),))
        i = bisect.bisect_left(sizes, bsz)
        near = [bsz] if sizes[i] == bsz else sizes[i - 1:i + 1]
        values = goodput_fn(nodes, replicas, np.array(near), accum)
        j = int(np.argmax(values))
        return float(values[j]), int(near[j])

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
        return int(self._state.local_bsz) * (int(self._state.accum_steps) + 1) * self._world[1]

    @property
    def is_accumulation_step(self) -> bool:
        """True while the batch just handed out is not the last micro-batch of an optimizer
        step (AdaptiveDataParallel then skips gradient sync and the optimizer step)."""
        return self._pair_first or self._micro_in_step < self._state.accum_steps

    @property
    def _step_batch_size(self) -> int:
        """Samples of the current optimizer step over all replicas, as loaded (smaller than
        :attr:`current_batch_size` for the partial last batch of a pass)."""
        return self._step_samples * self._world[1]

    @property
    def max_batch_size(self) -> int | None:
        """Largest global batch allowed by :meth:`autoscale_batch_size` (None: fixed)."""
        return self._max_batch_size

    @property
    def local_bsz_bounds(self) -> tuple[int | None, int | None] | None:
        """Per-replica micro-batch bounds given to :meth:`autoscale_batch_size`."""
        return self._local_bsz_bounds

    @property
    def training(self) -> bool:
        """True for the loader whose batches the optimizer steps on."""
        return loops().training is self

    def to_tensorboard(self, writer: Any, global_step: int, tag_prefix: str = "") -> None:
        """Write the batch size, local batch size and accumulation steps to a TensorBoard
        ``SummaryWriter`` at ``global_step``."""
        if tag_prefix and not tag_prefix.endswith("/"):
            tag_prefix += "/"
        writer.add_scalar(tag_prefix + "Total_Batch_Size", self.current_batch_size, global_step)
        writer.add_scalar(tag_prefix + "Local_Batch_Size", self.current_local_bsz, global_step)
        writer.add_scalar(tag_prefix + "Accumulation_Steps", self.accumulation_steps, global_step)

    @property
    def current_index(self) -> int:
        """Global position in the current pass (samples consumed by all replicas)."""
        return self._state.current_index

    # -- iteration -------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        book = loops()
        epoch = current_epoch()
        key = str(epoch)
        position = book.position[key]
        book.position[key] += 1
        if book.current is not None:
            raise RuntimeError("overlapping AdaptiveDataLoader loops: another adaptive loader "
                               "is still being iterated")
        if position <= self._state.last_position.get(key, -1):
            LOG.info("skipping loop %d of epoch %s: it finished before the restart", position, epoch)
            return
        book.current = self
        interrupted = False
        try:
            yield from self._iterate(epoch)
        except _interrupt.CheckpointExit:
            interrupted = True
            raise
        finally:
            book.current = None
            if not interrupted:
                self._state.current_index = 0
                self._state.loop_start_progress = None
                # Only the current epoch's entries can matter for a replay.
                self._state.last_position = {key: position}

    def _iterate(self, epoch: int | None) -> Iterator[Any]:
        n = len(self.dataset)  # type: ignore[arg-type]
        adaptive = self._max_batch_size is not None
        state = self._state
        if adaptive and self.training:
            # An epoch lasts as long as one pass at the initial batch size would, in
            # statistical progress; larger batches need more samples for the same progress.
            # Outside remaining_epochs_until every loop is an epoch of its own.
            if epoch is None:
                if state.loop_start_progress is None:
                    state.loop_start_progress = _metrics.metrics().progress
                target = state.loop_start_progress + n / self._target_batch_size
            else:
                target = (epoch + 1) * n / self._target_batch_size
        # Fixed for the life of this process (a resize restarts it); read once, not per batch.
        _, replicas, rank = self._world
        batch_sampler = self._local_batch_sampler
        kinds = batch_sampler.kinds
        while True:
            if adaptive and self.training:
                if _metrics.metrics().progress >= target:
                    break
            elif state.current_index >= n:
                break
            if self.training:
                self._decide_batch_size(initial=True)
            pass_end = (state.current_index // n + 1) * n
            local_bsz = self.current_local_bsz
            if local_bsz != batch_sampler.local_bsz:  # (step costs are per local batch)
                batch_sampler.local_bsz, self._plain_s_per_sample = local_bsz, None
            accum_steps = self.accumulation_steps
            # A single replica with one micro-batch per step gives sampled steps two
            # micro-batches to measure the gradient noise (only when the batch size is
            # adaptive: a fixed batch has no use for the measurement): two halves within
            # the micro-batch bounds, else two whole batches within max_batch_size.
            measure = adaptive and self.training and replicas == 1 and accum_steps == 0
            lo = (self._local_bsz_bounds or (None, None))[0] or 1
            halves = local_bsz >= 2 * lo
            batch_sampler.pairs = pairs = measure and not halves \
                and 2 * local_bsz <= self._max_batch_size
            batch_sampler.measure_from = self._steps if measure and (halves or pairs) \
                else None
            self._elastic_sampler.set_epoch(epoch or 0, state.current_index)
            self._micro_in_step = 0
            self._step_samples = 0
            started = None
            timed_split = False
            step_began, step_sampled = None, False
            restart_pass = False
            for batch in super().__iter__():
                now = time.perf_counter()
                opens_pair, size = kinds.popleft()
                # (self.training, not a copy: a loader becomes the training loader at the
                # first optimizer step on its batches.)
                if started is not None and self.training and not timed_split:
                    _metrics.profile_micro_batch(now - started, self._last_micro,
                                                 optimizer_step=self._stepped,
                                                 world=self._world)
                if self._micro_in_step == 0 and not self._pair_first:
                    if measure and step_began is not None:
                        self._note_step_cost(now - step_began, self._last_step_samples,
                                             step_sampled)
                    # Stop and checkpoint requests are honoured only between optimizer
                    # steps, so that no partially accumulated gradient is lost.
                    choice = _batch_boundary(replicas)
                    if choice is not None and choice != (state.local_bsz, state.accum_steps):
                        # Replica 0's new batch size reached every replica with the last
                        # step's all-reduce. This batch is not consumed yet
                        # (current_index): the next pass loads it again at the new size.
                        state.local_bsz, state.accum_steps = choice
                        LOG.info("batch size now %d (local %d x %d micro-batches x %d "
                                 "replicas)", self.current_batch_size, self.current_local_bsz,
                                 self.accumulation_steps + 1, replicas)
                        restart_pass = True
                        break
                    # (Timed from here: an in-place checkpoint just taken is no step cost.)
                    step_began, step_sampled = time.perf_counter(), opens_pair
                    self._step_micros = 2 if opens_pair else accum_steps + 1
                    self._measure_norms = (self._sync_steps < NOISE_DENSE_STEPS
                                           or self._sync_steps % NOISE_MULTI_INTERVAL == 0)
                    self._sync_steps += 1
                # The second micro-batch of a measured single-replica step: the gradient
                # now accumulated is the first micro-batch's alone.
                self._measure_first = replicas == 1 and self._micro_in_step == 1 \
                    and self.training
                # The micro-batches of a measured single-replica step are not profiled:
                # the first, without optimizer step and sync, would look cheaper per
                # sample than any other micro-batch and skew the throughput model.
                timed_split = opens_pair or self._pair_first
                self._pair_first = opens_pair
                self._last_micro = size
                self._step_samples += size
                started = time.perf_counter()
                self._stepped = False
                yield batch
                # The caller finished with the batch: it counts as consumed.
                state.current_index = min(state.current_index + replicas * size, pass_end)
                self._micro_in_step += 1
                if self._micro_in_step >= self._step_micros:
                    self._micro_in_step = 0
                    self._pair_first = False
                    self._last_step_samples = self._step_samples
                    self._step_samples = 0
                    if adaptive and self.training:
                        _metrics.advance_progress_without_model(
                            replicas * self._last_step_samples / self._target_batch_size)
                        if _metrics.metrics().progress >= target:
                            break
                        self._steps += 1
                        if self._steps % DECIDE_EVERY_STEPS == 0:
                            if replicas > 1 and self._stepped:
                                # Replica 0 decides; its choice travels with the next
                                # step's all-reduce (AdaptiveDataParallel) to the boundary
                                # after it, where every replica applies it.
                                if rank == 0 and self._decision_due():
                                    self._proposal = self._goodput_choice(
                                        (state.local_bsz, state.accum_steps), False)
                            elif (replicas > 1 or self._decision_due()) \
                                    and self._decide_batch_size():
                                restart_pass = True  # new local batch: new iterator
                                break
            else:
                # The pass is exhausted; samples dropped by drop_last count as passed, or
                # a multi-pass (adaptive) epoch would find the same empty remainder forever.
                state.current_index = pass_end
            if not adaptive or not self.training:
                if not restart_pass:
                    break
        self._micro_in_step = 0
        self._pair_first = self._measure_first = False
        self._step_samples = 0
        choice = _batch_boundary(replicas)
        if choice is not None:
            state.local_bsz, state.accum_steps = choice
