"""Which replica's failure caused a trial's failure, told from structured records.

When one replica of a job fails, the others fail soon after: a collective loses its peer
(a lost connection, a store that went away, a timeout). The trial's error must name the
replica that failed first in cause, not one of its echoes. Each replica's failure is kept
as a :class:`ReplicaFailure` (which replica, on which node, whether its process died, the
types of its exception and of the exceptions it was raised from, when it was caught) and
:func:`first_in_cause` orders them:

1. a replica whose process died (the others can only have lost it);
2. a replica whose exception is not of a lost-peer type (:data:`LOST_PEER_TYPES`);
3. the replica that failed first (``failed_at``; gloo reports a lost peer as a plain
   ``RuntimeError``, which only the order in time tells from a user's own error: the
   survivor's error always follows the cause, by the time the peer's socket closes or
   the collective's timeout runs out);
4. the lowest rank.

Pure functions and plain objects: nothing here needs Ray or torch.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable

__all__ = ["LOST_PEER_TYPES", "ReplicaFailure", "WorkerFailed", "exception_record",
           "first_in_cause", "first_line_of", "failure_message", "stop_timeout_error"]

# Exception types (``module.qualname``) that a replica gets because another one failed.
LOST_PEER_TYPES = frozenset({
    "builtins.ConnectionError",  # reset, refused, aborted, broken pipe (its subclasses)
    "builtins.TimeoutError",  # a peer that never answered
    "torch.distributed.DistError",  # TCPStore and c10d: DistNetworkError, DistStoreError...
    "adaptdl_core.collective.CollectiveError",  # the job's own collectives (and timeouts)
})


def _type_names(exc: BaseException) -> list[str]:
    """``module.qualname`` of ``exc``'s class and of every base class but ``object``."""
    return [f"{cls.__module__}.{cls.__qualname__}" for cls in type(exc).__mro__
            if cls is not object]


def exception_record(exc: BaseException, failed_at: float) -> dict:
    """What a replica reports about the exception that ended its function.

    Args:
        exc: the exception caught.
        failed_at: when it was caught (wall-clock seconds since the epoch).

    Returns:
        ``{"error_type": "module.qualname", "error_types": [...], "failed_at": failed_at}``:
        ``error_types`` lists the classes (with their bases) of ``exc`` and of every
        exception it was raised from or while handling, outermost first. Plain data, so
        that it crosses Ray's object store without the classes themselves.
    """
    names: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:  # a chain may loop
        seen.add(id(current))
        names.extend(n for n in _type_names(current) if n not in names)
        current = current.__cause__ or (None if current.__suppress_context__
                                        else current.__context__)
    return {"error_type": _type_names(exc)[0], "error_types": names, "failed_at": failed_at}


@dataclasses.dataclass(frozen=True)
class ReplicaFailure:
    """One replica's failure.

    Attributes:
        rank: the replica's rank in the job.
        node: the address of its node.
        died: True if its process died (then ``error_types`` is empty and ``failed_at``
            unknown).
        text: what to show: the traceback of an exception, or the first line of Ray's
            error for a process that died.
        error_types: ``module.qualname`` of the exception's classes and of the exceptions
            it was raised from (see :func:`exception_record`).
        failed_at: when the exception was caught (wall-clock seconds), ``None`` if unknown.
    """

    rank: int
    node: str
    died: bool
    text: str
    error_types: tuple[str, ...] = ()
    failed_at: float | None = None

    @classmethod
    def from_outcome(cls, rank: int, node: str, outcome: dict) -> "ReplicaFailure":
        """The failure a replica's ``{"status": "error", ...}`` outcome reports (its
        traceback and :func:`exception_record`; an outcome without the record, from a
        worker of an earlier version, counts as of no lost-peer type and unknown time)."""
        return cls(rank, node, died=False, text=outcome["traceback"],
                   error_types=tuple(outcome.get("error_types", ())),
                   failed_at=outcome.get("failed_at"))

    @property
    def lost_peer(self) -> bool:
        """Whether the exception is of a type another replica's failure causes."""
        return not self.died and any(t in LOST_PEER_TYPES for t in self.error_types)


def _cause_order(failure: ReplicaFailure) -> tuple:
    """Sort key: the failure most likely the cause first (see the module's docstring)."""
    when = failure.failed_at if failure.failed_at is not None else float("inf")
    return (not failure.died, failure.lost_peer, when, failure.rank)


def first_in_cause(failures: Iterable[ReplicaFailure]) -> ReplicaFailure:
    """The failure that caused the others.

    Raises:
        ValueError: if ``failures`` is empty.
    """
    ordered = sorted(failures, key=_cause_order)
    if not ordered:
        raise ValueError("failures must name at least one failed replica, got none")
    return ordered[0]


def failure_message(cause: ReplicaFailure, where: str, others: list[int]) -> str:
    """The trial's error text: ``<where> died (replicas [..] failed after it): <first line>``
    or ``<where> failed (...):`` and the traceback on the next lines.

    Args:
        cause: the failure :func:`first_in_cause` chose.
        where: the replica in words (``replica R of N on node IP``).
        others: the ranks of the replicas that failed too.
    """
    also = f" (replicas {others} failed after it)" if others else ""
    if cause.died:
        return f"{where} died{also}: {cause.text}"
    return f"{where} failed{also}:\n{cause.text}"


class WorkerFailed(RuntimeError):
    """A replica of the trial failed; the message carries its traceback.

    Attributes:
        failure: the replica's failure that caused the others (which replica, node,
            exception types; see :class:`~adaptdl_ray.replicas.failures.ReplicaFailure`), or
            ``None`` if the replica's worker itself broke.
        others: the ranks of the replicas that failed after it.
    """

    def __init__(self, message: str, failure: ReplicaFailure | None = None,
                 others: list[int] | None = None) -> None:
        super().__init__(message)
        self.failure = failure
        self.others = list(others or [])


def first_line_of(exc: BaseException) -> str:
    """An exception's first line, or its type's name if it has no text (Ray's actor errors
    run to a dozen lines of ids; the first says what happened)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def stop_timeout_error(ranks: list[int], timeout_s: float) -> TimeoutError:
    """The error for replicas ``ranks`` that took no stop within ``timeout_s`` seconds."""
    return TimeoutError(
        f"replicas {ranks} did not reach a batch boundary within {timeout_s:.0f} s of the "
        "stop request; the training function must iterate an AdaptiveDataLoader (the stop "
        "is taken at its batch boundaries)")
