"""Collectives for small Python objects across the replicas of one job.

Built on torch.distributed's ``TCPStore`` (replica 0 hosts it at the master address and
port): each replica publishes its pickled value under a key for the operation, waits for
the keys of all replicas, and applies ``reduce_fn`` to the values in rank order, so every
replica computes the same result. Replica 0, whose process hosts the store, returns from
an operation only once every other replica has read its values, so any replica may exit
in any way (``os._exit`` included) as soon as its last collective returned. Every wait
has a timeout (``ADAPTDL_TIMEOUT``, 30 s by default) and the error names the replicas
that did not answer.

All operations run, in the order they were called, on one background thread; the
synchronous functions simply wait for their turn. Hence :func:`allreduce_async` overlaps
with training, and every replica must call the collectives in the same order.

The same store also serves as the rendezvous for ``torch.distributed`` (see
:func:`adaptdl_core.torch.init_process_group`), so a job needs one port only.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import functools
import math
import logging
import pickle
import threading
from datetime import timedelta
from typing import Any, Callable

import torch.distributed as dist

from adaptdl_core import context, env

__all__ = [
    "CollectiveError",
    "CollectiveTimeoutError",
    "initialize",
    "teardown",
    "is_initialized",
    "allreduce",
    "allreduce_async",
    "broadcast",
    "store_address",
    "new_store_client",
    "current_group",
]

LOG = logging.getLogger(__name__)


class CollectiveError(RuntimeError):
    """A collective operation failed (for example, the store on replica 0 went away)."""


class CollectiveTimeoutError(CollectiveError):
    """Some replicas did not reach a collective operation within the timeout.

    Attributes:
        missing_ranks: the ranks whose contribution never arrived.
    """

    def __init__(self, message: str, missing_ranks: list[int]):
        super().__init__(message)
        self.missing_ranks = missing_ranks


class _Group:
    """The connection of this replica to the job's store, plus the operation counter."""

    def __init__(self, addr: str, port: int, rank: int, size: int, timeout_s: float):
        self.addr, self.rank, self.size, self.timeout_s = addr, rank, size, timeout_s
        self.store = dist.TCPStore(addr, port, size, is_master=(rank == 0),
                                   timeout=timedelta(seconds=timeout_s),
                                   wait_for_workers=False)
        self.port = self.store.port
        self.op = 0
        self.executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="adaptdl-collective")

    def key(self, op: int, rank: int) -> str:
        return f"adaptdl/c/{op}/{rank}"

    def read_key(self, op: int, rank: int) -> str:
        return f"adaptdl/r/{op}/{rank}"

    def exchange(self, value: Any) -> list[Any]:
        """Publish ``value``; return every replica's value in rank order (runs on the
        collective thread).

        Replica 0 hosts the store, so it returns only once every other replica has read
        the values: a process may end in any way right after a collective returns
        (``os._exit``, a forked child, a kill), and if replica 0's did, the store would go
        with it while the others still read. The others confirm with a one-way ``set``,
        and the wait for all values is the one inside ``multi_get``, so the protocol costs
        the same number of store round trips as a separate wait followed by a read.
        """
        op = self.op
        self.op += 1
        keys = [self.key(op, r) for r in range(self.size)]
        try:
            self.store.set(keys[self.rank], pickle.dumps(value))
            if op >= 2:
                # This replica read op - 1, which everyone had published: so everyone had
                # read op - 2, and replica 0 had seen its read confirmations. (Cleaned up
                # here, while the others may still be arriving, and not after the read:
                # the read confirmation must be a replica's last call to the store in a
                # collective, since replica 0 may be gone right after it.)
                self.store.delete_key(self.key(op - 2, self.rank))
                if self.rank != 0:
                    self.store.delete_key(self.read_key(op - 2, self.rank))
            try:
                raw = self.store.multi_get(keys)  # (waits for every key, up to the timeout)
            except Exception as exc:
                self._raise_missing(op, keys, exc, "did not reach")
                raise
            values = [pickle.loads(v) for v in raw]
            others = range(1, self.size)
            if self.rank != 0:
                self.store.set(self.read_key(op, self.rank), b"")
            else:
                reads = [self.read_key(op, r) for r in others]
                try:
                    self.store.wait(reads, timedelta(seconds=self.timeout_s))
                except Exception as exc:
                    self._raise_missing(op, reads, exc, "did not read the result of",
                                        ranks=list(others))
                    raise
        except CollectiveError:
            raise
        except Exception as exc:
            who = "this replica hosts it" if self.rank == 0 else "replica 0 has likely exited"
            raise CollectiveError(
                f"replica {self.rank}: collective #{op} failed talking to the store at "
                f"{self.addr}:{self.port} ({who}): {exc}") from exc
        return values

    def close(self) -> None:
        """Disconnect; pending asynchronous operations finish first (see :func:`teardown`)."""
        self.executor.shutdown(wait=True)
        try:
            if self.rank != 0:
                self.store.set(f"adaptdl/left/{self.rank}", b"1")
            elif self.size > 1:
                self.store.wait([f"adaptdl/left/{r}" for r in range(1, self.size)],
                                timedelta(seconds=self.timeout_s))
        except Exception as exc:  # a replica that died or a store already gone: just leave
            LOG.debug("teardown of replica %d: %s", self.rank, exc)

    def _raise_missing(self, op: int, keys: list[str], exc: Exception, what: str,
                       ranks: list[int] | None = None) -> None:
        """After a failed wait for ``keys`` (of replicas ``ranks``, default all): raise
        :class:`CollectiveTimeoutError` naming the replicas whose key is missing, if any.
        Probing raises if the store itself is gone (replica 0 exited): that is a lost
        connection, reported by the caller, not a timeout."""
        ranks = list(range(self.size)) if ranks is None else ranks
        missing = [r for r, k in zip(ranks, keys) if not self.store.check([k])]
        if missing:
            raise CollectiveTimeoutError(
                f"replica {self.rank}: replicas {missing} of {self.size} {what} "
                f"collective #{op} within {self.timeout_s:g} s (ADAPTDL_TIMEOUT); they "
                "have exited, hang, or run a different sequence of collectives",
                missing) from exc


# The group lives in the job context (context.current().group); this lock orders its
# creation and removal.
_LOCK = threading.Lock()


def _group() -> _Group | None:
    return context.current().group


def initialize(master_addr: str | None = None, master_port: int | None = None,
               replica_rank: int | None = None, num_replicas: int | None = None,
               timeout: float | None = None) -> None:
    """Connect this replica to the job's store (replica 0 creates it).

    Arguments default to the ``ADAPTDL_*`` environment (see :mod:`adaptdl_core.env`).

    Arguments:
        master_addr: address of replica 0.
        master_port: port of the store on replica 0; 0 picks a free port (only sensible
            for a single replica).
        replica_rank: this replica's rank, in ``[0, num_replicas)``.
        num_replicas: number of replicas in the job.
        timeout: seconds any wait may block, default ``ADAPTDL_TIMEOUT`` (30).

    Raises:
        ValueError: for an invalid address, rank, size, port or timeout.
        RuntimeError: if already initialized, or the store cannot be reached in time.
    """
    addr = master_addr if master_addr is not None else env.master_addr()
    port = master_port if master_port is not None else env.master_port()
    size = num_replicas if num_replicas is not None else env.num_replicas()
    rank = replica_rank if replica_rank is not None else env.replica_rank()
    timeout_s = timeout if timeout is not None else env.timeout()
    if not isinstance(addr, str) or not addr.strip():
        raise ValueError(f"master_addr={addr!r} must be a non-empty host name or IP address "
                         "string such as '127.0.0.1' (or set ADAPTDL_MASTER_ADDR)")
    if not isinstance(size, int) or size < 1:
        raise ValueError(f"num_replicas={size!r} must be an integer >= 1")
    if not isinstance(rank, int) or not 0 <= rank < size:
        raise ValueError(f"replica_rank={rank!r} must be an integer in [0, {size})")
    if not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValueError(f"master_port={port!r} must be an integer in [0, 65535]")
    if port == 0 and size > 1:
        raise ValueError("master_port=0 cannot work for several replicas: set "
                         "ADAPTDL_MASTER_PORT to a port free on the master's host")
    if isinstance(rank, bool) or isinstance(size, bool):
        raise ValueError("replica_rank and num_replicas must be integers, not bools")
    if not (isinstance(timeout_s, (int, float)) and math.isfinite(timeout_s)
            and 0 < timeout_s <= env.MAX_TIMEOUT_S):
        raise ValueError(f"timeout={timeout_s!r} must be a finite number of seconds in "
                         f"(0, {env.MAX_TIMEOUT_S:g}]")
    ctx = context.current()
    with _LOCK:
        if ctx.group is not None:
            raise RuntimeError("adaptdl_core.collective is already initialized; "
                               "call teardown() first")
        try:
            ctx.group = group = _Group(addr, port, rank, size, float(timeout_s))
        except Exception as exc:
            raise RuntimeError(
                f"replica {rank}: could not {'create' if rank == 0 else 'reach'} the store at "
                f"{addr}:{port} within {timeout_s:g} s: {exc}") from exc
    atexit.register(teardown)
    LOG.debug("collective initialized: rank %d of %d, store %s:%d", rank, size, addr, group.port)


def teardown() -> None:
    """Disconnect from the store; pending asynchronous operations finish first.

    Replica 0 hosts the store, so before closing it waits (at most the timeout) until
    every other replica has torn down too: the collectives themselves never need this
    (replica 0 returns from one only after every replica read it), but the torch process
    group's own connection to the store may still be in use on the others. Runs
    automatically at interpreter exit.
    """
    ctx = context.current()
    with _LOCK:
        group, ctx.group = ctx.group, None
    if group is not None:
        group.close()


def is_initialized() -> bool:
    """True between :func:`initialize` and :func:`teardown`."""
    return _group() is not None


def store_address() -> tuple[str, int]:
    """``(address, port)`` of the store this replica is connected to.

    Raises:
        RuntimeError: if not initialized.
    """
    group = _require_group()
    return group.addr, group.port


def new_store_client() -> dist.Store:
    """A second, independent client connection to the job's store (for the torch process
    group, so that it never shares a socket with the collective thread).

    Raises:
        RuntimeError: if not initialized.
    """
    group = _require_group()
    return dist.TCPStore(group.addr, group.port, group.size, is_master=False,
                         timeout=timedelta(seconds=group.timeout_s))


def _require_group() -> _Group:
    group = _group()
    if group is None:
        raise RuntimeError("adaptdl_core.collective is not initialized: call "
                           "adaptdl_core.torch.init_process_group() (or collective.initialize())")
    return group


def current_group() -> Any:
    """This replica's connection to the job's store (attributes ``rank``, ``size``,
    ``store``, ``op``: the number of operations issued), or ``None`` when not initialized.
    For diagnostics and fault-injection tests; the operations above are the API."""
    return _group()


class _DoneFuture(concurrent.futures.Future):
    def __init__(self, value: Any):
        super().__init__()
        self.set_result(value)


def allreduce_async(value: Any, reduce_fn: Callable[[Any, Any], Any] = lambda a, b: a + b
                    ) -> concurrent.futures.Future:
    """Start reducing ``value`` across replicas; returns a future whose ``.result()`` is
    ``reduce_fn`` folded over all replicas' values in rank order.

    With a single replica the future is already done (no store traffic).

    Raises (from ``.result()``):
        CollectiveTimeoutError: if some replicas did not contribute within the timeout.
        CollectiveError: if the store failed.
    """
    group = _group()
    if group is None:
        if env.num_replicas() > 1:
            _require_group()
        return _DoneFuture(value)
    if group.size == 1:
        # Nothing to exchange: skip the store round trips (this runs at every batch).
        return _DoneFuture(value)

    def run() -> Any:
        return functools.reduce(reduce_fn, group.exchange(value))

    return group.executor.submit(run)


def allreduce(value: Any, reduce_fn: Callable[[Any, Any], Any] = lambda a, b: a + b) -> Any:
    """Reduce ``value`` across replicas with ``reduce_fn`` (default ``+``), blocking.

    Every replica must call it at the same point. The values must be picklable and small
    (they pass through the store on replica 0).

    Raises:
        CollectiveTimeoutError: if some replicas did not contribute within the timeout.
        CollectiveError: if the store failed.
    """
    return allreduce_async(value, reduce_fn).result()


def broadcast(value: Any) -> Any:
    """Return replica 0's ``value`` on every replica (blocking; all must call it).

    Raises:
        CollectiveTimeoutError: if some replicas did not arrive within the timeout.
        CollectiveError: if the store failed.
    """
    group = _group()
    if group is None:
        if env.num_replicas() > 1:
            _require_group()
        return value
    if group.size == 1:
        return value
    mine = value if group.rank == 0 else None
    return group.executor.submit(lambda: group.exchange(mine)[0]).result()
