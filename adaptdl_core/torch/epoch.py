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
restart is skipped when the program replays the epoch. A stop or checkpoint request that
comes after an epoch's training loop (during a validation loop, a report) waits for the
next epoch, so the code after the training loop always runs to the epoch's end with the
values the loop set (the last ``loss`` of the quickstart's report), and a restart never
replays an epoch whose training is spent.

**A finished job.** When an epoch loop runs to its bound, the job saves one more
checkpoint (if ``ADAPTDL_CHECKPOINT_PATH`` is set), the end of training, marked finished
(its manifest's ``summary`` says ``"finished": true`` and the number of epochs). Running
the same program again restores that state, and ``remaining_epochs_until`` with the same
bound yields no epoch and logs a warning ``job already finished (N epochs); nothing to
do``: the code after the loop (a final evaluation, saving the model) runs again on the
final weights, exactly as at the end of the first run, so keep it idempotent. A larger
bound trains on from the finished epochs.

**What an epoch consumed.** With a fixed batch size an epoch is one pass over the
training data. With ``autoscale_batch_size`` an epoch ends by statistical progress (as
much as one pass at the initial batch size would make), so larger batches consume more
samples than the dataset holds and an epoch may take more or less than one pass.
:func:`data_progress` tells how many training samples were consumed in this epoch and in
total, and how many passes over the data that is.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import IO, Any, Iterator

from adaptdl_core import checkpoint, context, env, validation
from adaptdl_core.torch import _interrupt

__all__ = ["remaining_epochs_until", "current_epoch", "finished_epochs", "job_finished",
           "DataProgress", "data_progress", "count_samples", "EPOCH_STATE_NAME"]

LOG = logging.getLogger(__name__)


# The name of the epoch counter's State: its file in every checkpoint, and its key in the
# manifest's summary (which the launcher reads without importing torch).
EPOCH_STATE_NAME = "adaptdl-epoch"


class _EpochState(checkpoint.State):
    def __init__(self) -> None:
        super().__init__(EPOCH_STATE_NAME)
        self.finished_epochs = 0
        self.current_epoch: int | None = None
        # The latest epoch loop ran to its bound (the end of training).
        self.finished = False
        # Training samples consumed (all replicas), in total and in epoch samples_epoch;
        # passes over the data: each sample counts 1 / the length of its dataset.
        self.samples_seen = 0
        self.epoch_samples = 0
        self.samples_epoch: int | None = None
        self.data_passes = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"finished_epochs": self.finished_epochs, "finished": self.finished,
                "samples_seen": self.samples_seen, "epoch_samples": self.epoch_samples,
                "samples_epoch": self.samples_epoch, "data_passes": self.data_passes}

    def save(self, fileobj: IO[bytes]) -> None:
        checkpoint.dump_json(self.to_dict(), fileobj)

    def load(self, fileobj: IO[bytes]) -> None:
        data = checkpoint.load_json(fileobj)
        self.finished_epochs = int(data["finished_epochs"])
        # (.get: checkpoints from before these were recorded hold only finished_epochs.)
        self.finished = bool(data.get("finished", False))
        self.samples_seen = int(data.get("samples_seen", 0))
        self.epoch_samples = int(data.get("epoch_samples", 0))
        epoch = data.get("samples_epoch")
        self.samples_epoch = None if epoch is None else int(epoch)
        self.data_passes = float(data.get("data_passes", 0.0))

    def summary(self) -> dict[str, Any]:
        """The manifest's record of this state: whether training finished, and where."""
        return {"finished_epochs": self.finished_epochs, "finished": self.finished}


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


def remaining_epochs_until(epoch: int, *, final_checkpoint: bool = True) -> Iterator[int]:
    """Iterate over the epochs not finished yet, up to ``epoch`` (exclusive).

    ::

        for epoch in remaining_epochs_until(30):   # 0..29, or from the restart epoch
            ...
        for epoch in remaining_epochs_until(60):   # then 30..59
            ...

    After a restart in the middle of an epoch, the loop starts again at that epoch; all
    earlier epochs are skipped. Leaving the loop body (``break``, an exception) counts the
    epoch as finished.

    When the loop runs to ``epoch`` the job is finished: every replica takes part in one
    more checkpoint, the end of training, marked finished (see the module docstring). If
    the job had already finished ``epoch`` epochs, the loop yields nothing and logs a
    warning ``job already finished (N epochs); nothing to do``.

    Arguments:
        epoch: the epoch to stop before.
        final_checkpoint: save that last checkpoint (default). Pass False only when the
            program saves its final state itself; the newest checkpoint is then not the
            end of training, and a run from it trains the rest again.

    Raises:
        ValueError: if ``epoch`` is not a non-negative integer, or ``final_checkpoint``
            not a bool.
        RuntimeError: if another epoch loop is still running (loops cannot nest).
    """
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
        raise ValueError(f"remaining_epochs_until(epoch={epoch!r}): epoch must be a "
                         "non-negative integer")
    if not isinstance(final_checkpoint, bool):
        raise ValueError(f"remaining_epochs_until(final_checkpoint={final_checkpoint!r}): "
                         "pass True (save the end of training) or False")
    state = _state()
    if state.current_epoch is not None:
        raise RuntimeError("overlapping epoch loops: remaining_epochs_until() was called "
                           f"inside epoch {state.current_epoch} of another epoch loop")
    context.current().epoch_target = epoch
    return _epochs(state, epoch, final_checkpoint)


def _epochs(state: _EpochState, end: int, final_checkpoint: bool) -> Iterator[int]:
    if state.finished_epochs >= end:
        if state.finished:
            LOG.warning("job already finished (%d epochs); nothing to do: "
                        "remaining_epochs_until(%d) runs no epoch (the code after the loop "
                        "runs on the final state)", state.finished_epochs, end)
        return
    if state.finished:
        LOG.info("the job had finished %d epochs; training on until epoch %d",
                 state.finished_epochs, end)
    else:
        LOG.info("starting at epoch %d", state.finished_epochs)
    state.finished = False
    while state.finished_epochs < end:
        state.current_epoch = state.finished_epochs
        if state.samples_epoch != state.current_epoch:
            # A new epoch (a replayed one keeps what it consumed before the restart).
            state.samples_epoch, state.epoch_samples = state.current_epoch, 0
        try:
            yield state.current_epoch
        finally:
            # Runs on normal continuation, on break (GeneratorExit) and on errors alike.
            state.finished_epochs += 1
            state.current_epoch = None
    # (Not reached on break or an error: those close the generator at its yield.)
    _finish(state, final_checkpoint)


def _finish(state: _EpochState, save: bool) -> None:
    """The epoch loop ran to its bound: checkpoint the end of training (if ``save``),
    marked finished, so that the newest checkpoint is the final state (every replica
    takes part)."""
    state.finished = True
    if not save:
        LOG.info("training finished (%d epochs); final_checkpoint=False: not saved",
                 state.finished_epochs)
        return
    if env.checkpoint_path() is None:
        LOG.info("training finished (%d epochs); no checkpoint path, nothing saved",
                 state.finished_epochs)
        return
    # In-place requests that waited for the epoch's end (see boundary) are settled by
    # this checkpoint: no boundary follows in this loop. (The loop bookkeeping is reached
    # through the job context: boundary imports this module.)
    requests = _interrupt.take_checkpoint_requests()
    book = context.current().loops
    if book is not None:
        book.settled_by_final_checkpoint()
    try:
        path = checkpoint.save_all_states()  # (logs the checkpoint's path, on replica 0)
    except BaseException:
        _interrupt.resolve_checkpoint_requests(requests, False)
        raise
    _interrupt.resolve_checkpoint_requests(requests, True, path)
    LOG.info("training finished (%d epochs); the newest checkpoint is its final state",
             state.finished_epochs)


def current_epoch() -> int | None:
    """The epoch being run inside :func:`remaining_epochs_until`, or ``None`` outside it."""
    return _state().current_epoch


def finished_epochs() -> int:
    """How many epochs have finished (across restarts). Equals :func:`current_epoch` inside
    the epoch loop."""
    return _state().finished_epochs


def job_finished() -> bool:
    """True once an epoch loop ran to its bound (in this run or, restored from the final
    checkpoint, in an earlier one) and no later loop has started training again."""
    return _state().finished


@dataclasses.dataclass(frozen=True)
class DataProgress:
    """What the training consumed, counted over all replicas and across restarts.

    Attributes:
        samples_seen: training samples consumed in total. A sample counts when the
            training loop has finished with its batch; the few samples repeated to pad the
            last batch of a pass among replicas are not counted again, and those dropped
            by ``drop_last`` are not counted.
        epoch_samples: of these, the samples consumed in the current epoch (the latest
            one, between epochs; outside ``remaining_epochs_until``, since the first loop).
        data_passes: passes over the training data (``samples_seen / len(dataset)``,
            fractional).
    """

    samples_seen: int
    epoch_samples: int
    data_passes: float


def data_progress() -> DataProgress:
    """Samples consumed by the training loader (in total and this epoch) and passes over
    its data, as a :class:`DataProgress`.

    The training loader is the :class:`AdaptiveDataLoader` that called
    ``autoscale_batch_size`` or whose batches :class:`AdaptiveDataParallel` steps on;
    without one, every count is 0. With a fixed batch size one epoch is one pass; with
    ``autoscale_batch_size`` an epoch ends by statistical progress, and these counts show
    what it consumed.
    """
    state = _state()
    return DataProgress(state.samples_seen, state.epoch_samples, state.data_passes)


def count_samples(samples: int, dataset_len: int) -> None:
    """Count ``samples`` training samples (all replicas) of a dataset of ``dataset_len``
    consumed (called by the training loader as its position advances).

    Raises:
        ValueError: if ``samples < 0`` or ``dataset_len < 1``.
    """
    if not (samples >= 0 and dataset_len >= 1):  # (inline: this runs at every batch)
        validation.integer("samples", samples, low=0)
        validation.integer("dataset_len", dataset_len, low=1)
    state = _state()
    if state.samples_epoch != state.current_epoch:
        state.samples_epoch, state.epoch_samples = state.current_epoch, 0
    state.samples_seen += samples
    state.epoch_samples += samples
    state.data_passes += samples / dataset_len
