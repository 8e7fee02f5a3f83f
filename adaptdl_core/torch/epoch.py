"""The top-level loop over epochs, consistent with checkpoint-restarts.

A training program is a loop over epochs, each holding loops over data loaders (for
example training then validation). A job may be checkpointed at any batch boundary and
restarted, possibly on a different number of replicas; after a restart the program runs
again from the top, so **code may run more than once in two places: just before the epoch
loop and just before each data loader loop.** Keep those places idempotent::

    for epoch in remaining_epochs_until(30):
        lr_scheduler.step()   # WRONG: runs again after a restart inside this epoch
        for batch in train_loader:
            ...
        for batch in valid_loader:
            ...
        lr_scheduler.step()   # right: nothing can restart between here and the epoch end

A finished epoch is never repeated, and a data loader loop that finished before the
restart is skipped when the program replays the epoch.
"""

from __future__ import annotations

import logging
from typing import IO, Iterator

from adaptdl_core import checkpoint, context

__all__ = ["remaining_epochs_until", "current_epoch", "finished_epochs"]

LOG = logging.getLogger(__name__)


class _EpochState(checkpoint.State):
    def __init__(self) -> None:
        super().__init__("adaptdl-epoch")
        self.finished_epochs = 0
        self.current_epoch: int | None = None

    def save(self, fileobj: IO[bytes]) -> None:
        checkpoint.dump_json({"finished_epochs": self.finished_epochs}, fileobj)

    def load(self, fileobj: IO[bytes]) -> None:
        self.finished_epochs = int(checkpoint.load_json(fileobj)["finished_epochs"])


def _state() -> _EpochState:
    """The job's epoch counter (held by the job context), created and restored on first
    use."""
    ctx = context.current()
    if ctx.epoch_state is None:
        ctx.epoch_state = _EpochState()
        checkpoint.load_state(ctx.epoch_state)
    return ctx.epoch_state


def target_epochs() -> int | None:
    """The ``epoch`` bound of the latest :func:`remaining_epochs_until` call in this
    process (the job's planned number of epochs), or ``None`` before any call."""
    return context.current().epoch_target


def remaining_epochs_until(epoch: int) -> Iterator[int]:
    """Iterate over the epochs not finished yet, up to ``epoch`` (exclusive).

    ::

        for epoch in remaining_epochs_until(30):   # 0..29, or from the restart epoch
            ...
        for epoch in remaining_epochs_until(60):   # then 30..59
            ...

    After a restart in the middle of an epoch, the loop starts again at that epoch; all
    earlier epochs are skipped. Leaving the loop body (``break``, an exception) counts the
    epoch as finished.

    Arguments:
        epoch: the epoch to stop before.

    Raises:
        ValueError: if ``epoch`` is not a non-negative integer.
        RuntimeError: if another epoch loop is still running (loops cannot nest).
    """
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
        raise ValueError(f"remaining_epochs_until(epoch={epoch!r}): epoch must be a "
                         "non-negative integer")
    state = _state()
    if state.current_epoch is not None:
        raise RuntimeError("overlapping epoch loops: remaining_epochs_until() was called "
                           f"inside epoch {state.current_epoch} of another epoch loop")
    context.current().epoch_target = epoch
    return _epochs(state, epoch)


def _epochs(state: _EpochState, end: int) -> Iterator[int]:
    if state.finished_epochs < end:
        LOG.info("starting at epoch %d", state.finished_epochs)
    while state.finished_epochs < end:
        state.current_epoch = state.finished_epochs
        try:
            yield state.current_epoch
        finally:
            # Runs on normal continuation, on break (GeneratorExit) and on errors alike.
            state.finished_epochs += 1
            state.current_epoch = None


def current_epoch() -> int | None:
    """The epoch being run inside :func:`remaining_epochs_until`, or ``None`` outside it."""
    return _state().current_epoch


def finished_epochs() -> int:
    """How many epochs have finished (across restarts). Equals :func:`current_epoch` inside
    the epoch loop."""
    return _state().finished_epochs
