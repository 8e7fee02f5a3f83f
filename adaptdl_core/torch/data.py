"""The adaptive data loader: data loading that survives restarts and resizes.

:class:`AdaptiveDataLoader` tracks the global position (samples consumed by all replicas)
in a checkpointed State, so a restarted job, on any number of replicas, continues the same
epoch at the same sample (:class:`~adaptdl_core.torch.sampler.ElasticSampler` deals the
samples). Within an epoch every sample is used exactly once, except that the last batch
of a pass is padded with a few repeated samples when the remaining samples do not divide
evenly among replicas (``drop_last=True`` drops that batch instead;
:func:`~adaptdl_core.torch.whole_set.drop_padding` removes the repeats, for metrics over
a whole dataset).

An autoscaled loader also chooses its batch size from the goodput model
(:class:`~adaptdl_core.torch.batch_control.BatchSizeController`) and plans every optimizer
step (:class:`~adaptdl_core.torch.step_plan.StepPlan`); its batch boundaries are where the
replicas agree on stop and checkpoint requests and on the batch size
(:mod:`adaptdl_core.torch.boundary`).
"""

from __future__ import annotations

import json
import logging
import math
import time
from typing import Any, Iterator

from torch.utils.data import DataLoader, IterableDataset

from adaptdl_core import checkpoint, collective, context, env
from adaptdl_core.torch import _metrics, boundary
from adaptdl_core.torch.batch_control import BatchSizeController, preferred_local_sizes
from adaptdl_core.torch.boundary import current_dataloader, loops, training_loader
from adaptdl_core.torch.elastic_loop import LoopState, run_loop
from adaptdl_core.torch.loader_steps import LoopSteps, StepTimer
from adaptdl_core.torch.sampler import ElasticSampler, LocalBatchSampler
from adaptdl_core.torch.step_plan import NoiseMode, StepPlan

# (ElasticSampler, current_dataloader, preferred_local_sizes and training_loader are
# defined next door and exported here too, where they were defined before.)
__all__ = ["ElasticSampler", "AdaptiveDataLoader", "current_dataloader",
           "preferred_local_sizes", "training_loader"]

LOG = logging.getLogger(__name__)

_STATE_PREFIX = "adaptdl-dataloader-"


def _position_limit(dataset_len: int, batch_size: int, max_batch_size: int | None) -> int:
    """The largest global position (samples consumed in one loop) a loader can reach.

    A loop with a fixed batch size makes one pass: at most ``dataset_len``. An autoscaled
    training loop lasts one pass's statistical progress, and each optimizer step of
    ``M`` samples makes at least ``min(M, M0) / M0`` steps of progress (``M0`` =
    ``batch_size``; AdaScale's gain is at least 1 for ``M >= M0``), so it consumes at most
    ``dataset_len * max_batch_size / M0`` samples plus the step that crosses the target;
    the limit doubles that, plus one pass, for the passes that end on a partial batch.

    Raises:
        ValueError: for a dataset length < 0 or batch sizes < 1.
    """
    if dataset_len < 0 or batch_size < 1 or (max_batch_size is not None and max_batch_size < 1):
        raise ValueError(f"_position_limit(dataset_len={dataset_len}, batch_size={batch_size}, "
                         f"max_batch_size={max_batch_size}): need a length >= 0 and batch "
                         "sizes >= 1")
    if max_batch_size is None:
        return dataset_len
    ratio = math.ceil(max(max_batch_size, batch_size) / batch_size)
    return 2 * (dataset_len * ratio + max_batch_size) + dataset_len


def _is_count(value: Any, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def _check_saved_position(data: bytes) -> None:
    """Content check of a saved loader state (see checkpoint.register_content_check):
    the position must be one the loader could have reached."""
    saved = json.loads(data.decode("utf-8"))
    index = saved.get("current_index")
    if not _is_count(index, 0):
        raise ValueError(f"current_index={index!r} is not a position (an integer >= 0)")
    if saved.get("local_bsz") is not None and not _is_count(saved["local_bsz"], 1):
        raise ValueError(f"local_bsz={saved['local_bsz']!r} is not a batch size (>= 1)")
    if not _is_count(saved.get("accum_steps", 0), 0):
        raise ValueError(f"accum_steps={saved.get('accum_steps')!r} is not a count (>= 0)")
    limits = saved.get("limits")
    if limits is None:
        return  # (saved before the limits were recorded: position unchecked)
    n, bsz, max_bsz = limits.get("dataset_len"), limits.get("batch_size"), \
        limits.get("max_batch_size")
    if not (_is_count(n, 0) and _is_count(bsz, 1)
            and (max_bsz is None or _is_count(max_bsz, 1))):
        raise ValueError(f"limits={limits!r} are not a dataset length and batch sizes")
    limit = _position_limit(n, bsz, max_bsz)
    if index > limit:
        scope = "one pass" if max_bsz is None else \
            f"an autoscaled epoch with batches up to {max_bsz}"
        raise ValueError(f"current_index={index} is past the end of the epoch: {scope} over "
                         f"{n} samples reaches at most {limit}")


checkpoint.register_content_check(_STATE_PREFIX, _check_saved_position)


class _LoaderState(LoopState):
    """The loader's position (a :class:`LoopState`) saved together with what bounds it:
    the dataset length and the batch sizes, so that a restore can tell an impossible
    position from a real one before it uses the checkpoint."""

    def __init__(self, name: str, dataset_len: int, batch_size: int):
        super().__init__(name)
        self.dataset_len = dataset_len
        self.batch_size = batch_size
        self.max_batch_size: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """The position (:meth:`LoopState.to_dict`) and its limits, as saved."""
        return {**super().to_dict(),
                "limits": {"dataset_len": self.dataset_len, "batch_size": self.batch_size,
                           "max_batch_size": self.max_batch_size}}

    def from_dict(self, data: dict[str, Any]) -> None:
        """Take the saved position; the limits stay this run's (set by the loader).

        Raises:
            ValueError: if the position is inside a loop over a dataset of another
                length than this run's (its samples cannot be mapped onto this one's:
                some would be skipped or repeated); the message names both lengths.
        """
        super().from_dict(data)
        saved = (data.get("limits") or {}).get("dataset_len")
        if saved is None or saved == self.dataset_len:
            return
        if self.current_index > 0:
            raise ValueError(
                f"the checkpoint was taken {self.current_index} samples into a loop over a "
                f"dataset of {saved} samples, but this run's dataset has {self.dataset_len}: "
                "the position cannot be carried over (samples would be skipped or "
                "repeated); resume with the same dataset, or start from an empty "
                "checkpoint directory")
        # Between loops nothing depends on the old length: the new dataset is used.
        LOG.warning("%s: the dataset has %d samples, the checkpoint's had %d; no loop was "
                    "in progress, so the next loop uses the new dataset", self.name,
                    self.dataset_len, saved)


class AdaptiveDataLoader(LoopSteps, DataLoader):
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
        shuffle: reshuffle every epoch (deterministically, the same on all replicas); a
            bool.
        **kwargs: other DataLoader arguments (``num_workers``, ``collate_fn``,
            ``drop_last`` (a bool), ``pin_memory``, ...).

    Raises:
        ValueError: for a bad ``batch_size``, a ``sampler`` or ``batch_sampler``, a
            ``shuffle`` or ``drop_last`` that is not a bool, ``drop_last=True`` with a
            dataset smaller than one batch, or an iterable dataset.
        adaptdl_core.checkpoint.CheckpointError: when the job resumes inside a loop
            over a dataset of another length than this one (the message names both).
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
                             "supported; wrap the data in a map-style Dataset with __len__, "
                             "or iterate the stream with adaptdl_core.torch.ElasticLoop, "
                             "which makes any iterable restart-consistent")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"AdaptiveDataLoader(batch_size={batch_size!r}): the global batch "
                             "size must be an integer >= 1")
        drop_last = kwargs.pop("drop_last", False)
        for key, value in (("shuffle", shuffle), ("drop_last", drop_last)):
            if not isinstance(value, bool):  # ('no' would be true, and would shuffle)
                raise ValueError(f"AdaptiveDataLoader({key}={value!r}): pass True or False")
        if drop_last and hasattr(dataset, "__len__") and 0 < len(dataset) < batch_size:
            # (Plain PyTorch would run epochs of no batch at all.)
            raise ValueError(f"AdaptiveDataLoader(batch_size={batch_size}, drop_last=True): "
                             f"the dataset has only {len(dataset)} samples, fewer than one "
                             "batch, so every batch would be dropped; use a batch_size <= "
                             f"{len(dataset)} or drop_last=False")
        sampler = ElasticSampler(dataset, shuffle=shuffle)
        batch_sampler = LocalBatchSampler(sampler, 1, drop_last)
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
        self._stepped = False    # AdaptiveDataParallel stepped (note_optimizer_step)
        self._steps = 0          # optimizer steps taken in this run (decision schedule)
        self._sync_steps = 0     # optimizer steps started in this run (any mode)
        # The batch handed out is the first of a single-replica step's two measured
        # micro-batches (halves of its batch, or two whole batches).
        self._pair_first = False
        # The current optimizer step's plan (see step_plan), made at its boundary.
        self._plan = StepPlan(0, 1, 1, NoiseMode.NONE)
        self._step_samples = 0   # local samples of the current optimizer step so far
        self._last_micro = 0     # local samples of the micro-batch handed out last
        self._last_step_samples = 0
        # The batch size decisions (fixed until autoscale_batch_size), and replica 0's
        # choice waiting for the next step's side values.
        self._control = BatchSizeController(batch_size, *self._world[:2])
        self._proposal: tuple[int, int] | None = None
        existing = context.current().states.count_prefix(_STATE_PREFIX)
        self._state = _LoaderState(f"{_STATE_PREFIX}{existing}", len(dataset), batch_size)
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
            ValueError: for a max_batch_size below batch_size or not an int, or above the
                dataset's length with ``drop_last=True``; bounds that are not a pair of
                positive ints with min <= max_batch_size and min <= max, or whose max
                cannot make the initial batch on this job's replicas without
                ``gradient_accumulation``.
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
        n = len(self.dataset)  # type: ignore[arg-type]
        if self._local_batch_sampler.drop_last and max_batch_size > n:
            raise ValueError(f"autoscale_batch_size(max_batch_size={max_batch_size}) with "
                             f"drop_last=True: the dataset has {n} samples, and a batch "
                             "larger than that would be dropped in every pass; use "
                             f"max_batch_size <= {n} or drop_last=False")
        self._check_bounds_make_batch(local_bsz_bounds, bool(gradient_accumulation))
        self._max_batch_size = max_batch_size
        self._state.max_batch_size = max_batch_size
        self._local_bsz_bounds = local_bsz_bounds
        self._gradient_accumulation = bool(gradient_accumulation)
        self._control = BatchSizeController(self._target_batch_size, *self._world[:2],
                                            max_batch_size, local_bsz_bounds,
                                            self._gradient_accumulation)
        loops().training = self
        _metrics.set_batch_size_limits(self._target_batch_size, max_batch_size,
                                       local_bsz_bounds, gradient_accumulation)
        if not self._control.fits(self._state.local_bsz, self._state.accum_steps):
            # (The constructor's choice knew no bounds; a restored one may predate them.)
            self._state.local_bsz, self._state.accum_steps = self._control.initial_choice()
        self._decide_batch_size(initial=True)

    def _check_bounds_make_batch(self, bounds: tuple[int | None, int | None] | None,
                                 accumulate: bool) -> None:
        """Raise ValueError if the micro-batch upper bound cannot make the initial batch
        on this job's replicas without gradient accumulation (the bound would be broken)."""
        hi = (bounds or (None, None))[1]
        replicas = self._world[1]
        need = math.ceil(self._target_batch_size / replicas)
        if hi is not None and need > hi and not accumulate:
            raise ValueError(
                f"autoscale_batch_size(local_bsz_bounds={bounds!r}): the initial batch_size "
                f"{self._target_batch_size} on {replicas} replica(s) needs local batches of "
                f"{need}, above the bound {hi}; raise the bound, lower batch_size, or pass "
                f"gradient_accumulation=True (then micro-batches of at most {hi} are "
                "accumulated into each step)")

    def _decision_due(self) -> bool:
        """Whether a goodput decision could change anything now (the controller's
        cadence, from the noise estimate and the throughput fits). Local to this replica."""
        m = _metrics.metrics()
        grad = m.grad_params
        ratio = grad.var / grad.sqr if grad is not None and grad.sqr > 0 else 0.0
        return self._control.decision_due(ratio, m.fits)

    def _decide_batch_size(self, initial: bool = False) -> bool:
        """Choose (local batch, accumulation steps); returns True if they changed.

        Replica 0 decides from its goodput model and broadcasts, so that all replicas
        always agree.
        """
        _, replicas, rank = self._world
        current = (self._state.local_bsz, self._state.accum_steps)
        if self._max_batch_size is None:
            choice = self._control.initial_choice()
        else:
            choice = current if current[0] is not None else self._control.initial_choice()
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
        return self._control.choose(_metrics.goodput_fn(), current, initial)

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
    def step_batch_size(self) -> int:
        """Samples of the current optimizer step over all replicas, as loaded so far
        (smaller than :attr:`current_batch_size` for the partial last batch of a pass;
        0 outside a step)."""
        return self._step_samples * self._world[1]

    @property
    def gradient_accumulation(self) -> bool:
        """Whether :meth:`autoscale_batch_size` allowed several micro-batches per step."""
        return self._gradient_accumulation

    @property
    def step_plan(self) -> StepPlan:
        """The plan of the current optimizer step (micro-batches, local batch, how the
        gradient noise is measured), decided at its boundary."""
        return self._plan

    @property
    def micro_index(self) -> int:
        """Which micro-batch of the current optimizer step was handed out last (0 for the
        first)."""
        return self._micro_in_step

    def note_optimizer_step(self) -> None:
        """Called by AdaptiveDataParallel when the optimizer stepped on this loader's
        batches (the step's time is then profiled as an optimizer step)."""
        self._stepped = True

    def take_proposal(self) -> tuple[int, int] | None:
        """Replica 0's pending batch size choice ``(local batch, accumulation steps)``
        for the replicas to agree on, or ``None``; taking it clears it."""
        proposal, self._proposal = self._proposal, None
        return proposal

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
    def batch_padding(self) -> int:
        """How many samples at the end of the batch handed out last are padding: repeats
        of samples from the start of the pass, dealt only so that every replica's last
        batch of a pass has the same size (0 for all other batches, and outside a loop
        over this loader). Leave them out of metrics over the whole dataset (see
        :func:`~adaptdl_core.torch.whole_set.drop_padding`)."""
        if loops().current is not self or not self._last_micro:
            return 0
        return self._last_micro - self._elastic_sampler.distinct_count(
            self._state.current_index, self._last_micro)

    @property
    def current_index(self) -> int:
        """Global position in the current pass (samples consumed by all replicas)."""
        return self._state.current_index

    # -- iteration -------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        return run_loop(self, self._state, self._iterate, adaptive_loader=True)

    def _iterate(self, epoch: int | None) -> Iterator[Any]:
        """One loop over the loader: passes over the data until the loop ends (a fixed
        batch: one pass; an autoscaled training loader: an epoch's statistical progress,
        possibly several passes), starting a new pass whenever the local batch changes."""
        n = len(self.dataset)  # type: ignore[arg-type]
        target = self._progress_target(epoch, n) if self._autoscaled() else None
        while not self._loop_done(target, n):
            if self.training:
                self._decide_batch_size(initial=True)
            self._check_pass_has_a_batch(n)
            restarted = yield from self._one_pass(epoch, n, target)
            if not restarted and not self._autoscaled():
                break
        self._micro_in_step = 0
        self._pair_first = False
        self._step_samples = 0
        choice = boundary.agree(self._world[1])
        if choice is not None:
            self._state.local_bsz, self._state.accum_steps = choice

    def _check_pass_has_a_batch(self, n: int) -> None:
        """Raise RuntimeError before a whole pass in which ``drop_last`` would drop every
        batch: a loop that ends by progress would otherwise spin through empty passes
        for ever, and a fixed one would run an epoch of no step."""
        replicas = self._world[1]
        share = math.ceil(n / replicas)
        local = self.current_local_bsz
        if self._state.current_index % n == 0 and self._local_batch_sampler.drop_last \
                and share < local:
            raise RuntimeError(
                f"drop_last=True drops every batch: each of the {replicas} replicas gets "
                f"{share} of the {n} samples per pass, fewer than its local batch of "
                f"{local} (local_bsz_bounds={self._local_bsz_bounds!r}); use "
                "drop_last=False, or a lower local_bsz_bounds minimum or batch_size")

    def _one_pass(self, epoch: int | None, n: int, target: float | None
                  ) -> Iterator[Any]:
        """Hand out the batches of one pass from the current position; returns True when
        the pass stopped early for a new local batch size (the loop starts another)."""
        state = self._state
        replicas = self._world[1]
        pass_end = (state.current_index // n + 1) * n
        measure = self._configure_pass(epoch)
        kinds = self._local_batch_sampler.kinds
        self._micro_in_step = 0
        self._step_samples = 0
        timer = StepTimer()
        for batch in super().__iter__():
            now = time.perf_counter()
            opens_pair, size = kinds.popleft()
            self._profile_last_micro_batch(now, timer)
            if self._micro_in_step == 0 and not self._pair_first:
                if self._step_boundary(now, timer, measure):
                    return True
                # (Timed from here: an in-place checkpoint just taken is no step cost.)
                timer.step_began, timer.step_sampled = time.perf_counter(), opens_pair
                self._plan = self._plan_step(opens_pair, self.accumulation_steps,
                                             self.current_local_bsz)
            # The micro-batches of a measured single-replica step are not profiled: the
            # first, without optimizer step and sync, would look cheaper per sample than
            # any other micro-batch and skew the throughput model.
            timer.skip = opens_pair or self._pair_first
            self._pair_first = opens_pair
            self._last_micro = size
            self._step_samples += size
            timer.started = time.perf_counter()
            self._stepped = False
            yield batch
            # The caller finished with the batch: it counts as consumed.
            state.current_index = min(state.current_index + replicas * size, pass_end)
            self._micro_in_step += 1
            if self._micro_in_step >= self._plan.micros:
                ended = self._end_step(target)
                if ended is not None:
                    return ended
        # The pass is exhausted; samples dropped by drop_last count as passed, or a
        # multi-pass (adaptive) epoch would find the same empty remainder forever.
        state.current_index = pass_end
        return False
