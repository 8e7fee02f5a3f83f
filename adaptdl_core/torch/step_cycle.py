"""The adaptive data loader's optimizer steps, read top to bottom.

:class:`StepCycle` is the step machinery of one
:class:`~adaptdl_core.torch.data.AdaptiveDataLoader` (the loader holds one and reads its
public attributes; nothing else shares its state). A loop over the loader
(:meth:`StepCycle.loop`) runs passes over the data; within a pass
(its method ``_one_pass``) every optimizer step goes through the same five stages:

1. **agree** at the boundary before it (:meth:`_agree`): stop and checkpoint requests,
   and a batch size replica 0 chose, agreed with the other replicas
   (:func:`adaptdl_core.torch.boundary.agree`);
2. **plan** it (:meth:`_plan`): micro-batches, local batch, how the gradient noise is
   measured (a :class:`StepPlan`, defined below; AdaptiveDataParallel and its gradient
   probe act on the plan only, never on the loader's bookkeeping);
3. **run** it: hand out its micro-batches and count the samples consumed;
4. **measure** it: the wall time of every micro-batch goes to the throughput profile
   and the step's cost to the noise-sampling schedule (:class:`StepTimer`);
5. **decide** the batch size when the step ends (:meth:`_end_step`, :meth:`decide`):
   from the goodput model, on replica 0, every ``DECIDE_EVERY_STEPS`` steps.
"""

from __future__ import annotations

import enum
import logging
import math
import time
import weakref
from typing import Any, Callable, Iterable, Iterator

from adaptdl_core import collective
from adaptdl_core.torch import _metrics, boundary
from adaptdl_core.torch.batch_control import DECIDE_EVERY_STEPS, BatchSizeController
from adaptdl_core.torch.elastic_loop import loop_scope
from adaptdl_core.torch.epoch import count_samples
from adaptdl_core.torch.loader_state import LoaderState
from adaptdl_core.torch.sampler import ElasticSampler, LocalBatchSampler, replicas_measure

__all__ = ["StepCycle", "StepPlan", "NoiseMode", "StepTimer"]

LOG = logging.getLogger(__name__)


class NoiseMode(enum.Enum):
    """How the gradient noise is measured in a step.

    - ``NONE``: not at all (a fixed batch size, or a step between sampled ones).
    - ``REPLICAS``: from the replicas' local gradients against their average (several
      replicas; the local and averaged squared norms are taken).
    - ``MICRO_BATCHES``: one replica accumulating several micro-batches per step: the
      first micro-batch's gradient against the step's average.
    - ``HALVES``: one replica, a sampled step whose batch is handed out as two halves.
    - ``PAIRS``: one replica, a sampled step of two whole batches (a half would fall
      below the micro-batch lower bound).
    """

    NONE = "none"
    REPLICAS = "replicas"
    MICRO_BATCHES = "micro-batches"
    HALVES = "halves"
    PAIRS = "pairs"


class StepPlan:
    """What one optimizer step does, decided at its boundary (read-only by convention;
    one per step, so kept cheap: slots, no validation beyond the arguments below).

    Arguments:
        index: how many optimizer steps the loader started in this run, this one
            included (the same on every replica; it numbers the side-value schedule).
        micros: micro-batches in the step (>= 1): the accumulation steps + 1, or 2 for a
            sampled step of one replica.
        local_bsz: samples per micro-batch on this replica (the last micro-batch of a
            pass may hold fewer).
        noise: how the gradient noise is measured (:class:`NoiseMode`).

    Raises:
        ValueError: for ``micros < 1``, ``local_bsz < 1`` or a ``noise`` that is not a
            :class:`NoiseMode`.
    """

    __slots__ = ("index", "micros", "local_bsz", "noise")

    def __init__(self, index: int, micros: int, local_bsz: int, noise: NoiseMode):
        if micros < 1 or local_bsz < 1 or not isinstance(noise, NoiseMode):
            raise ValueError(f"StepPlan(micros={micros!r}, local_bsz={local_bsz!r}, "
                             f"noise={noise!r}): need micros >= 1, local_bsz >= 1 and a "
                             "NoiseMode")
        self.index, self.micros, self.local_bsz, self.noise = index, micros, local_bsz, noise

    @property
    def measures_replicas(self) -> bool:
        """True if the replicas' local gradient norms are measured in this step."""
        return self.noise is NoiseMode.REPLICAS

    @property
    def measures_first_micro_batch(self) -> bool:
        """True if one replica measures the noise from the first micro-batch's gradient
        against the step's average (accumulation, halves or pairs)."""
        return self.noise is not NoiseMode.NONE and self.noise is not NoiseMode.REPLICAS

    @property
    def key(self) -> tuple:
        """What identifies the plan: ``(index, micros, local_bsz, noise)`` (equality and
        hashing go by it)."""
        return (self.index, self.micros, self.local_bsz, self.noise)

    def __eq__(self, other: object) -> bool:
        return self.key == other.key if isinstance(other, StepPlan) else NotImplemented

    def __hash__(self) -> int:
        return hash(self.key)

    def __repr__(self) -> str:
        return (f"StepPlan(index={self.index}, micros={self.micros}, "
                f"local_bsz={self.local_bsz}, noise={self.noise.value})")


class StepTimer:
    """Timing of the micro-batch and the optimizer step in flight (one per pass)."""

    __slots__ = ("started", "skip", "step_began", "step_sampled")

    def __init__(self) -> None:
        self.started: float | None = None      # the last micro-batch was handed out
        self.skip = False                      # ...and is not profiled
        self.step_began: float | None = None   # the current optimizer step began
        self.step_sampled = False              # ...and samples the noise


class StepCycle:
    """Plans, runs, measures, agrees on and sizes the optimizer steps of one loader.

    Arguments:
        owner: the loader (its identity marks it as the job's training loader; weakly).
        state: the loader's checkpointed position and batch configuration; the cycle
            writes ``current_index``, ``local_bsz`` and ``accum_steps``.
        elastic_sampler, batch_sampler: the loader's samplers.
        control: the batch size rules and limits (the one place they are held).
        world: ``(nodes, replicas, rank)`` of this process.
        batches: makes a loader's iterator of one pass's batches (DataLoader.__iter__).
    """

    def __init__(self, owner: Any, state: LoaderState, elastic_sampler: ElasticSampler,
                 batch_sampler: LocalBatchSampler, control: BatchSizeController,
                 world: tuple[int, int, int], batches: Callable[[Any], Iterable[Any]]):
        self._owner: weakref.ref | None = None
        self.rebind(owner)
        self.state = state
        self.elastic_sampler, self.batch_sampler = elastic_sampler, batch_sampler
        self.control, self.world = control, world
        self._batches = batches
        self._book: boundary.Loops | None = None  # the job's loop book, during a loop
        # The current optimizer step: its plan (made at its boundary), the micro-batch
        # handed out last and its local samples, the step's local samples so far.
        self.plan = StepPlan(0, 1, 1, NoiseMode.NONE)
        self.micro_index = 0
        self.last_micro = 0
        self.step_samples = 0
        self.last_step_samples = 0
        # The batch handed out is the first of a single-replica step's two measured
        # micro-batches (halves of its batch, or two whole batches).
        self.pair_first = False
        self.stepped = False     # AdaptiveDataParallel stepped on the last micro-batch
        self.steps = 0           # optimizer steps taken in this run (decision schedule)
        self.sync_steps = 0      # optimizer steps started in this run (any mode)
        # Replica 0's choice, waiting to travel with the next step's side values.
        self.proposal: tuple[int, int] | None = None

    def rebind(self, owner: Any) -> None:
        """Make ``owner`` this cycle's loader (also an unpickled copy's), known weakly: a
        dropped loader is freed (its workers stopped) at once, not at a later collection."""
        self._owner = weakref.ref(owner)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_owner": None}  # (a weak reference does not pickle)

    # -- what the loader reports ---------------------------------------------------------
    @property
    def training(self) -> bool:
        """True if the owner is the loader whose batches the optimizer steps on."""
        owner = self._owner() if self._owner is not None else None
        return owner is not None and (self._book or boundary.loops()).training is owner

    def autoscaled(self) -> bool:
        """An autoscaled training loader: its loops end by statistical progress. (Read
        each time: a loader becomes the training loader at the first optimizer step on
        its batches.)"""
        return self.control.max_batch_size is not None and self.training

    @property
    def is_accumulation_step(self) -> bool:
        """True while the micro-batch handed out last does not end its optimizer step."""
        return self.pair_first or self.micro_index < self.state.accum_steps

    @property
    def batch_size(self) -> int:
        """Global batch of one optimizer step at the current configuration."""
        return int(self.state.local_bsz) * (int(self.state.accum_steps) + 1) * self.world[1]

    # -- a loop: passes until it ends ----------------------------------------------------
    def loop(self, n: int, owner: Any) -> Iterator[Any]:
        """One loop over a dataset of ``n`` samples, in its
        :func:`~adaptdl_core.torch.elastic_loop.loop_scope` (skipped if it finished before
        a restart): passes over the data until the loop ends (a fixed batch: one pass; an
        autoscaled training loader: an epoch's statistical progress, possibly several
        passes), starting a new pass whenever the local batch changes (of loader ``owner``)."""
        with loop_scope(owner, self.state, adaptive_loader=True) as entry:
            if entry.skip:
                return
            epoch = entry.epoch
            self._book = book = boundary.loops()
            book.cycle = self  # (what AdaptiveDataParallel reads at every step)
            try:
                target = self._progress_target(epoch, n) if self.autoscaled() else None
                while not self._loop_done(target, n):
                    if self.training:
                        self.decide(initial=True)
                    self._check_pass_has_a_batch(n)
                    restarted = yield from self._one_pass(owner, epoch, n, target)
                    if not restarted and not self.autoscaled():
                        break
                self.micro_index = 0
                self.pair_first = False
                self.step_samples = 0
                # The training loop's last boundary: requests agreed here wait for the
                # next epoch's first (the epoch's remaining code runs to its end).
                choice = boundary.agree(self.world[1], defer=self.training and epoch is not None)
                if choice is not None:
                    self.state.local_bsz, self.state.accum_steps = choice
            finally:
                book.cycle = self._book = None

    def _progress_target(self, epoch: int | None, n: int) -> float:
        """The statistical progress at which this loop ends: an epoch lasts as long as
        one pass at the initial batch size would, in progress (larger batches need more
        samples for the same progress). Outside remaining_epochs_until every loop is an
        epoch of its own."""
        state = self.state
        if epoch is not None:
            return (epoch + 1) * n / self.control.init_batch_size
        if state.loop_start_progress is None:
            state.loop_start_progress = _metrics.metrics().progress
        return state.loop_start_progress + n / self.control.init_batch_size

    def _loop_done(self, target: float | None, n: int) -> bool:
        if self.autoscaled() and target is not None:
            return _metrics.metrics().progress >= target
        # (A fixed batch, or a loader that became the training loader during the loop.)
        return self.state.current_index >= n

    def _check_pass_has_a_batch(self, n: int) -> None:
        """Raise RuntimeError before a whole pass in which ``drop_last`` would drop every
        batch: a loop that ends by progress would otherwise spin through empty passes
        for ever, and a fixed one would run an epoch of no step."""
        replicas = self.world[1]
        share = math.ceil(n / replicas)
        local = int(self.state.local_bsz)
        if self.state.current_index % n == 0 and self.batch_sampler.drop_last \
                and share < local:
            raise RuntimeError(
                f"drop_last=True drops every batch: each of the {replicas} replicas gets "
                f"{share} of the {n} samples per pass, fewer than its local batch of "
                f"{local} (local_bsz_bounds={self.control.local_bsz_bounds!r}); use "
                "drop_last=False, or a lower local_bsz_bounds minimum or batch_size")

    def _configure_pass(self, epoch: int | None) -> bool:
        """Set the samplers up for a pass at the current local batch; returns whether a
        single replica samples steps for the gradient noise in it (only when the batch
        size is adaptive: a fixed batch has no use for the measurement; how a sampled
        step is cut: :meth:`LocalBatchSampler.configure`)."""
        measure = self.autoscaled() and self.world[1] == 1 and self.state.accum_steps == 0
        self.batch_sampler.configure(int(self.state.local_bsz), self.steps if measure else None,
                                     (self.control.local_bsz_bounds or (None, None))[0] or 1,
                                     self.control.max_batch_size)
        self.elastic_sampler.set_epoch(epoch or 0, self.state.current_index)
        return measure

    # -- a pass: the steps ---------------------------------------------------------------
    def _one_pass(self, owner: Any, epoch: int | None, n: int,
                  target: float | None) -> Iterator[Any]:
        """Hand out the batches of one pass from the current position; returns True when
        the pass stopped early for a new local batch size (the loop starts another)."""
        state, book = self.state, self._book
        replicas = self.world[1]
        pass_end = (state.current_index // n + 1) * n
        measure = self._configure_pass(epoch)
        kinds = self.batch_sampler.kinds
        self.micro_index = 0
        self.step_samples = 0
        timer = StepTimer()
        for batch in self._batches(owner):
            now = time.perf_counter()
            opens_pair, size = kinds.popleft()
            # (4: measure) The micro-batch handed out before this one ends now.
            # (A loader becomes the training loader at the first optimizer step on its
            # batches: read each time, from the book itself, not by a call.)
            if timer.started is not None and not timer.skip and book.training is owner:
                _metrics.profile_micro_batch(now - timer.started, self.last_micro,
                                             optimizer_step=self.stepped, world=self.world)
            if self.micro_index == 0 and not self.pair_first:
                if self._agree(now, timer, measure):  # (1: agree)
                    return True
                # (Timed from here: an in-place checkpoint just taken is no step cost.)
                timer.step_began, timer.step_sampled = time.perf_counter(), opens_pair
                self.plan = self._plan(opens_pair, book.training is owner)  # (2: plan)
            # (3: run) The micro-batches of a measured single-replica step are not
            # profiled: the first, without optimizer step and sync, would look cheaper
            # per sample than any other micro-batch and skew the throughput model.
            timer.skip = opens_pair or self.pair_first
            self.pair_first = opens_pair
            self.last_micro = size
            self.step_samples += size
            timer.started = time.perf_counter()
            self.stepped = False
            yield batch
            # The caller finished with the batch: it counts as consumed.
            before = state.current_index
            state.current_index = min(state.current_index + replicas * size, pass_end)
            if book.training is owner:
                count_samples(state.current_index - before, n)
            self.micro_index += 1
            if self.micro_index >= self.plan.micros:
                ended = self._end_step(target)  # (5: decide)
                if ended is not None:
                    return ended
        # The pass is exhausted; samples dropped by drop_last count as passed, or a
        # multi-pass (adaptive) epoch would find the same empty remainder forever.
        state.current_index = pass_end
        return False

    def _agree(self, now: float, timer: StepTimer, measure: bool) -> bool:
        """Between optimizer steps: account the last step's cost, then agree with the
        other replicas on requests (stop and checkpoint requests are honoured only here,
        so that no partially accumulated gradient is lost) and on the batch size.
        Returns True if a new batch size was agreed (the pass must restart)."""
        state = self.state
        if measure and timer.step_began is not None:
            self.batch_sampler.schedule.note_step_cost(
                now - timer.step_began, self.last_step_samples, timer.step_sampled)
        choice = boundary.agree(self.world[1])
        if choice is None or choice == (state.local_bsz, state.accum_steps):
            return False
        # Replica 0's new batch size reached every replica with the last step's side
        # values. This batch is not consumed yet (current_index): the next pass loads it
        # again at the new size.
        state.local_bsz, state.accum_steps = choice
        self._log_batch_size()
        return True

    def _plan(self, opens_pair: bool, training: bool) -> StepPlan:
        """The plan of the optimizer step starting now (see :class:`StepPlan`)."""
        replicas = self.world[1]
        index = self.sync_steps
        self.sync_steps += 1
        accum_steps = int(self.state.accum_steps)
        micros = 2 if opens_pair else accum_steps + 1
        if replicas > 1:
            # (The same schedule on every replica.)
            noise = NoiseMode.REPLICAS if replicas_measure(index) else NoiseMode.NONE
        elif micros > 1 and training:
            noise = NoiseMode.MICRO_BATCHES if not opens_pair else \
                NoiseMode.PAIRS if self.batch_sampler.pairs else NoiseMode.HALVES
        else:
            noise = NoiseMode.NONE
        return StepPlan(index + 1, micros, int(self.state.local_bsz), noise)

    def _end_step(self, target: float | None) -> bool | None:
        """The last micro-batch of an optimizer step was consumed: count the progress and
        take the batch size decisions that are due. Returns None to go on, False when the
        loop's progress target is reached, True when a new local batch needs a new pass."""
        self.micro_index = 0
        self.pair_first = False
        self.last_step_samples = self.step_samples
        self.step_samples = 0
        if not self.autoscaled() or target is None:
            return None
        _, replicas, rank = self.world
        _metrics.advance_progress_without_model(
            replicas * self.last_step_samples / self.control.init_batch_size)
        if _metrics.metrics().progress >= target:
            return False
        self.steps += 1
        if self.steps % DECIDE_EVERY_STEPS != 0:
            return None
        if replicas > 1 and self.stepped:
            # Replica 0 decides; its choice travels with the next step's side values
            # (AdaptiveDataParallel) to the boundary after it, where every replica
            # applies it.
            if rank == 0 and self._decision_due():
                self.proposal = self.choose(
                    (self.state.local_bsz, self.state.accum_steps), False)
            return None
        if (replicas > 1 or self._decision_due()) and self.decide():
            return True  # new local batch: new iterator
        return None

    # -- the batch size decision ---------------------------------------------------------
    def _decision_due(self) -> bool:
        """Whether a goodput decision could change anything now (the controller's
        cadence, from the noise estimate and the throughput fits). Local to this replica."""
        m = _metrics.metrics()
        grad = m.grad_params
        ratio = grad.var / grad.sqr if grad is not None and grad.sqr > 0 else 0.0
        return self.control.decision_due(ratio, m.fits)

    def decide(self, initial: bool = False) -> bool:
        """Choose (local batch, accumulation steps); returns True if they changed.

        Replica 0 decides from its goodput model and broadcasts, so that all replicas
        always agree (outside the steps of AdaptiveDataParallel, whose side values carry
        the choice instead: see :meth:`_end_step`).
        """
        state, control = self.state, self.control
        current = (state.local_bsz, state.accum_steps)
        if control.max_batch_size is None:
            choice = control.initial_choice()
        else:
            choice = current if current[0] is not None else control.initial_choice()
            if self.world[2] == 0:
                choice = self.choose(choice, initial)
            if self.world[1] > 1:
                choice = collective.broadcast(choice)
        state.local_bsz, state.accum_steps = int(choice[0]), int(choice[1])
        changed = current != (state.local_bsz, state.accum_steps)
        if changed and not initial:
            self._log_batch_size()
        return changed

    def choose(self, current: tuple[int, int], initial: bool) -> tuple[int, int]:
        """Replica 0's choice from the goodput model (refitted first if due)."""
        _metrics.maybe_refit()
        return self.control.choose(_metrics.goodput_fn(), current, initial)

    def note_optimizer_step(self) -> None:
        """AdaptiveDataParallel stepped the optimizer on the micro-batch handed out last
        (its time is then profiled as an optimizer step)."""
        self.stepped = True

    def take_proposal(self) -> tuple[int, int] | None:
        """Replica 0's pending choice for the replicas to agree on, or ``None``; taking
        it clears it."""
        proposal, self.proposal = self.proposal, None
        return proposal

    def _log_batch_size(self) -> None:
        LOG.info("batch size now %d (local %d x %d micro-batches x %d replicas)",
                 self.batch_size, int(self.state.local_bsz), int(self.state.accum_steps) + 1,
                 self.world[1])
