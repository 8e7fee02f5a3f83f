"""The plan of one optimizer step, decided by the data loader and read by the model.

At every optimizer-step boundary the :class:`~adaptdl_core.torch.AdaptiveDataLoader`
decides how the coming step runs: how many micro-batches it hands out, of what local
size, and how the gradient noise is measured in it. It publishes the decision as a
:class:`StepPlan` (``loader.step_plan``); AdaptiveDataParallel and its gradient probe act
on the plan only, never on the loader's bookkeeping.
"""

from __future__ import annotations

import enum

__all__ = ["NoiseMode", "StepPlan"]


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
    """What one optimizer step does (read-only by convention; one per step, so kept
    cheap: slots, no validation beyond the arguments below).

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
        self.index = index
        self.micros = micros
        self.local_bsz = local_bsz
        self.noise = noise

    @property
    def measures_replicas(self) -> bool:
        """True if the replicas' local gradient norms are measured in this step."""
        return self.noise is NoiseMode.REPLICAS

    @property
    def measures_first_micro_batch(self) -> bool:
        """True if one replica measures the noise from the first micro-batch's gradient
        against the step's average (accumulation, halves or pairs)."""
        return self.noise is not NoiseMode.NONE and self.noise is not NoiseMode.REPLICAS

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StepPlan):
            return NotImplemented
        return (self.index, self.micros, self.local_bsz, self.noise) == \
            (other.index, other.micros, other.local_bsz, other.noise)

    def __hash__(self) -> int:
        return hash((self.index, self.micros, self.local_bsz, self.noise))

    def __repr__(self) -> str:
        return (f"StepPlan(index={self.index}, micros={self.micros}, "
                f"local_bsz={self.local_bsz}, noise={self.noise.value})")
