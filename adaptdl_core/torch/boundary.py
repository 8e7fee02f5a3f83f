"""The batch boundary: where the replicas agree on stop and checkpoint requests and on
the batch size, and act on them together.

Every batch boundary between optimizer steps of every adaptive loader is where the
replicas agree on a pending stop request (SIGINT/SIGTERM or
:func:`adaptdl_core.torch.request_checkpoint_and_exit`), checkpoint, and exit, or on a
pending in-place checkpoint request (:func:`adaptdl_core.torch.request_checkpoint`),
checkpoint, and go on; and where replica 0's new batch size choice takes effect. One
mechanism carries the agreement: while AdaptiveDataParallel steps on the loader's batches
it rides on the model's side values (:func:`post_side_values`, a small all-reduce every
few optimizer steps); otherwise (a validation loop, plain DDP) the requests go through the
job's store every ``STORE_STOP_CHECK_EVERY`` boundaries. This module also holds the job's
loop bookkeeping (:class:`Loops`, in the job context).

**Nothing stops between an epoch's training and its end.** Inside
``remaining_epochs_until``, once the training loader's loop of an epoch has ended (its last
boundary included), the requests the replicas agree on wait for the next boundary of a
training loop, the next epoch's first: code after the training loop (a validation loop, a
report of the last loss) always runs to the epoch's end with the values the loop set, and
a resumption starts the next epoch instead of an epoch whose training is spent. A stop
then waits at most for the rest of that epoch's code; the last epoch's final checkpoint
settles in-place requests still waiting (see :func:`~adaptdl_core.torch.epoch.remaining_epochs_until`).
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import time
from typing import Any

from adaptdl_core import checkpoint, collective, context, env
from adaptdl_core.torch import _interrupt
from adaptdl_core.torch.epoch import current_epoch

__all__ = ["Loops", "loops", "current_dataloader", "training_loader", "agree",
           "post_side_values", "side_values_owed", "training_ended", "STORE_STOP_CHECK_EVERY"]

LOG = logging.getLogger(__name__)

# Without AdaptiveDataParallel's side values, agree on a stop request through the store
# every this many batch boundaries (a store round trip costs a few hundred microseconds
# to a millisecond of Python: benchmarks/step_overhead.py's ddp+adl arm shows the sum).
STORE_STOP_CHECK_EVERY = 4


class Loops:
    """The job's bookkeeping of data loader loops (held by the job context, see
    :func:`loops`): runtime-internal, shared by the loader and the model wrapper."""

    def __init__(self, requests: context.StopRequests) -> None:
        # This replica's stop and checkpoint requests (the job context's), read at every
        # boundary of one replica.
        self.requests = requests
        # epoch -> number of adaptive loader loops entered so far in this run. A loop's
        # position identifies it when the program replays an epoch after a restart.
        self.position: collections.Counter = collections.Counter()
        self.current: Any = None  # the AdaptiveDataLoader being iterated
        # The owner of the loop being iterated (the adaptive loader, or an ElasticLoop).
        self.active: object | None = None
        # Future of the last all-reduce of the replicas' requests through the store.
        self.pending_requests: "concurrent.futures.Future | None" = None
        self.store_boundaries = 0  # boundaries that used the store path (its schedule)
        self.training: Any = None  # the AdaptiveDataLoader optimizer steps follow
        # The step machinery (a StepCycle) of the loader being iterated, which
        # AdaptiveDataParallel reads at every step.
        self.cycle: Any = None
        # Set by AdaptiveDataParallel after every optimizer step with several replicas
        # (from its side values, summed every few steps; see _gradient_probe): (the
        # requests of any replica, replica 0's batch size choice or None).
        self.side_channel: tuple[_interrupt.Requests, tuple[int, int] | None] | None = None
        # The epoch (as its loop-position key) whose training loop has ended, and the
        # requests agreed since then, which wait for the next training boundary.
        self.trained_epoch: str | None = None
        self.deferred = _interrupt.Requests()

    def settled_by_final_checkpoint(self) -> None:
        """The epoch loop's final checkpoint settles the in-place requests that waited
        for the next epoch (none follows)."""
        self.deferred = self.deferred._replace(save=False)

    def waiting_for_next_epoch(self) -> bool:
        """Whether requests agreed now wait: the current epoch's training loop has ended
        and no loop of the training loader is running."""
        epoch = current_epoch()
        return epoch is not None and self.trained_epoch == str(epoch) and \
            (self.training is None or self.active is not self.training)


def loops() -> Loops:
    """The job's :class:`Loops` (created in the job context on first use)."""
    ctx = context.current()
    if ctx.loops is None:
        ctx.loops = Loops(ctx.requests)
    return ctx.loops


def current_dataloader() -> Any:
    """The :class:`AdaptiveDataLoader` being iterated right now, or ``None``."""
    return loops().current


def training_loader() -> Any:
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
    if env.checkpoint_path() is None:
        LOG.warning("stopping without a checkpoint (no ADAPTDL_CHECKPOINT_PATH is set); "
                    "exiting with status %d", _interrupt.EXIT_CODE)
    else:
        # (Replica 0's save logged the checkpoint's path once, at INFO.)
        LOG.info("checkpointed at epoch %s; exiting with status %d", current_epoch(),
                 _interrupt.EXIT_CODE)
    raise _interrupt.CheckpointExit(ckpt_dir)


def _checkpoint_in_place(replicas: int) -> None:
    requests = _interrupt.take_checkpoint_requests()
    start = time.perf_counter()
    _save_for(requests)
    if replicas > 1:
        # Replica 0 writes while the others would run ahead into the next step and wait
        # there for it, which would inflate that step's measured time: resume together.
        collective.broadcast(None)
    loader = loops().current
    LOG.info("in-place checkpoint at epoch %s, position %s, in %.3f s (%d request(s) on "
             "this replica); training goes on",
             current_epoch(), loader.current_index if loader is not None else None,
             time.perf_counter() - start, len(requests))


def training_ended(epoch: int | None) -> None:
    """The training loader's loop of ``epoch`` has ended (or was skipped as ended before
    a restart): until the next epoch, agreed requests wait (see the module docstring)."""
    if epoch is not None:
        loops().trained_epoch = str(epoch)


def _honour(agreed: _interrupt.Requests, replicas: int, defer: bool = False) -> None:
    """Act on the requests the replicas agreed on at this boundary (the same on all), or,
    after the epoch's training loop (``defer`` or the book says so), keep them for the
    next training boundary."""
    book = loops()
    if defer or book.waiting_for_next_epoch():
        book.deferred = book.deferred | agreed
        return
    if book.deferred.exit or book.deferred.save:
        # (Merged into the next agreement honoured, never honoured alone: an agreement
        # started through the store while it waited may carry the same request.)
        agreed, book.deferred = agreed | book.deferred, _interrupt.Requests()
    if agreed.exit:
        _checkpoint_and_exit()
    elif agreed.save:
        _checkpoint_in_place(replicas)


def agree(replicas: int, *, defer: bool = False) -> tuple[int, int] | None:
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

    ``defer``: this is the training loop's last boundary: what is agreed here waits for
    the next epoch's first (as at every boundary after an epoch's training loop).
    """
    book = loops()
    side, book.side_channel = book.side_channel, None
    if replicas > 1 and side is not None:
        # (Agreed already, through the model's side values: no collective of its own.)
        agreed, choice = side
        if book.pending_requests is not None:  # started at an earlier store-path boundary
            agreed = agreed | book.pending_requests.result()
            book.pending_requests = None
        _honour(agreed, replicas, defer)
        return choice
    if replicas == 1 or not collective.is_initialized():
        # (Two flag reads, no allocation: this runs at every boundary of one replica.)
        requests = book.requests
        if requests.exit_requested() or requests.has_pending():
            _honour(_interrupt.local_requests(), 1, defer)
        return None
    book.store_boundaries += 1
    if book.store_boundaries % STORE_STOP_CHECK_EVERY == 1:
        if book.pending_requests is not None:
            agreed, book.pending_requests = book.pending_requests.result(), None
            _honour(agreed, replicas, defer)
        book.pending_requests = collective.allreduce_async(_interrupt.local_requests(),
                                                            _interrupt.Requests.__or__)
    return None


def side_values_owed() -> tuple[_interrupt.Requests, tuple[int, int] | None]:
    """What the model's side values already brought for the next boundary (requests,
    batch choice), or nothing agreed: a boundary not reached since an earlier step (the
    loop left between steps) still owes its requests."""
    return loops().side_channel or (_interrupt.Requests(), None)


def post_side_values(agreed: _interrupt.Requests, choice: tuple[int, int] | None) -> None:
    """Called by AdaptiveDataParallel after every optimizer step with several replicas:
    the requests of any replica and replica 0's batch size choice (or ``None``), agreed
    through the side values, for the next boundary to act on."""
    loops().side_channel = (agreed, choice)
