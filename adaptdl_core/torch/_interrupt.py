"""Graceful interruption and in-place checkpoints, agreed at batch boundaries.

The first SIGINT or SIGTERM (or a call to :func:`request_checkpoint_and_exit`, which is
what the Ray layer uses) only raises a flag. The adaptive data loader agrees on the flag
across replicas at every batch boundary, so all replicas stop after the same batch;
replica 0 saves every State and all replicas raise :class:`CheckpointExit` (status 143,
the conventional answer to SIGTERM). A second SIGINT exits at once without a checkpoint.

:func:`request_checkpoint` asks for a checkpoint *without* stopping: it is agreed on in
the same way (as a second flag beside the exit flag), every replica saves at the same
boundary and training goes on; the :class:`PendingCheckpoint` it returns says when.

The requests themselves live in the job context (:class:`adaptdl_core.context.StopRequests`);
this module is their API: the data loader reads them with :func:`exit_requested` and
:func:`checkpoint_requested` and settles the save requests with
:func:`take_checkpoint_requests` and :func:`resolve_checkpoint_requests`.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from typing import NamedTuple

from adaptdl_core import context

__all__ = ["CheckpointExit", "EXIT_CODE", "request_checkpoint_and_exit", "exit_requested",
           "request_checkpoint", "PendingCheckpoint", "checkpoint_requested", "Requests",
           "local_requests", "take_checkpoint_requests", "resolve_checkpoint_requests",
           "install_signal_handlers"]

LOG = logging.getLogger(__name__)

EXIT_CODE = 143

_installed = False


def _requests() -> context.StopRequests:
    return context.current().requests


class CheckpointExit(SystemExit):
    """Raised on every replica after the job was checkpointed because it was asked to stop.

    A subclass of :class:`SystemExit` with code 143, so an unhandled one ends the process
    with that status; launchers may catch it to tell "checkpointed" from "finished".
    """

    def __init__(self, checkpoint_dir: str | None = None):
        super().__init__(EXIT_CODE)
        self.checkpoint_dir = checkpoint_dir


def request_checkpoint_and_exit() -> None:
    """Ask the job to checkpoint at the next batch boundary and exit (thread-safe).

    Calling it on any one replica is enough: the replicas agree on the request (with
    several replicas, within about 0.2 s of training or 64 steps). A job whose training
    ends before they agree simply finishes, with status 0.
    """
    _requests().request_exit()


def exit_requested() -> bool:
    """True once this replica has been asked to stop (by a signal or programmatically)."""
    return _requests().exit_requested()


class PendingCheckpoint:
    """One request for an in-place checkpoint (from :func:`request_checkpoint`).

    It is *resolved* once the checkpoint it asked for was taken (at the first batch
    boundary the replicas agreed on the request), or when it is cancelled. All methods
    are thread-safe.
    """

    def __init__(self, owner: context.StopRequests | None = None) -> None:
        # (The requests of the job it was made in: a cancel after a reset of the context
        # must not touch the next job's.)
        self._owner = owner if owner is not None else _requests()
        self._resolved = threading.Event()
        self._taken = False
        self._path: str | None = None

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the request is resolved (taken or cancelled), at most ``timeout``
        seconds (``None``: no limit).

        Returns:
            True if resolved, False if the timeout passed first.
        """
        return self._resolved.wait(timeout)

    @property
    def done(self) -> bool:
        """True once resolved: the checkpoint was taken, or the request was cancelled."""
        return self._resolved.is_set()

    @property
    def taken(self) -> bool:
        """True if every replica saved its States for this request (False while pending
        and after :meth:`cancel`)."""
        return self._taken

    @property
    def path(self) -> str | None:
        """The checkpoint directory written for this request, on replica 0; ``None`` on
        the other replicas, when no checkpoint path is set (``ADAPTDL_CHECKPOINT_PATH``),
        and while pending or if cancelled."""
        return self._path

    def cancel(self) -> bool:
        """Resolve the request as not taken, if it is still pending (for example when the
        job ended before another batch boundary); this replica then no longer asks for
        it (a request the replicas already agreed on is still saved, for the others).

        Returns:
            True if this call cancelled it; False if it was already resolved.
        """
        with self._owner.lock():
            self._owner.discard(self)
            return self._resolve(False, None)

    def _resolve(self, taken: bool, path: str | None) -> bool:
        # The first resolution wins: a cancel racing a save settles it.
        with self._owner.lock():
            if self._resolved.is_set():
                return False
            self._taken, self._path = taken, path
            self._resolved.set()
            return True

    def __repr__(self) -> str:
        state = "pending" if not self.done else f"taken, path={self._path!r}" \
            if self._taken else "cancelled"
        return f"<PendingCheckpoint {state}>"


def request_checkpoint() -> PendingCheckpoint:
    """Ask the job to checkpoint at the next batch boundary and keep training (thread-safe).

    Like :func:`request_checkpoint_and_exit`, it may be called from any thread and on any
    one replica (or on all): the replicas agree on it at a batch boundary between
    optimizer steps of an adaptive data loader loop (a training or a validation loop;
    with several replicas within about 0.2 s of training or 64 steps), every replica
    saves its States there (replica 0 writes the checkpoint), and the loop goes on from
    the same position. Every request pending at that boundary is resolved by that one
    checkpoint; one agreed at the same boundary as an exit request is resolved by the
    exit's checkpoint, before :class:`CheckpointExit` is raised.

    A request made when no further batch boundary comes (the training loop is over)
    stays pending until :meth:`PendingCheckpoint.cancel` is called; cancel it when the
    job ends, as in a long-lived process it would otherwise be taken by the next job's
    first boundary.

    Returns:
        the request's :class:`PendingCheckpoint`.
    """
    requests = _requests()
    handle = PendingCheckpoint(requests)
    requests.add(handle)
    return handle


def checkpoint_requested() -> bool:
    """True while this replica has an in-place checkpoint request pending."""
    return _requests().has_pending()


class Requests(NamedTuple):
    """What the replicas agree on at a batch boundary: someone asked to checkpoint and
    exit (``exit``), someone asked for an in-place checkpoint (``save``). ``a | b`` is
    the agreement of two replicas' requests."""

    exit: bool = False
    save: bool = False

    def __or__(self, other: "Requests") -> "Requests":  # type: ignore[override]
        return Requests(self.exit or other.exit, self.save or other.save)


def local_requests() -> Requests:
    """This replica's pending requests."""
    requests = _requests()
    return Requests(requests.exit_requested(), requests.has_pending())


def take_checkpoint_requests() -> list[PendingCheckpoint]:
    """The pending requests, which a checkpoint about to be taken will resolve; requests
    made from now on wait for the next one."""
    return _requests().take()


def resolve_checkpoint_requests(requests: list[PendingCheckpoint], taken: bool,
                                path: str | None = None) -> None:
    """Resolve ``requests`` (from :func:`take_checkpoint_requests`): the checkpoint was
    taken (into ``path`` on replica 0), or it failed (``taken=False``)."""
    for request in requests:
        # (A private method of the same class: resolving a request is not for users.)
        request._resolve(taken, path)


def _handler(signum: int, frame: object) -> None:
    name = signal.Signals(signum).name
    requests = _requests()
    if requests.exit_requested() and signum == signal.SIGINT:
        LOG.warning("second %s: exiting now without a checkpoint", name)
        os._exit(130)
    LOG.warning("received %s: will checkpoint at the next batch boundary and exit "
                "(press Ctrl-C again to exit at once)", name)
    requests.request_exit()


def install_signal_handlers() -> bool:
    """Route SIGINT and SIGTERM to the graceful-stop flag.

    Returns:
        True if installed; False when not called from the main thread (signals can only
        be handled there, e.g. inside a Ray actor; use
        :func:`request_checkpoint_and_exit` instead).
    """
    global _installed
    if threading.current_thread() is not threading.main_thread():
        return False
    if not _installed:
        signal.signal(signal.SIGINT, _handler)
        signal.signal(signal.SIGTERM, _handler)
        _installed = True
    return True
