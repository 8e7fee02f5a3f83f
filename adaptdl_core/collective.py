"""Collectives for small Python objects across the replicas of one job.

Built on torch.distributed's ``TCPStore`` (replica 0 hosts it at the master address and
port): each replica publishes its pickled value under a key for the operation, waits for
the keys of all replicas, and applies ``reduce_fn`` to the values in rank order, so every
replica computes the same result. Replica 0, whose process hosts the store, returns from
an operation only once every other replica has read its values, so any replica may exit
in any way (``os._exit`` included) as soon as its last collective returned. Every wait
has a timeout (``ADAPTDL_TIMEOUT``, 30 s by default) and the error names the replicas
that did not answer.

Joining is a rendezvous with one deadline: :func:`initialize` returns once every replica
has connected and registered its rank under its own key, or raises
:class:`RendezvousTimeoutError` naming the replicas that never joined, on every replica
that waited, at most ``ADAPTDL_TIMEOUT`` seconds (plus about two seconds for replica 0 to
hand its verdict to the others) after it was called.

All operations run, in the order they were called, on one background thread; the
synchronous functions simply wait for their turn. Hence :func:`allreduce_async` overlaps
with training, and every replica must call the collectives in the same order.

The same store also serves as the rendezvous for ``torch.distributed`` (see
:func:`adaptdl_core.torch.init_process_group`), so a job needs one port only.

Under torchrun, ``MASTER_PORT`` is usually the port of its agent's own store
(:func:`adaptdl_core.env.shared_store_scope`). Replica 0 then hosts the job's store on a
free port and publishes it there; the others look it up. That store outlives the workers
and keeps every earlier round's keys, so what a replica reads there may be an address of a
previous round's store: it connects only to a store that holds the identifier published
with the address, and keeps looking until the rendezvous deadline.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import functools
import json
import logging
import pickle
import socket
import uuid
import sys
import threading
import time
from datetime import timedelta
from typing import Any, Callable

import torch.distributed as dist

from adaptdl_core import context, env, ports, validation

__all__ = [
    "CollectiveError",
    "CollectiveTimeoutError",
    "RendezvousTimeoutError",
    "ranks_in_words",
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


class RendezvousTimeoutError(CollectiveTimeoutError):
    """Some replicas did not join the job within the timeout (see :func:`initialize`).

    Attributes:
        missing_ranks: the ranks that never joined (``[0]`` when replica 0, which hosts
            the store, could not be reached).
        joined_ranks: the ranks that had joined when the wait ended (empty when replica 0
            could not be reached, since only its store knows).
    """

    def __init__(self, message: str, missing_ranks: list[int], joined_ranks: list[int]):
        super().__init__(message, missing_ranks)
        self.joined_ranks = joined_ranks


def ranks_in_words(ranks: list[int]) -> str:
    """``[2]`` -> ``"replica 2"``, ``[1, 2, 5]`` -> ``"replicas 1, 2 and 5"`` (for
    messages that name replicas)."""
    ranks = sorted(ranks)
    if len(ranks) == 1:
        return f"replica {ranks[0]}"
    return "replicas " + ", ".join(map(str, ranks[:-1])) + f" and {ranks[-1]}"


# Rendezvous keys: each replica registers under its own key; replica 0 publishes its
# verdict when the wait fails, and the others acknowledge that they read it (so that
# replica 0, whose process hosts the store, does not take it away before they do).
_JOINED = "adaptdl/rendezvous/joined/{}"
_FAILED = "adaptdl/rendezvous/failed"
_SEEN = "adaptdl/rendezvous/seen/{}"
# How long replica 0 keeps its store up after a failed rendezvous for the others to read
# its verdict, and the polling intervals of the rendezvous (first, longest).
_VERDICT_GRACE_S = 2.0
_POLL_S = (0.005, 0.1)


def _connect_deadline(addr: str, port: int, deadline: float) -> None:
    """Wait until ``addr:port`` accepts TCP connections or ``deadline`` (monotonic) passes.

    torch's store client retries its own connection for longer than the timeout it is
    given (about 1.6 times), so the wait for replica 0's store is done here, on the
    rendezvous deadline; the client then connects to a listening port at once.

    Raises:
        TimeoutError: at the deadline.
        OSError: when the address cannot be resolved.
    """
    socket.getaddrinfo(addr, port)  # (an unknown host fails here, at once)
    pause = _POLL_S[0]
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"{addr}:{port} did not accept a connection")
        try:
            with socket.create_connection((addr, port), timeout=max(min(left, 1.0), 0.01)):
                return
        except OSError:
            time.sleep(min(pause, max(deadline - time.monotonic(), 0)))
            pause = min(pause * 2, _POLL_S[1])


class _Group:
    """The connection of this replica to the job's store, plus the operation counter."""

    def __init__(self, addr: str, port: int, rank: int, size: int, timeout_s: float,
                 deadline: float | None = None, scope: str | None = None):
        self.addr, self.rank, self.size, self.timeout_s = addr, rank, size, timeout_s
        # Replicas known to be gone (a collective timed out waiting for them): teardown
        # does not wait for them to leave.
        self.lost: set[int] = set()
        # With a scope, addr:port is the launcher's store, where replica 0 publishes the
        # port of its own (picked free) and the others look it up.
        launcher_port = port
        if scope is not None:
            port = 0 if rank == 0 else _find_published(addr, port, scope, size, deadline)
        if rank != 0 and deadline is not None:
            _connect_deadline(addr, port, deadline)
        # Replica 0 listens on the socket held for its port since the port was picked, if
        # there is one (adaptdl_core.ports): the port was never free in between.
        listen_fd = ports.take_for_store(port) if rank == 0 and port else None
        self.store = dist.TCPStore(addr, port, size, is_master=(rank == 0),
                                   timeout=timedelta(seconds=timeout_s),
                                   wait_for_workers=False, master_listen_fd=listen_fd)
        self.port = self.store.port
        if scope is not None and rank == 0:
            _publish(self.store, addr, launcher_port, scope, size, timeout_s)
        self.op = 0
        self.executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="adaptdl-collective")

    def rendezvous(self, deadline: float) -> None:
        """Register this replica and wait until every replica has, or ``deadline``
        (monotonic seconds) passes.

        Every replica polls the others' keys (a failed wait must be able to say who is
        missing, and polling ``check`` never leaves torch's timeout warnings behind).
        Replica 0 publishes its verdict when the deadline passes and keeps the store up
        for up to :data:`_VERDICT_GRACE_S` until the replicas that joined have read it;
        the others raise with the verdict they read, or with their own when their
        deadline comes first.

        Raises:
            RendezvousTimeoutError: naming the replicas that never joined.
            CollectiveError: when replica 0's store went away during the wait.
        """
        keys = [_JOINED.format(r) for r in range(self.size)]
        try:
            self.store.set(keys[self.rank], b"1")
            pause = _POLL_S[0]
            while not self.store.check(keys):
                if self.rank != 0 and self.store.check([_FAILED]):
                    verdict = json.loads(self.store.get(_FAILED).decode())
                    self.store.set(_SEEN.format(self.rank), b"1")
                    raise RendezvousTimeoutError(
                        verdict["message"].format(
                            who=f"reported by replica 0 to replica {self.rank}"),
                        verdict["missing"], verdict["joined"])
                if time.monotonic() >= deadline:
                    self._fail_rendezvous(keys)
                time.sleep(pause)
                pause = min(pause * 2, _POLL_S[1])
        except CollectiveError:
            raise
        except Exception as exc:
            raise CollectiveError(
                f"replica {self.rank}: the store at {self.addr}:{self.port} went away while "
                f"the replicas joined (replica 0 has likely exited): {exc}") from exc

    def _fail_rendezvous(self, keys: list[str]) -> None:
        joined = [r for r, k in enumerate(keys) if self.store.check([k])]
        missing = [r for r in range(self.size) if r not in joined]
        if not missing:
            return  # (everyone arrived at the last moment)
        where = (f"{ranks_in_words(missing)} of {self.size} never joined within "
                 f"{self.timeout_s:g} s (joined: {', '.join(map(str, joined))}; master "
                 f"{self.addr}:{self.port}; {{who}}). Check that every replica was started "
                 "with the same ADAPTDL_MASTER_ADDR and ADAPTDL_MASTER_PORT, or raise "
                 "ADAPTDL_TIMEOUT if they start slowly")
        if self.rank == 0:
            self.store.set(_FAILED, json.dumps(
                {"message": where, "missing": missing, "joined": joined}).encode())
            seen = [_SEEN.format(r) for r in joined if r != 0]
            grace = time.monotonic() + _VERDICT_GRACE_S
            while seen and not self.store.check(seen) and time.monotonic() < grace:
                time.sleep(_POLL_S[0] * 4)
        else:
            # Gave up first, on its own deadline: replica 0 need not wait for it to read.
            self.store.set(_SEEN.format(self.rank), b"1")
        raise RendezvousTimeoutError(where.format(who=f"seen by replica {self.rank}"),
                                     missing, joined)

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

    def close(self, wait: bool = True) -> None:
        """Disconnect; pending asynchronous operations finish first (see :func:`teardown`).
        Replica 0 waits for the others to leave unless ``wait`` is False, but never for
        replicas a collective found gone."""
        self.executor.shutdown(wait=True)
        try:
            if self.rank != 0:
                self.store.set(f"adaptdl/left/{self.rank}", b"1")
            elif wait:
                others = [r for r in range(1, self.size) if r not in self.lost]
                if others:
                    self.store.wait([f"adaptdl/left/{r}" for r in others],
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
            self.lost.update(missing)
            they = "it has" if len(missing) == 1 else "they have"
            raise CollectiveTimeoutError(
                f"replica {self.rank}: {ranks_in_words(missing)} of {self.size} {what} "
                f"collective #{op} within {self.timeout_s:g} s (ADAPTDL_TIMEOUT); {they} "
                "exited, hang, or run a different sequence of collectives",
                missing) from exc


# In a launcher's store: where replica 0 publishes its store (port and identifier). In
# the job's store: the identifier, which proves that a store is the one published.
_PUBLISHED = "adaptdl/{scope}/store"
_STORE_ID = "adaptdl/store-id"


def _publish(store: dist.Store, addr: str, launcher_port: int, scope: str, size: int,
             timeout_s: float) -> None:
    """Replica 0: label its new store with a fresh identifier and publish its port and
    that identifier in the launcher's store at ``addr:launcher_port``."""
    store_id = uuid.uuid4().hex
    store.set(_STORE_ID, store_id.encode())
    launcher = dist.TCPStore(addr, launcher_port, size, is_master=False,
                             timeout=timedelta(seconds=timeout_s))
    launcher.set(_PUBLISHED.format(scope=scope),
                 json.dumps({"port": store.port, "id": store_id}).encode())


def _find_published(addr: str, launcher_port: int, scope: str, size: int,
                    deadline: float | None) -> int:
    """The others: the port of replica 0's store, read from the launcher's store and
    checked against the identifier published with it (an entry left by an earlier round
    names a store that is gone, or one that holds another identifier).

    Raises:
        TimeoutError: when no published store answered with its identifier by
            ``deadline`` (monotonic seconds; ``None``: the default timeout from now).
    """
    if deadline is None:
        deadline = time.monotonic() + env.timeout()
    key = _PUBLISHED.format(scope=scope)
    _connect_deadline(addr, launcher_port, deadline)
    launcher = dist.TCPStore(addr, launcher_port, size, is_master=False,
                             timeout=timedelta(seconds=max(deadline - time.monotonic(), 1.0)))
    pause, seen = _POLL_S[0], None
    while True:
        if launcher.check([key]):
            entry = json.loads(launcher.get(key).decode())
            try:
                # (A short wait each: a stale entry must not use up the deadline.)
                _connect_deadline(addr, entry["port"], min(deadline, time.monotonic() + 1.0))
                probe = dist.TCPStore(addr, entry["port"], size, is_master=False,
                                      timeout=timedelta(seconds=2))
                answer = (probe.get(_STORE_ID).decode() if probe.check([_STORE_ID])
                          else "no identifier")
            except (TimeoutError, OSError, RuntimeError) as exc:
                answer = f"unreachable: {exc}"
            if answer == entry["id"]:
                return int(entry["port"])
            if entry != seen:
                LOG.debug("the published store %s is not this round's (%s)", entry, answer)
                seen = entry
        if time.monotonic() >= deadline:
            raise TimeoutError(f"no store of replica 0 was published in the launcher's store "
                               f"at {addr}:{launcher_port}")
        time.sleep(pause)
        pause = min(pause * 2, _POLL_S[1])


# The group lives in the job context (context.current().group); this lock orders its
# creation and removal.
_LOCK = threading.Lock()


def _group() -> _Group | None:
    return context.current().group


def initialize(master_addr: str | None = None, master_port: int | None = None,
               replica_rank: int | None = None, num_replicas: int | None = None,
               timeout: float | None = None) -> None:
    """Connect this replica to the job's store (replica 0 creates it) and wait until
    every replica has joined.

    The whole rendezvous (reaching replica 0's store, then every replica registering its
    rank) has one deadline, ``timeout`` seconds after the call; replica 0 may take up to
    two seconds more to hand its verdict to the replicas that joined.

    Arguments default to the ``ADAPTDL_*`` environment (see :mod:`adaptdl_core.env`);
    when the port comes from there too and torchrun's agent hosts a store there
    (:func:`adaptdl_core.env.shared_store_scope`), replica 0 publishes its own store's
    port in it and the others look it up (see the module docstring).

    Arguments:
        master_addr: address of replica 0.
        master_port: port of the store on replica 0; 0 picks a free port (only sensible
            for a single replica). Replica 0 listens on the socket held for that port
            since it was picked, when there is one (:mod:`adaptdl_core.ports`).
        replica_rank: this replica's rank, in ``[0, num_replicas)``.
        num_replicas: number of replicas in the job.
        timeout: seconds any wait may block, default ``ADAPTDL_TIMEOUT`` (30).

    Raises:
        ValueError: for an invalid address, rank, size, port or timeout.
        RendezvousTimeoutError: if some replicas did not join in time; the message names
            them in words ("replica 2 of 3 never joined within 30 s (joined: 0, 1; ...)"),
            or says that replica 0's store could not be reached.
        RuntimeError: if already initialized, or the store cannot be created or reached
            (for example an unknown host name, or an ``ADAPTDL_MASTER_FD`` that names no
            socket bound to the master port).
    """
    addr = master_addr if master_addr is not None else env.master_addr()
    port = master_port if master_port is not None else env.master_port()
    scope = env.shared_store_scope() if master_port is None else None
    size = num_replicas if num_replicas is not None else env.num_replicas()
    rank = replica_rank if replica_rank is not None else env.replica_rank()
    timeout_s = timeout if timeout is not None else env.timeout()
    if not isinstance(addr, str) or not addr.strip():
        raise ValueError(f"master_addr={addr!r} must be a non-empty host name or IP address "
                         "string such as '127.0.0.1' (or set ADAPTDL_MASTER_ADDR)")
    size = validation.integer("num_replicas", size, 1)
    rank = validation.integer("replica_rank", rank, 0, size - 1)
    port = validation.integer("master_port", port, 0, 65535)
    if port == 0 and size > 1:
        raise ValueError("master_port=0 cannot work for several replicas: set "
                         "ADAPTDL_MASTER_PORT to a port free on the master's host")
    timeout_s = validation.number("timeout", timeout_s, 0.0, env.MAX_TIMEOUT_S, low_open=True,
                                  what="a finite number of seconds")
    ctx = context.current()
    deadline = time.monotonic() + timeout_s
    with _LOCK:
        if ctx.group is not None:
            raise RuntimeError("adaptdl_core.collective is already initialized; "
                               "call teardown() first")
        try:
            group = _Group(addr, port, rank, size, float(timeout_s), deadline, scope)
        except TimeoutError as exc:
            raise RendezvousTimeoutError(
                f"replica 0 of {size} (the master, hosting the store at {addr}:{port}) could "
                f"not be reached by replica {rank} within {timeout_s:g} s: it never started, "
                "exited, or ADAPTDL_MASTER_ADDR/ADAPTDL_MASTER_PORT do not point at it",
                [0], []) from exc
        except Exception as exc:
            raise RuntimeError(
                f"replica {rank}: could not {'create' if rank == 0 else 'reach'} the store at "
                f"{addr}:{port} within {timeout_s:g} s: {exc}") from exc
        if size > 1:
            try:
                group.rendezvous(deadline)
            except BaseException:
                # Nobody to say goodbye to: a waiting teardown would stack a second
                # timeout onto the first.
                group.close(wait=False)
                raise
        ctx.group = group
    atexit.register(_teardown_at_exit)
    LOG.debug("collective initialized: rank %d of %d, store %s:%d", rank, size, addr, group.port)


def teardown(wait: bool = True) -> None:
    """Disconnect from the store; pending asynchronous operations finish first.

    Replica 0 hosts the store, so before closing it waits (at most the timeout) until
    every other replica has torn down too: the collectives themselves never need this
    (replica 0 returns from one only after every replica read it), but the torch process
    group's own connection to the store may still be in use on the others. Replicas that
    a collective already found gone are not waited for. Runs automatically at
    interpreter exit, then without the wait if an uncaught exception ends the process.

    Arguments:
        wait: False to leave at once (after a failed start, when the others are failing
            too and nobody would come to say goodbye).
    """
    ctx = context.current()
    with _LOCK:
        group, ctx.group = ctx.group, None
    if group is not None:
        group.close(wait)


def _teardown_at_exit() -> None:
    # An uncaught exception is ending this process (the interpreter keeps it in
    # sys.last_value for the atexit handlers): the job has failed, the others fail with
    # it, and replica 0 waiting for them to leave would only add a timeout to the exit.
    teardown(wait=getattr(sys, "last_value", None) is None)


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
