"""Finding, starting and asking the cluster allocator (front-ends and the command line).

There is one allocator per Ray cluster and namespace: a named, detached actor
(:data:`ALLOCATOR_NAME`) in the Ray namespace :func:`namespace` (``ADAPTDL_RAY_NAMESPACE``,
default ``"adaptdl"``; every driver that uses the same one shares the cluster with the
others). It is started on first use (:func:`get_allocator` with ``create=True``) or by
``adaptdl-ray start``.

A front-end shares the cluster by giving its :class:`~adaptdl_core.decision.CoreDriver` an
:class:`AllocatorSolver`: each of its solves then goes to the allocator, which answers
with this front-end's share of a solve over every job on the cluster. If the allocator
cannot be reached, the solver solves locally (the front-end decides for its own jobs
alone, with one warning) and tries the allocator again at the next solve.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
import uuid
from typing import Any, Mapping

import ray

from adaptdl_core.decision import SolveRequest

LOG = logging.getLogger(__name__)

__all__ = ["ALLOCATOR_NAME", "DEFAULT_NAMESPACE", "NAMESPACE_ENV", "AllocatorSolver",
           "namespace", "get_allocator", "start_allocator", "default_state_dir",
           "new_member_id"]

#: The allocator actor's name in its namespace.
ALLOCATOR_NAME = "adaptdl_allocator"
#: Environment variable naming the Ray namespace of the allocator.
NAMESPACE_ENV = "ADAPTDL_RAY_NAMESPACE"
#: The namespace when the variable is unset.
DEFAULT_NAMESPACE = "adaptdl"
# How long a front-end waits for the allocator's answer before solving alone.
_CALL_TIMEOUT_S = 20.0
# After a failure, the allocator is asked again no sooner than this (seconds).
_RETRY_S = 10.0
# A request older than this when the allocator is first reached is solved locally.
_STALE_AFTER_S = 2.0


def namespace(name: str | None = None) -> str:
    """The allocator's Ray namespace: ``name``, else ``$ADAPTDL_RAY_NAMESPACE``, else
    ``"adaptdl"``.

    Raises:
        ValueError: an empty or non-string name."""
    value = name if name is not None else os.environ.get(NAMESPACE_ENV) or DEFAULT_NAMESPACE
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"the allocator's namespace must be a non-empty string, got "
                         f"{value!r} (set {NAMESPACE_ENV} or pass namespace=...)")
    return value


def default_state_dir(ns: str) -> str:
    """Where the allocator of namespace ``ns`` keeps its state unless told: a directory
    of this Ray cluster's session under the system's temporary directory (evaluated on
    the head node, where the allocator runs)."""
    session = ray.get_runtime_context().get_session_name()
    return os.path.join(tempfile.gettempdir(), "adaptdl-ray", session, ns)


class _AllocatorActor:
    """The actor class: builds the allocator in the actor's own process (its default
    state directory is on the head node, where the actor runs)."""

    def __init__(self, ns: str, state_dir: str | None, interval_s: float,
                 policy: str) -> None:
        from adaptdl_ray.cluster.allocator import ClusterAllocator
        self._allocator = ClusterAllocator(state_dir or default_state_dir(ns),
                                           interval_s=interval_s, policy=policy)

    def sync(self, *args: Any, **kwargs: Any) -> dict:
        return self._allocator.sync(*args, **kwargs)

    def leave(self, member: str, outcomes: Any = None) -> bool:
        return self._allocator.leave(member, outcomes)

    def jobs(self) -> list:
        return self._allocator.jobs()

    def status(self) -> dict:
        return self._allocator.status()

    def history(self) -> dict:
        return self._allocator.history()

    def set_autoscale(self, options: Any) -> Any:
        return self._allocator.set_autoscale(options)

    def ping(self) -> bool:
        return self._allocator.ping()


def get_allocator(namespace_name: str | None = None, *, create: bool = False,
                  state_dir: str | None = None, interval_s: float = 30.0,
                  policy: str = "pollux") -> Any | None:
    """The allocator of this cluster (needs a connected Ray), or ``None`` if none runs
    and ``create`` is false. With ``create``, it is started if missing (the other
    arguments only apply then: see :func:`start_allocator`)."""
    ns = namespace(namespace_name)
    try:
        return ray.get_actor(ALLOCATOR_NAME, namespace=ns)
    except ValueError:
        if not create:
            return None
    return start_allocator(ns, state_dir=state_dir, interval_s=interval_s, policy=policy)


def check_autoscale(options: Mapping[str, Any]) -> dict[str, Any]:
    """Autoscaling options as :meth:`ClusterAllocator.set_autoscale
    <adaptdl_ray.cluster.allocator.ClusterAllocator.set_autoscale>` takes them, checked
    here (no Ray needed); returns them as plain data.

    Raises:
        ValueError: an unknown or malformed option, named, with the fix."""
    from adaptdl_ray.cluster.allocator import autoscale_parts
    return autoscale_parts(options, request_fn=lambda **_: None)[0]


def start_allocator(namespace_name: str | None = None, *, state_dir: str | None = None,
                    interval_s: float = 30.0, policy: str = "pollux",
                    autoscale: Mapping[str, Any] | None = None) -> Any:
    """Start the cluster's allocator (or return the one running), pinned to the head node,
    detached (it outlives the driver that started it) and restarted by Ray if it dies.

    Args:
        state_dir: where it keeps its state (default :func:`default_state_dir`).
        interval_s: seconds after which it re-divides the cluster even when nothing
            changed.
        policy: ``"pollux"`` or ``"adaptdl"`` (see
            :func:`~adaptdl_core.policy.policy_by_name`).
        autoscale: ``None`` leaves the allocator's autoscaling as it is; ``{}`` turns
            it off; options (see :func:`check_autoscale`) turn it on, also on an
            allocator already running.

    Raises:
        ValueError: an unknown policy, a bad namespace or bad autoscaling options."""
    from adaptdl_core.policy import POLICY_NAMES
    if policy not in POLICY_NAMES:
        raise ValueError(f"policy must be one of {sorted(POLICY_NAMES)}, got {policy!r}")
    if autoscale:
        autoscale = check_autoscale(autoscale)
    ns = namespace(namespace_name)
    options = dict(name=ALLOCATOR_NAME, namespace=ns, lifetime="detached",
                   get_if_exists=True, num_cpus=0, max_restarts=-1, max_concurrency=1,
                   resources={"node:__internal_head__": 0.001})
    handle = ray.remote(_AllocatorActor).options(**options).remote(
        ns, state_dir, float(interval_s), policy)
    ray.get(handle.ping.remote(), timeout=60)
    if autoscale is not None:
        ray.get(handle.set_autoscale.remote(dict(autoscale) or None), timeout=60)
    return handle


def new_member_id(kind: str) -> str:
    """A unique id for one front-end (``kind`` and the driver's Ray job id first)."""
    try:
        job = ray.get_runtime_context().get_job_id()
    except Exception:  # noqa: BLE001 - not connected: the id stays unique without it
        job = "nojob"
    return f"{kind}-{job}-{uuid.uuid4().hex[:8]}"


class AllocatorSolver:
    """A :class:`~adaptdl_core.decision.CoreDriver` solver that solves with the cluster
    allocator (called in the driver's worker thread).

    Args:
        member: this front-end's unique id (:func:`new_member_id`).
        label: its name for people (``adaptdl-ray ls`` shows it as the experiment).
        interval_s: the front-end's own solve interval (its lease follows from it).
        kind: ``"tune"`` for an experiment, ``"job"`` for a command-line job.
        namespace_name: the allocator's namespace (see :func:`namespace`).
        timeout_s: seconds to wait for an answer before solving alone.
        policy: the allocator's policy if this solver starts it (see
            :func:`start_allocator`).
        owner: who runs the front-end (``user@host``; default: this process's), shown by
            ``adaptdl-ray ls``.
    """

    def __init__(self, member: str, label: str, *, interval_s: float, kind: str = "tune",
                 namespace_name: str | None = None, timeout_s: float = _CALL_TIMEOUT_S,
                 policy: str = "pollux", owner: str | None = None) -> None:
        from adaptdl_ray.cluster.owner import current_owner
        self.member = member
        self.label = label
        self.owner = owner or current_owner()
        self.interval_s = float(interval_s)
        self.kind = kind
        self.namespace = namespace(namespace_name)
        self.timeout_s = float(timeout_s)
        self.policy = policy
        self._handle: Any = None
        #: Whether the latest solve was made alone (the allocator was not reached).
        self.alone = False
        self._retry_at = -float("inf")

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_handle"] = None  # an actor handle is bound to one driver
        return state

    def __call__(self, request: SolveRequest) -> None:
        """Fill ``request`` in with this front-end's share of the cluster, or solve it
        here if the allocator cannot be reached."""
        if time.monotonic() < self._retry_at:
            request.run()
            return
        t0 = time.perf_counter()
        try:
            if self._handle is None:
                self._handle = get_allocator(self.namespace, create=True,
                                             interval_s=self.interval_s, policy=self.policy)
                if time.perf_counter() - t0 > _STALE_AFTER_S:
                    # Starting the allocator took long: the request describes the jobs
                    # as they were before (trials since started would pass for other
                    # work). Solve this one here; the next goes to the allocator fresh.
                    LOG.debug("the cluster allocator took %.1f s to start; this solve is "
                              "made alone", time.perf_counter() - t0)
                    request.run()
                    return
            reply = ray.get(self._handle.sync.remote(
                self.member, request.to_plain(), label=self.label,
                interval_s=self.interval_s, kind=self.kind, owner=self.owner),
                timeout=self.timeout_s)
            request.accept(reply["allocations"], reply.get("unfit"),
                           solve_time_s=float(reply.get("solve_s") or 0.0),
                           seconds=time.perf_counter() - t0, reasons=reply.get("reasons"))
        except Exception as exc:  # noqa: BLE001 - any failure: decide alone, say it once
            self._handle = None
            self._retry_at = time.monotonic() + _RETRY_S
            if not self.alone:
                LOG.warning("could not reach the cluster allocator (%s: %s): %s %r decides "
                            "for its own jobs alone until it is back", type(exc).__name__,
                            str(exc).splitlines()[0] if str(exc) else "", self.kind,
                            self.label)
            self.alone = True
            request.run()
            return
        if self.alone:
            LOG.warning("the cluster allocator is back: %s %r shares the cluster again",
                        self.kind, self.label)
        self.alone = False

    def leave(self, outcomes: Mapping[str, str] | None = None, timeout_s: float = 5.0) -> None:
        """Tell the allocator this front-end ended (its jobs' share is freed at once;
        ``outcomes``: job id -> how it ended, for listings); failures are ignored (its
        lease runs out instead)."""
        if self._handle is None:
            return
        try:
            ray.get(self._handle.leave.remote(self.member, outcomes), timeout=timeout_s)
        except Exception as exc:  # noqa: BLE001 - the lease frees it later
            LOG.debug("could not tell the allocator that %s ended: %s", self.member, exc)
