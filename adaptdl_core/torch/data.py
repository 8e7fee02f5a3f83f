"""The adaptive data loader: data loading that survives restarts and resizes.

:class:`AdaptiveDataLoader` tracks the global position (samples consumed by all replicas)
in a checkpointed State, so a restarted job, on any number of replicas, continues the same
epoch at the same sample (:class:`~adaptdl_core.torch.sampler.ElasticSampler` deals the
samples). Within an epoch every sample is used exactly once, except that the last batch
of a pass is padded with a few repeated samples when the remaining samples do not divide
evenly among replicas (``drop_last=True`` drops that batch instead;
:func:`~adaptdl_core.torch.whole_set.drop_padding` removes the repeats, for metrics over
a whole dataset).

The loader's steps are run by one composed object, its
:class:`~adaptdl_core.torch.step_cycle.StepCycle` (read it top to bottom: agree at the
boundary, plan, run, measure, decide the batch size); its saved position is a
:class:`~adaptdl_core.torch.loader_state.LoaderState`. An autoscaled loader chooses its
batch size from the goodput model
(:class:`~adaptdl_core.torch.batch_control.BatchSizeController`, which also holds the
batch size limits).
"""

from __future__ import annotations

import logging
import math
from typing import Any, Iterator

from torch.utils.data import DataLoader, IterableDataset

from adaptdl_core import checkpoint, context, env, validation
from adaptdl_core.torch import _metrics
from adaptdl_core.torch.batch_control import BatchSizeController, preferred_local_sizes
from adaptdl_core.torch.boundary import current_dataloader, loops, training_loader
from adaptdl_core.torch.loader_state import STATE_PREFIX, LoaderState
from adaptdl_core.torch.sampler import ElasticSampler, LocalBatchSampler
from adaptdl_core.torch.step_cycle import StepCycle, StepPlan

# (ElasticSampler, current_dataloader, preferred_local_sizes and training_loader are
# defined next door and exported here too, where they were defined before.)
__all__ = ["ElasticSampler", "AdaptiveDataLoader", "current_dataloader",
           "preferred_local_sizes", "training_loader"]

LOG = logging.getLogger(__name__)

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
        batch_size = validation.integer("batch_size", batch_size, 1,
                                        what="an integer (the global batch size)")
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
        world = (env.num_nodes(), sampler.num_replicas, sampler.rank)
        # The batch size rules and limits (fixed until autoscale_batch_size).
        control = BatchSizeController(batch_size, *world[:2])
        existing = context.current().states.count_prefix(STATE_PREFIX)
        self._state = LoaderState(f"{STATE_PREFIX}{existing}", len(dataset), control)
        checkpoint.load_state(self._state)
        # The step machinery: plans, runs, measures, agrees on and sizes every step.
        self._cycle = StepCycle(self, self._state, sampler, batch_sampler, control, world,
                                DataLoader.__iter__)
        self._cycle.decide(initial=True)

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
        return self._cycle.control.init_batch_size

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
                or max_batch_size < self.batch_size:
            raise ValueError(f"autoscale_batch_size(max_batch_size={max_batch_size!r}): must "
                             f"be an int >= the loader's batch_size ({self.batch_size})")
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
        control = self._cycle.control
        control.autoscale(max_batch_size, local_bsz_bounds, bool(gradient_accumulation))
        loops().training = self
        # (The job's record of the training loader's limits, for the scheduler hints.)
        _metrics.set_batch_size_limits(self.batch_size, max_batch_size,
                                       local_bsz_bounds, gradient_accumulation)
        if not control.fits(self._state.local_bsz, self._state.accum_steps):
            # (The constructor's choice knew no bounds; a restored one may predate them.)
            self._state.local_bsz, self._state.accum_steps = control.initial_choice()
        self._cycle.decide(initial=True)

    def _check_bounds_make_batch(self, bounds: tuple[int | None, int | None] | None,
                                 accumulate: bool) -> None:
        """Raise ValueError if the micro-batch upper bound cannot make the initial batch
        on this job's replicas without gradient accumulation (the bound would be broken)."""
        hi = (bounds or (None, None))[1]
        replicas = self._cycle.world[1]
        need = math.ceil(self.batch_size / replicas)
        if hi is not None and need > hi and not accumulate:
            raise ValueError(
                f"autoscale_batch_size(local_bsz_bounds={bounds!r}): the initial batch_size "
                f"{self.batch_size} on {replicas} replica(s) needs local batches of "
                f"{need}, above the bound {hi}; raise the bound, lower batch_size, or pass "
                f"gradient_accumulation=True (then micro-batches of at most {hi} are "
                "accumulated into each step)")

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
        return self._cycle.batch_size

    @property
    def is_accumulation_step(self) -> bool:
        """True while the batch just handed out is not the last micro-batch of an optimizer
        step (AdaptiveDataParallel then skips gradient sync and the optimizer step)."""
        return self._cycle.is_accumulation_step

    @property
    def step_batch_size(self) -> int:
        """Samples of the current optimizer step over all replicas, as loaded so far
        (smaller than :attr:`current_batch_size` for the partial last batch of a pass;
        0 outside a step)."""
        return self._cycle.step_samples * self._cycle.world[1]

    @property
    def gradient_accumulation(self) -> bool:
        """Whether :meth:`autoscale_batch_size` allowed several micro-batches per step."""
        return self._cycle.control.gradient_accumulation

    @property
    def step_plan(self) -> StepPlan:
        """The plan of the current optimizer step (micro-batches, local batch, how the
        gradient noise is measured), decided at its boundary."""
        return self._cycle.plan

    @property
    def micro_index(self) -> int:
        """Which micro-batch of the current optimizer step was handed out last (0 for the
        first)."""
        return self._cycle.micro_index

    @property
    def max_batch_size(self) -> int | None:
        """Largest global batch allowed by :meth:`autoscale_batch_size` (None: fixed)."""
        return self._cycle.control.max_batch_size

    @property
    def local_bsz_bounds(self) -> tuple[int | None, int | None] | None:
        """Per-replica micro-batch bounds given to :meth:`autoscale_batch_size`."""
        return self._cycle.control.local_bsz_bounds

    @property
    def training(self) -> bool:
        """True for the loader whose batches the optimizer steps on."""
        return self._cycle.training

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
        last = self._cycle.last_micro
        if loops().current is not self or not last:
            return 0
        return last - self._elastic_sampler.distinct_count(self._state.current_index, last)

    @property
    def current_index(self) -> int:
        """Global position in the current pass (samples consumed by all replicas)."""
        return self._state.current_index

    def __setstate__(self, state: dict[str, Any]) -> None:
        """An unpickled copy: its step cycle (which knows its loader only weakly) is this
        copy's."""
        self.__dict__.update(state)
        self._cycle.rebind(self)

    # -- iteration -------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        """One loop over the loader (see the class docstring): its steps are run by the
        loader's :class:`~adaptdl_core.torch.step_cycle.StepCycle`."""
        n = len(self.dataset)  # type: ignore[arg-type]
        return self._cycle.loop(n, self)  # (the loop holds the loader while it runs)
