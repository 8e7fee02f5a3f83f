"""The steps of an adaptive data loader's loop: the half of AdaptiveDataLoader that
plans and accounts each optimizer step.

:class:`LoopSteps` is a mixin of :class:`~adaptdl_core.torch.data.AdaptiveDataLoader`
(it works on the loader's own attributes; it is split off to keep each file readable).
A loop of the loader (its ``_iterate`` method) runs passes over the data; in a
pass every batch boundary between optimizer steps goes through :meth:`_step_boundary`
(requests and batch size agreed with the other replicas), then :meth:`_plan_step` makes
the coming step's :class:`~adaptdl_core.torch.step_plan.StepPlan`, and when the step's
last micro-batch was consumed :meth:`_end_step` counts the progress and takes the batch
size decisions that are due.
"""

from __future__ import annotations

import logging
from typing import Any

from adaptdl_core.torch import _metrics, boundary
from adaptdl_core.torch.batch_control import DECIDE_EVERY_STEPS, replicas_measure
from adaptdl_core.torch.step_plan import NoiseMode, StepPlan

__all__ = ["LoopSteps", "StepTimer"]

LOG = logging.getLogger(__name__)


class LoopSteps:
    """Per-step methods of the adaptive data loader (see the module docstring)."""

    # (Attributes of the loader these methods use; set in AdaptiveDataLoader.__init__.)
    _state: Any
    _world: tuple[int, int, int]

    def _plan_step(self, opens_pair: bool, accum_steps: int, local_bsz: int) -> StepPlan:
        """The plan of the optimizer step starting now (see :class:`StepPlan`)."""
        replicas = self._world[1]
        index = self._sync_steps
        self._sync_steps += 1
        micros = 2 if opens_pair else accum_steps + 1
        if replicas > 1:
            # (The same schedule on every replica.)
            noise = NoiseMode.REPLICAS if replicas_measure(index) else NoiseMode.NONE
        elif micros > 1 and self.training:
            noise = NoiseMode.MICRO_BATCHES if not opens_pair else \
                NoiseMode.PAIRS if self._local_batch_sampler.pairs else NoiseMode.HALVES
        else:
            noise = NoiseMode.NONE
        return StepPlan(index + 1, micros, local_bsz, noise)

    def _autoscaled(self) -> bool:
        """An autoscaled training loader: its loops end by statistical progress. (Read
        each time: a loader becomes the training loader at the first optimizer step on
        its batches.)"""
        return self._max_batch_size is not None and self.training

    def _progress_target(self, epoch: int | None, n: int) -> float:
        """The statistical progress at which this loop ends: an epoch lasts as long as
        one pass at the initial batch size would, in progress (larger batches need more
        samples for the same progress). Outside remaining_epochs_until every loop is an
        epoch of its own."""
        state = self._state
        if epoch is not None:
            return (epoch + 1) * n / self._target_batch_size
        if state.loop_start_progress is None:
            state.loop_start_progress = _metrics.metrics().progress
        return state.loop_start_progress + n / self._target_batch_size

    def _loop_done(self, target: float | None, n: int) -> bool:
        if self._autoscaled():
            if target is None:  # (became the training loader during this loop)
                return self._state.current_index >= n
            return _metrics.metrics().progress >= target
        return self._state.current_index >= n

    def _configure_pass(self, epoch: int | None) -> bool:
        """Set the samplers up for a pass at the current local batch; returns whether a
        single replica samples steps for the gradient noise in it.

        A single replica with one micro-batch per step gives sampled steps two
        micro-batches (only when the batch size is adaptive: a fixed batch has no use for
        the measurement): two halves within the micro-batch bounds, else two whole
        batches within max_batch_size."""
        batch_sampler = self._local_batch_sampler
        local_bsz = self.current_local_bsz
        if local_bsz != batch_sampler.local_bsz:  # (step costs are per local batch)
            batch_sampler.local_bsz = local_bsz
            batch_sampler.schedule.forget_costs()
        measure = self._autoscaled() and self._world[1] == 1 and self.accumulation_steps == 0
        lo = (self._local_bsz_bounds or (None, None))[0] or 1
        halves = local_bsz >= 2 * lo
        batch_sampler.pairs = pairs = measure and not halves \
            and 2 * local_bsz <= self._max_batch_size
        batch_sampler.measure_from = self._steps if measure and (halves or pairs) else None
        self._elastic_sampler.set_epoch(epoch or 0, self._state.current_index)
        return measure

    def _profile_last_micro_batch(self, now: float, timer: StepTimer) -> None:
        """Profile the micro-batch handed out before this one (its time ends now)."""
        if timer.started is not None and self.training and not timer.skip:
            _metrics.profile_micro_batch(now - timer.started, self._last_micro,
                                         optimizer_step=self._stepped, world=self._world)

    def _step_boundary(self, now: float, timer: StepTimer, measure: bool) -> bool:
        """Between optimizer steps: account the last step's cost, then agree with the
        other replicas on requests (stop and checkpoint requests are honoured only here,
        so that no partially accumulated gradient is lost) and on the batch size.
        Returns True if a new batch size was agreed (the pass must restart)."""
        state = self._state
        if measure and timer.step_began is not None:
            self._local_batch_sampler.schedule.note_step_cost(
                now - timer.step_began, self._last_step_samples, timer.step_sampled)
        choice = boundary.agree(self._world[1])
        if choice is None or choice == (state.local_bsz, state.accum_steps):
            return False
        # Replica 0's new batch size reached every replica with the last step's side
        # values. This batch is not consumed yet (current_index): the next pass loads it
        # again at the new size.
        state.local_bsz, state.accum_steps = choice
        LOG.info("batch size now %d (local %d x %d micro-batches x %d replicas)",
                 self.current_batch_size, self.current_local_bsz,
                 self.accumulation_steps + 1, self._world[1])
        return True

    def _end_step(self, target: float | None) -> bool | None:
        """The last micro-batch of an optimizer step was consumed: count the progress and
        take the batch size decisions that are due. Returns None to go on, False when the
        loop's progress target is reached, True when a new local batch needs a new pass."""
        self._micro_in_step = 0
        self._pair_first = False
        self._last_step_samples = self._step_samples
        self._step_samples = 0
        if not self._autoscaled() or target is None:
            return None
        _, replicas, rank = self._world
        _metrics.advance_progress_without_model(
            replicas * self._last_step_samples / self._target_batch_size)
        if _metrics.metrics().progress >= target:
            return False
        self._steps += 1
        if self._steps % DECIDE_EVERY_STEPS != 0:
            return None
        if replicas > 1 and self._stepped:
            # Replica 0 decides; its choice travels with the next step's side values
            # (AdaptiveDataParallel) to the boundary after it, where every replica
            # applies it.
            if rank == 0 and self._decision_due():
                self._proposal = self._goodput_choice(
                    (self._state.local_bsz, self._state.accum_steps), False)
            return None
        if (replicas > 1 or self._decision_due()) and self._decide_batch_size():
            return True  # new local batch: new iterator
        return None


class StepTimer:
    """Timing of the micro-batch and the optimizer step in flight (one per pass)."""

    __slots__ = ("started", "skip", "step_began", "step_sampled")

    def __init__(self) -> None:
        self.started: float | None = None      # the last micro-batch was handed out
        self.skip = False                      # ...and is not profiled
        self.step_began: float | None = None   # the current optimizer step began
        self.step_sampled = False              # ...and samples the noise
