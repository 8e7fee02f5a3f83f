"""Restart-consistent loops, for the adaptive data loader and for custom iterables.

Whatever is iterated inside ``remaining_epochs_until``, a restart replays the epoch from
its top, so a loop must know three things: whether it already finished before the
restart (then it is skipped), where it stopped (then it resumes there), and where the
replicas may stop or checkpoint together (its boundaries). :class:`LoopState` keeps the
first two in a checkpointed State; :func:`loop_scope` applies them around a loop body
(:func:`run_loop` wraps a body in it).
:class:`AdaptiveDataLoader` is built on both, and so is :class:`ElasticLoop`, which makes
any iterable elastic::

    stream = ElasticLoop("tokens")          # create it where the model is created
    for epoch in remaining_epochs_until(3):
        for item in stream.iterate(lambda start: read_items(epoch, start)):
            train_on(item)                  # checkpoint and stop requests are honoured
                                            # between items; restarts resume at the item

With several replicas each replica iterates its own share; every replica must run the
same number of items per loop (the boundaries are collective).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
from typing import IO, Any, Callable, Iterable, Iterator, NamedTuple

from adaptdl_core import checkpoint, context
from adaptdl_core.torch import _interrupt, boundary
from adaptdl_core.torch.epoch import current_epoch

__all__ = ["LoopState", "LoopEntry", "loop_scope", "run_loop", "ElasticLoop"]

LOG = logging.getLogger(__name__)


class LoopState(checkpoint.State):
    """Position of one loop owner: where its current loop is, and which loops it finished
    (a JSON State; the adaptive data loader adds its batch size to it)."""

    def __init__(self, name: str):
        super().__init__(name)
        self.current_index = 0
        # epoch -> the loop position (see boundary.Loops) this owner last completed in it.
        self.last_position: dict[str, int] = {}
        self.local_bsz: int | None = None
        self.accum_steps = 0
        # Outside remaining_epochs_until: the statistical progress when the current loop
        # began (an autoscaled loop then lasts one epoch's progress from there).
        self.loop_start_progress: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """The position as the JSON-ready dict :meth:`save` writes (a subclass that saves
        more extends it)."""
        return {"current_index": self.current_index, "last_position": self.last_position,
                "local_bsz": self.local_bsz, "accum_steps": self.accum_steps,
                "loop_start_progress": self.loop_start_progress}

    def save(self, fileobj: IO[bytes]) -> None:
        """Write the position (:meth:`to_dict`) as JSON."""
        checkpoint.dump_json(self.to_dict(), fileobj)

    def load(self, fileobj: IO[bytes]) -> None:
        """Read the position written by :meth:`save` (see :meth:`from_dict`)."""
        self.from_dict(checkpoint.load_json(fileobj))

    def from_dict(self, data: dict[str, Any]) -> None:
        """Take the position from the dict :meth:`to_dict` made (a subclass that saves
        more, or checks what it reads, extends it)."""
        self.current_index = int(data["current_index"])
        self.last_position = {str(k): int(v) for k, v in data["last_position"].items()}
        self.local_bsz = data.get("local_bsz")
        self.accum_steps = int(data.get("accum_steps", 0))
        self.loop_start_progress = data.get("loop_start_progress")


class LoopEntry(NamedTuple):
    """What :func:`loop_scope` gives the loop it opened: the epoch it runs in (``None``
    outside ``remaining_epochs_until``), and whether it is to be skipped (it finished
    before the restart)."""
    epoch: int | None
    skip: bool


@contextlib.contextmanager
def loop_scope(owner: Any, state: LoopState, adaptive_loader: bool = False
               ) -> Iterator[LoopEntry]:
    """The bookkeeping around one loop of ``owner``, entered once per loop (not at every
    item): say whether it finished before the restart (then it is skipped), refuse to
    overlap another loop, and when it ends normally (not by a checkpoint-and-exit) mark
    it finished and rewind ``state``.

    Arguments:
        adaptive_loader: ``owner`` is an AdaptiveDataLoader: it becomes the job's
            ``current_dataloader()`` for the loop (what AdaptiveDataParallel follows).

    Raises:
        RuntimeError: if another loop (of any owner) is still being iterated.
    """
    book = boundary.loops()
    epoch = current_epoch()
    key = str(epoch)
    position = book.position[key]
    book.position[key] += 1
    if book.active is not None:
        raise RuntimeError("overlapping AdaptiveDataLoader loops: another adaptive loader "
                           "(or elastic loop) is still being iterated")
    if position <= state.last_position.get(key, -1):
        LOG.info("skipping loop %d of epoch %s: it finished before the restart", position, epoch)
        if adaptive_loader and owner is book.training:
            boundary.training_ended(epoch)
        yield LoopEntry(epoch, True)
        return
    book.active = owner
    if adaptive_loader:
        book.current = owner
    interrupted = False
    try:
        yield LoopEntry(epoch, False)
    except _interrupt.CheckpointExit:
        interrupted = True
        raise
    finally:
        book.active = book.current = None
        if not interrupted:
            if adaptive_loader and owner is book.training:
                boundary.training_ended(epoch)
            state.current_index = 0
            state.loop_start_progress = None
            # Only the current epoch's entries can matter for a replay.
            state.last_position = {key: position}


def run_loop(owner: Any, state: LoopState, body: Callable[[int | None], Iterator[Any]],
             adaptive_loader: bool = False) -> Iterator[Any]:
    """Run one loop of ``owner`` (``body(epoch)``) inside its :func:`loop_scope`.

    Raises:
        RuntimeError: if another loop (of any owner) is still being iterated.
    """
    with loop_scope(owner, state, adaptive_loader) as entry:
        if not entry.skip:
            yield from body(entry.epoch)


class ElasticLoop:
    """Makes a custom iterable elastic: loops finished before a restart are skipped, an
    interrupted loop resumes at its item, and stop and checkpoint requests are honoured
    between items (every replica at the same item).

    Create it outside loops, in the same order on every replica and run (it is matched
    to its checkpoint by name).

    Arguments:
        name: a name unique among this job's loops (a State name: letters, digits, ``_``,
            ``-``, ``.``); default ``adaptdl-loop-<n>`` in creation order.

    Raises:
        ValueError: for a name that is invalid or taken.
    """

    def __init__(self, name: str | None = None):
        if name is None:
            name = f"adaptdl-loop-{context.current().states.count_prefix('adaptdl-loop-')}"
        self._state = LoopState(name)
        checkpoint.load_state(self._state)

    @property
    def position(self) -> int:
        """Items of the current loop consumed so far (across restarts)."""
        return self._state.current_index

    def iterate(self, source: Iterable[Any] | Callable[[int], Iterable[Any]]
                ) -> Iterator[Any]:
        """One loop over ``source``: an iterable (then the items consumed before a
        restart are read again and dropped) or a function of the start position that
        returns an iterable starting there (cheaper when the source can seek).

        Raises:
            RuntimeError: if another loop is still being iterated.
        """
        return run_loop(self, self._state, lambda epoch: self._items(source))

    def _items(self, source: Iterable[Any] | Callable[[int], Iterable[Any]]) -> Iterator[Any]:
        state = self._state
        replicas = context.current().world.replicas
        items = iter(source(state.current_index)) if callable(source) \
            else itertools.islice(source, state.current_index, None)
        for item in items:
            boundary.agree(replicas)  # (may checkpoint here, or stop the job)
            yield item
            state.current_index += 1
        boundary.agree(replicas)
