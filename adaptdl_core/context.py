"""The job context: everything one training job keeps per process, in one object.

A replica of a job holds some state for the life of its process: the registry of
checkpointed :class:`~adaptdl_core.checkpoint.State` objects and the checkpoint they
restore from, the connection to the job's store (and the port held for it until it
listens), the graceful-stop flag and the pending
in-place checkpoint requests, and the bookkeeping of the torch runtime (the loader loops,
the epoch counter, the step profile, the current model). All of it lives in one
:class:`JobContext`; the modules that use a piece reach it with :func:`current` and the
context's public attributes and methods.

:func:`adaptdl_core.torch.init_process_group` starts the context of a job with the job's
:class:`World` (:func:`start`). Code that runs without it (a single process, the unit
tests) gets a context on first use whose world is read from the ``ADAPTDL_*`` variables.
:func:`reset` forgets the whole context, exactly as a new process would start: the test
suite calls it around every test, and a test simulates a restart with it.

This module needs only the standard library (the test fixtures import it without torch).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Any, Callable

from adaptdl_core import env

__all__ = ["World", "StateRegistry", "StopRequests", "JobContext", "current", "start",
           "reset"]

LOG = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class World:
    """The shape of the job as this replica sees it.

    Attributes:
        nodes: nodes the replicas run on (>= 1).
        replicas: replicas in the job (>= 1).
        rank: this replica's rank, in ``[0, replicas)``.
        restarts: how many times the job was restarted before this run (>= 0).
    """

    nodes: int
    replicas: int
    rank: int
    restarts: int

    @classmethod
    def from_env(cls) -> "World":
        """The world described by the ``ADAPTDL_*`` variables (defaults: one replica).

        Raises:
            ValueError: for an invalid variable (see :mod:`adaptdl_core.env`).
        """
        return cls(env.num_nodes(), env.num_replicas(), env.replica_rank(), env.num_restarts())


class StateRegistry:
    """The job's live States by name, in registration order, and the checkpoint they
    restore from.

    Registration order matters: ``State.sync()`` may run collectives, which every replica
    must issue in the same order.
    """

    # The restore point before it was looked up (None means: looked up, there is none).
    UNKNOWN: Any = object()

    def __init__(self) -> None:
        self._states: dict[str, Any] = {}
        self._restore_dir: Any = StateRegistry.UNKNOWN

    def add(self, state: Any) -> None:
        """Register ``state`` under ``state.name``.

        Raises:
            ValueError: if a live State already has that name.
        """
        if state.name in self._states:
            raise ValueError(f"a State named {state.name!r} already exists; every State needs "
                             "a unique name (pass name=... to tell two apart)")
        self._states[state.name] = state

    def get(self, name: str) -> Any:
        """The State registered as ``name``, or ``None``."""
        return self._states.get(name)

    def states(self) -> list[Any]:
        """Every registered State, in registration order."""
        return list(self._states.values())

    def names(self) -> list[str]:
        """The names of the registered States, in registration order."""
        return list(self._states)

    def count_prefix(self, prefix: str) -> int:
        """How many registered States have a name starting with ``prefix`` (modules name
        their n-th State ``<prefix><n>``)."""
        return sum(1 for name in self._states if name.startswith(prefix))

    @property
    def restore_dir(self) -> Any:
        """The checkpoint directory States load from: :attr:`UNKNOWN` before the first
        look-up, then a path, or ``None`` when there is no checkpoint."""
        return self._restore_dir

    @restore_dir.setter
    def restore_dir(self, value: Any) -> None:
        self._restore_dir = value


class StopRequests:
    """This replica's graceful-stop flag and its pending in-place checkpoint requests.

    Thread-safe: signal handlers and other threads (the Ray actor's) raise the flag and
    add requests while the training thread reads and settles them.
    """

    def __init__(self) -> None:
        self._exit = threading.Event()
        self._lock = threading.RLock()
        self._pending: list[Any] = []

    def request_exit(self) -> None:
        """Raise the checkpoint-and-exit flag."""
        self._exit.set()

    def exit_requested(self) -> bool:
        """True once the checkpoint-and-exit flag was raised."""
        return self._exit.is_set()

    def add(self, request: Any) -> None:
        """Append an in-place checkpoint request (a ``PendingCheckpoint``)."""
        with self._lock:
            self._pending.append(request)

    def discard(self, request: Any) -> None:
        """Forget ``request`` if it is pending (it was cancelled)."""
        with self._lock:
            if request in self._pending:
                self._pending.remove(request)

    def has_pending(self) -> bool:
        """True while an in-place checkpoint request is pending."""
        return bool(self._pending)

    def take(self) -> list[Any]:
        """Remove and return the pending requests (a checkpoint about to be taken settles
        them; requests made from now on wait for the next one)."""
        with self._lock:
            taken, self._pending = self._pending, []
        return taken

    def lock(self) -> threading.RLock:
        """The (reentrant) lock that orders the settling of requests: resolution and
        cancellation."""
        return self._lock

    def clear(self) -> list[Any]:
        """Lower the exit flag and return the pending requests, now forgotten (the caller
        cancels them)."""
        self._exit.clear()
        return self.take()


class JobContext:
    """Everything one job keeps in this process (see the module docstring).

    Arguments:
        world: the job's shape; ``None`` reads it from the environment at every access
            (until :func:`start` fixes it), so that code which sets ``ADAPTDL_*``
            variables before it builds objects sees them.
        clock: monotonic seconds (profiling, refit intervals); injectable for tests.
        wall_clock: seconds since the epoch (checkpoint and restart times).

    Attributes:
        states: the :class:`StateRegistry`.
        requests: the :class:`StopRequests`.
        group: the collective group (an object with ``close()``) or ``None``; owned by
            :mod:`adaptdl_core.collective`.
        held_port: a port held for replica 0's store in this process (an object with
            ``close()``) or ``None``; owned by :mod:`adaptdl_core.ports`.
        metrics, epoch_state, epoch_target, loops, model: the torch runtime's
            bookkeeping, each created by the module that owns its type (``_metrics``,
            ``epoch``, ``data``, ``parallel``); ``None`` until then.
    """

    def __init__(self, world: World | None = None,
                 clock: Callable[[], float] = time.perf_counter,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self._world = world
        self.clock = clock
        self.wall_clock = wall_clock
        self.states = StateRegistry()
        self.requests = StopRequests()
        self.group: Any = None
        self.held_port: Any = None
        self.metrics: Any = None
        self.epoch_state: Any = None
        self.epoch_target: int | None = None
        self.loops: Any = None
        self.model: Any = None

    @property
    def world(self) -> World:
        """The job's :class:`World` (from the environment until :func:`start`)."""
        return self._world if self._world is not None else World.from_env()

    def set_world(self, world: World) -> None:
        """Fix the job's shape (done once, by :func:`start`)."""
        self._world = world

    def close(self) -> None:
        """Disconnect from the job's store, release a port held for it and cancel pending
        checkpoint requests."""
        group, self.group = self.group, None
        if group is not None:
            group.close()
        held, self.held_port = self.held_port, None
        if held is not None:
            held.close()
        for request in self.requests.clear():
            request.cancel()


_LOCK = threading.Lock()
_CURRENT: JobContext | None = None


def current() -> JobContext:
    """This process's job context, created on first use (thread-safe)."""
    ctx = _CURRENT
    if ctx is not None:
        return ctx
    return _install(None)


def _install(world: World | None) -> JobContext:
    global _CURRENT
    with _LOCK:
        if _CURRENT is None:
            _CURRENT = JobContext(world)
        elif world is not None:
            _CURRENT.set_world(world)
        return _CURRENT


def start(world: World) -> JobContext:
    """Start the job in this process with ``world`` (called by ``init_process_group``).

    States created before (a program may build some before it joins the job) stay
    registered; the world becomes fixed.
    """
    return _install(world)


def reset() -> None:
    """Forget the job context, as if the process started anew: every State, the restore
    point, the runtime's bookkeeping and the stop flag; the store connection is closed, a
    port held for the store released and pending checkpoint requests are cancelled. The
    next :func:`current` builds a fresh context. (Test fixtures use it; a real job
    restarts its process instead.)"""
    global _CURRENT
    with _LOCK:
        ctx, _CURRENT = _CURRENT, None
    if ctx is not None:
        ctx.close()
