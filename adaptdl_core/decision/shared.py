"""One cluster shared by several front-ends: a single solve over every front-end's jobs.

Each front-end (a Tune experiment's scheduler, a command-line job) runs its own
:class:`~adaptdl_core.decision.DecisionCore`: its records, resize verdicts and costs stay
its own. Only the solve is shared: when a front-end's core solves, its
:class:`~adaptdl_core.decision.CoreDriver` sends the solve's inputs
(:meth:`SolveRequest.to_plain`) to :class:`SharedSolve`, which keeps the latest jobs of
every front-end (a *member*), re-divides the whole cluster among all of them with one
policy (one power-mean objective over every job, so experiments and users are weighed
by their jobs' goodput, not by who asked first), and answers each member with its own
jobs' share.

The rules, each in one place:

* **When** the cluster is re-divided: when a member's set of jobs changed, a member
  joined, left or expired, the nodes changed, a job has no share yet, or ``interval_s``
  passed since the last solve. Otherwise a member gets the standing shares (its own core
  already limits how often it asks).
* **Members that vanish** (a driver that died without leaving) expire after their lease:
  ``lease_s`` (default three times the longest interval among the members, at least
  ``MIN_LEASE_S``) without a sync, and their jobs' share is freed.
* **Capacity held by other work** (plain Ray tasks, other libraries) is not the jobs' to
  divide: :func:`capacity_left` subtracts it, node by node, from what the cluster holds.
* **State**: every member's latest jobs, the standing shares and each job's history are
  plain JSON (:meth:`SharedSolve.to_json`), so a restarted allocator continues with every
  job's place, age and history.
* **Ended jobs** stay listed (:meth:`SharedSolve.rows`) with how they ended, the most
  recent ``ENDED_KEPT`` of them: a finished trial does not vanish from ``adaptdl-ray ls``.

No Ray here: the Ray actor that hosts this object is :mod:`adaptdl_ray.cluster.allocator`.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import math
import time
from typing import Any, Callable, Hashable, Mapping

from adaptdl_core import validation
from adaptdl_core.policy import NodeInfo, warn_if_type_unaware

from .solve_request import SolveRequest
from .jobs import allocation_policy, checked_nodes, speedup_from_hints

LOG = logging.getLogger(__name__)

__all__ = ["SharedSolve", "MemberRecord", "capacity_left", "job_key", "MIN_LEASE_S",
           "LEASE_INTERVALS", "ENDED_KEPT"]

#: A member that has not synced for this many of its intervals has expired.
LEASE_INTERVALS = 3.0
#: ... but never sooner than this (seconds): a driver busy saving must not lose its jobs.
MIN_LEASE_S = 120.0
#: How many ended jobs the listing keeps (the most recent).
ENDED_KEPT = 200
# Between a job key's member and job parts (member names may hold "/", job ids rarely "\x1f").
_SEP = "\x1f"


def job_key(member: str, job_id: str) -> str:
    """The cluster-wide key of ``job_id`` of ``member``."""
    return f"{member}{_SEP}{job_id}"


def capacity_left(totals: Mapping[Hashable, Mapping[str, float]],
                  available: Mapping[Hashable, Mapping[str, float]],
                  held: Mapping[Hashable, Mapping[str, float]],
                  types: Mapping[Hashable, str | None] | None = None
                  ) -> dict[Hashable, NodeInfo]:
    """What the shared solve may divide: each node's total resources less what other work
    holds there (``total - available - held``, never below zero), where ``held`` is what
    the known jobs hold on the node. Nodes with nothing left keep an entry (empty) only
    when they had some capacity.

    Args:
        totals: node -> resource -> total amount.
        available: node -> resource -> amount free now (a node missing here is taken as
            fully used by what runs there).
        held: node -> resource -> amount the shared jobs hold there.
        types: node -> its accelerator type (``None``, or a node missing: none known),
            kept on each node's :class:`NodeInfo` so the policy weighs types.
    """
    out: dict[Hashable, NodeInfo] = {}
    for node, total in totals.items():
        free = available.get(node, {})
        ours = held.get(node, {})
        room = {}
        for name, amount in total.items():
            other = max(0.0, float(amount) - float(free.get(name, 0.0))
                        - float(ours.get(name, 0.0)))
            left = float(amount) - other
            if left > 1e-9:
                room[name] = left
        out[node] = NodeInfo(room, accelerator_type=(types or {}).get(node))
    return out


@dataclasses.dataclass
class MemberRecord:
    """What the shared solve knows of one front-end.

    Attributes:
        label: how people know it (an experiment's name, a job's name).
        seen: clock time of its latest sync (seconds).
        lease_s: seconds without a sync after which it expires.
        jobs: job id -> its latest entry (:meth:`SolveRequest.to_plain`'s ``"jobs"``).
        kind: what kind of front-end it is (``"tune"``, ``"job"``, ...), for listings.
        owner: who runs it (``user@host``), for listings.
    """

    label: str
    seen: float
    lease_s: float
    jobs: dict = dataclasses.field(default_factory=dict)
    kind: str = "tune"
    owner: str | None = None


class SharedSolve:
    """Divides one cluster among the jobs of every member that syncs with it.

    Args:
        policy: an allocation policy (anything with ``allocate(jobs, nodes, base,
            now=...)``) or a name of :func:`~adaptdl_core.policy.policy_by_name`; default
            ``PolluxPolicy(p=-1, fair_share=True)``, as each front-end's own default.
        clock: returns the current time in seconds (the members' jobs' creation times
            must be on the same clock: wall-clock time for Ray front-ends).
        interval_s: seconds after which a sync re-divides the cluster even when nothing
            changed (finite, ``> 0``).
        lease_s: seconds without a sync after which a member expires; ``None``: per
            member, ``LEASE_INTERVALS`` times its own interval, at least ``MIN_LEASE_S``.

    Raises:
        TypeError, ValueError: a policy without ``allocate`` or an unknown name, a clock
            that is not callable, a bad interval or lease.
    """

    def __init__(self, policy: Any = None, *, clock: Callable[[], float] = time.time,
                 interval_s: float = 30.0, lease_s: float | None = None) -> None:
        policy = allocation_policy(policy)
        if not callable(clock):
            raise TypeError(f"clock must be a function returning seconds, got {clock!r}")
        validation.number("interval_s", interval_s, 0.0, low_open=True,
                          what="a finite number of seconds")
        if lease_s is not None:
            validation.number("lease_s", lease_s, 0.0, low_open=True,
                              what="None or a finite number of seconds")
        self.policy = policy
        self.clock = clock
        self.interval_s = float(interval_s)
        self.lease_s = None if lease_s is None else float(lease_s)
        self.members: dict[str, MemberRecord] = {}
        #: Job key -> node ids of its standing share (one per replica).
        self.shares: dict[str, list] = {}
        #: Job key -> ``[time, replicas]`` each time its share changed.
        self.history: dict[str, list] = {}
        #: Job key -> why the cluster cannot hold it.
        self.unfit: dict[str, str] = {}
        #: Job key -> why the latest solve kept it below its maximum with room left.
        self.reasons: dict[str, str] = {}
        #: Rows (see :meth:`rows`) of the most recently ended jobs, oldest first.
        self.ended: list[dict[str, Any]] = []
        self.num_solves = 0
        self.last_solve = -math.inf
        #: Seconds each solve took (most recent last, at most 1000 kept).
        self.solve_times_s: list[float] = []
        self._nodes: dict[Hashable, NodeInfo] = {}
        # The latest (totals, available) reading given to set_usage, and what the
        # members' jobs held when it was given; None before the first.
        self._usage: tuple[dict, dict, dict] | None = None
        self._types: dict = {}  # node -> accelerator type, from the latest reading
        self._dirty = True
        self._speedups: dict[str, tuple[Any, Any]] = {}

    # -- events ---------------------------------------------------------------------
    def set_nodes(self, nodes: Mapping[Hashable, NodeInfo]) -> None:
        """The capacity to divide now (see :func:`capacity_left`); a change re-divides.

        Raises:
            TypeError: a value that is not a NodeInfo."""
        nodes = checked_nodes(nodes)
        if nodes != self._nodes:
            self._nodes = nodes
            self._dirty = True
            warn_if_type_unaware(self.policy, nodes)

    def set_usage(self, totals: Mapping[Hashable, Mapping[str, float]],
                  available: Mapping[Hashable, Mapping[str, float]],
                  types: Mapping[Hashable, str | None] | None = None) -> None:
        """The cluster as read from its resource manager: what each node has (``totals``)
        and what is free there now (``available``), node -> resource -> amount. The
        capacity to divide is then :func:`capacity_left` of this reading and what the
        members' jobs hold, recomputed whenever a member reports its jobs: the jobs of a
        member seen for the first time are not taken for other work (the reading already
        shows their resources as used), nor are jobs that ended after the reading (it
        still shows theirs as used): what ours hold is, per node and resource, the most
        they held at any report since the reading. ``types``: node -> accelerator type
        (see :func:`capacity_left`)."""
        self._types = dict(types or {})
        self._usage = ({k: dict(v) for k, v in totals.items()},
                       {k: dict(v) for k, v in available.items()}, self.held())
        self._apply_usage()

    def _apply_usage(self) -> None:
        if self._usage is None:
            return
        totals, available, ours = self._usage
        for node, room in self.held().items():  # ours grows to the most held since
            mine = ours.setdefault(node, {})
            for name, amount in room.items():
                mine[name] = max(mine.get(name, 0.0), amount)
        self.set_nodes(capacity_left(totals, available, ours, self._types))

    @property
    def nodes(self) -> dict[Hashable, NodeInfo]:
        """The capacity as last given to :meth:`set_nodes` (or computed from
        :meth:`set_usage`)."""
        return self._nodes

    def sync(self, member: str, request: Mapping[str, Any], *, label: str | None = None,
             interval_s: float | None = None, kind: str = "tune",
             owner: str | None = None) -> dict[str, Any]:
        """A member's solve: record its jobs (``request``: :meth:`SolveRequest.to_plain`
        output, its complete list of live jobs), re-divide the cluster if due, and
        answer its jobs' shares.

        Args:
            member: the front-end's unique id.
            label: its name for people (default: ``member``).
            interval_s: the member's own solve interval (its lease follows from it).
            kind: what kind of front-end it is (for listings).
            owner: who runs it (``user@host``, for listings).

        Returns:
            ``{"allocations": {job id: [node ids]}, "unfit": {job id: reason},
            "reasons": {job id: why it is kept below its maximum}, "solve_s": seconds of
            the policy's solve, "solved": whether this call re-divided the cluster}``.

        Raises:
            ValueError: a malformed request (named)."""
        if not isinstance(member, str) or not member:
            raise ValueError(f"member must be a non-empty string, got {member!r}")
        jobs = request.get("jobs") if isinstance(request, Mapping) else None
        if not isinstance(jobs, Mapping):
            raise ValueError("request must be SolveRequest.to_plain() output (a dict with "
                             f"'jobs'), got {request!r}")
        now = float(self.clock())
        lease = self.lease_s if self.lease_s is not None else max(
            MIN_LEASE_S, LEASE_INTERVALS * float(interval_s or self.interval_s))
        record = self.members.get(member)
        if record is None:
            record = self.members[member] = MemberRecord(label or member, now, lease, {}, kind)
            self._dirty = True
        record.seen, record.lease_s, record.kind = now, lease, kind
        if label:
            record.label = label
        if owner:
            record.owner = owner
        if set(record.jobs) != set(jobs):
            self._dirty = True
        outcomes = request.get("ended") or {}
        self._end_rows(member, {j: job for j, job in record.jobs.items() if j not in jobs},
                       {str(k): (v or {}).get("outcome") for k, v in outcomes.items()})
        for job_id, job in jobs.items():
            old = record.jobs.get(job_id)
            if old is not None and old.get("hints") == job.get("hints"):
                # The same hints object keeps the speedup cache hitting.
                job = dict(job, hints=old.get("hints"))
            record.jobs[str(job_id)] = dict(job)
        for job_id in [j for j in record.jobs if j not in jobs]:
            del record.jobs[job_id]
        self.expire()
        self._apply_usage()
        missing = any(job_key(member, j) not in self.shares for j in record.jobs)
        solved = False
        if self._dirty or missing or now - self.last_solve >= self.interval_s:
            self.solve()
            solved = True
        return self.answer(member, solved=solved)

    def answer(self, member: str, *, solved: bool = False) -> dict[str, Any]:
        """The standing shares of ``member``'s jobs (see :meth:`sync`)."""
        record = self.members.get(member)
        jobs = record.jobs if record is not None else {}
        allocations = {j: list(self.shares.get(job_key(member, j), [])) for j in jobs}
        unfit = {j: self.unfit[job_key(member, j)] for j in jobs
                 if job_key(member, j) in self.unfit}
        reasons = {j: self.reasons[job_key(member, j)] for j in jobs
                   if job_key(member, j) in self.reasons}
        return {"allocations": allocations, "unfit": unfit, "reasons": reasons,
                "solved": solved,
                "solve_s": self.solve_times_s[-1] if self.solve_times_s else 0.0}

    def leave(self, member: str, outcomes: Mapping[str, str] | None = None,
              outcome: str = "ended") -> bool:
        """The member ended (its experiment finished): its jobs' share is freed at the
        next solve; its jobs are listed as ended, each with its ``outcomes`` entry (job id
        -> a word), else ``outcome``. Returns whether it was known."""
        record = self.members.get(member)
        if record is None:
            return False
        self._end_rows(member, record.jobs, dict(outcomes or {}), outcome)
        del self.members[member]
        self._forget_jobs(member, record.jobs)
        self._dirty = True
        return True

    def expire(self) -> list[str]:
        """Drop the members whose lease ran out; returns their ids."""
        now = float(self.clock())
        gone = [m for m, r in self.members.items() if now - r.seen > r.lease_s]
        for member in gone:
            LOG.warning("%s %r sent nothing for %.0f s: its jobs' share of the cluster is "
                        "freed", self.members[member].kind, self.members[member].label,
                        now - self.members[member].seen)
            self.leave(member, outcome="lost")
        return gone

    def _end_rows(self, member: str, jobs: Mapping[str, Any],
                  outcomes: Mapping[str, str | None], outcome: str = "ended") -> None:
        """List ``jobs`` of ``member`` as ended (their last rows, with ``status`` how they
        ended), keeping the most recent :data:`ENDED_KEPT`."""
        if not jobs:
            return
        now = float(self.clock())
        rows = {r["name_key"]: r for r in self._rows(member, jobs)}
        for job_id in jobs:
            row = rows[job_key(member, job_id)]
            del row["name_key"]
            row.update(status=outcomes.get(job_id) or outcome, replicas=0, target=0,
                       reason=None, ended=now)
            self.ended.append(row)
        del self.ended[:-ENDED_KEPT]

    def _forget_jobs(self, member: str, jobs: Mapping[str, Any]) -> None:
        now = float(self.clock())
        for job_id in jobs:
            key = job_key(member, job_id)
            if self.shares.pop(key, None):
                self.history.setdefault(key, []).append([now, 0])
            self.unfit.pop(key, None)
            self._speedups.pop(key, None)

    # -- the solve ------------------------------------------------------------------
    def solve(self) -> None:
        """Re-divide the cluster among every member's jobs now. A failure of the policy
        is logged and the standing shares stay."""
        now = float(self.clock())
        jobs = self._all_jobs()
        try:
            totals = None if self._usage is None else \
                {k: NodeInfo(v) for k, v in self._usage[0].items()}
            request = SolveRequest.from_plain(now, self._nodes, jobs, self.policy,
                                              self._speedup_for, totals)
        except ValueError as exc:
            LOG.warning("a member sent a malformed job (%s); the shares stay", exc)
            return
        request.run()
        self._dirty = False
        self.last_solve = now
        self.solve_times_s.append(request.seconds)
        del self.solve_times_s[:-1000]
        if request.error is not None:
            LOG.warning("the shared allocation failed (%s); the shares stay", request.error)
            return
        self.num_solves += 1
        allocations = request.result.allocations if request.result is not None else {}
        self.unfit = dict(request.unfit)
        self.reasons = dict(request.reasons)
        for key in jobs:
            share = list(allocations.get(key, []))
            if len(share) != len(self.shares.get(key, [])) or key not in self.shares:
                self.history.setdefault(key, []).append([now, len(share)])
            self.shares[key] = share
        for key in [k for k in self.shares if k not in jobs]:  # ended since the last solve
            if self.shares.pop(key):
                self.history.setdefault(key, []).append([now, 0])

    def _all_jobs(self) -> dict[str, Any]:
        """Job key -> latest entry, over every member."""
        return {job_key(m, j): job for m, r in self.members.items() for j, job in r.jobs.items()}

    def desired_size(self, rule: Any, current_nodes: int) -> Any:
        """How many nodes of ``rule``'s template the cluster should have for every
        member's jobs (:meth:`ClusterSizeRule.decide
        <adaptdl_core.policy.ClusterSizeRule.decide>`), each job bounded by what
        ``rule.max_nodes`` template nodes hold, so a job waiting for room counts.

        Args:
            rule: a :class:`~adaptdl_core.policy.ClusterSizeRule`.
            current_nodes: template nodes the cluster has now.

        Returns:
            the rule's :class:`~adaptdl_core.policy.ClusterSizeDecision`.

        Raises:
            ValueError: a malformed job entry or ``current_nodes`` (named)."""
        now = float(self.clock())
        template = NodeInfo(rule.node_template)
        nodes = {f"template-{i}": template for i in range(rule.max_nodes)}
        request = SolveRequest.from_plain(now, nodes, self._all_jobs(), self.policy,
                                          self._speedup_for)
        return rule.decide(request.job_infos(), current_nodes, now=now)

    def _speedup_for(self, key: Hashable, hints: Any) -> Any:
        cached = self._speedups.get(key)
        if cached is not None and cached[0] is hints:
            return cached[1]
        fn = speedup_from_hints(hints)
        self._speedups[key] = (hints, fn)
        return fn

    # -- what it holds --------------------------------------------------------------
    def held(self) -> dict[Hashable, dict[str, float]]:
        """node -> resource -> amount the members' jobs hold there now: on each node, the
        more of a job's current placement (as its member reported it) and its share (a
        job starting or growing into its share reserves it before it reports running
        there: that reservation is the job's, not other work)."""
        out: dict[Hashable, dict[str, float]] = {}
        for member, record in self.members.items():
            for job_id, job in record.jobs.items():
                resources = (job.get("spec") or {}).get("resources") or {}
                placed = collections.Counter(job.get("base") or [])
                shared = collections.Counter(self.shares.get(job_key(member, job_id), []))
                for node in set(placed) | set(shared):
                    count = max(placed[node], shared[node])
                    room = out.setdefault(node, {})
                    for name, amount in resources.items():
                        room[name] = room.get(name, 0.0) + float(amount) * count
        return out

    def rows(self) -> list[dict[str, Any]]:
        """One dict per job on the cluster, for listings and metrics: ``name`` (as people
        know it), ``experiment`` (its member's label), ``kind``, ``owner``, ``status``
        (``running``, ``waiting``; for the ended jobs kept, how they ended), ``replicas``
        (now), ``target`` (its share), ``max_replicas``, ``nodes`` (distinct nodes it runs
        on), ``batch_size`` and ``goodput`` (samples/s) predicted at its size from its
        hints (``None`` before its model is fitted), ``restarts``, ``age_s``, ``reason``
        (why it runs below its maximum with room left, else ``None``) and ``member``."""
        live = [row for member, record in self.members.items()
                for row in self._rows(member, record.jobs)]
        for row in live:
            del row["name_key"]
        # (An ended job's age is how long it lived.)
        ended = [dict(row, age_s=max(0.0, row["ended"] - row["created"])) for row in self.ended]
        return live + ended

    def _rows(self, member: str, jobs: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The rows of some of ``member``'s jobs, as :meth:`rows` describes them (with
        ``name_key``, their job key, and ``created``)."""
        now = float(self.clock())
        record = self.members[member]
        out = []
        for job_id, job in jobs.items():
            current = int(job.get("current") or 0)
            base = job.get("base") or []
            batch, goodput = _predicted(job.get("hints"), len(set(base)) or 1, current)
            key = job_key(member, job_id)
            created = float(job.get("created") or now)
            out.append({"name": job.get("name") or job_id, "experiment": record.label,
                        "kind": record.kind, "owner": record.owner,
                        "status": "running" if current else "waiting",
                        "replicas": current, "target": len(self.shares.get(key, [])),
                        "max_replicas": (job.get("spec") or {}).get("max_replicas"),
                        "nodes": len(set(base)), "batch_size": batch, "goodput": goodput,
                        "restarts": int(job.get("restarts") or 0),
                        "age_s": max(0.0, now - created), "created": created,
                        "reason": self.reasons.get(key), "member": member, "name_key": key})
        return out

    def status(self) -> dict[str, Any]:
        """Counters: members, jobs, solves, the last solve's seconds, the nodes' capacity."""
        return {"members": len(self.members),
                "jobs": sum(len(r.jobs) for r in self.members.values()),
                "solves": self.num_solves,
                "last_solve_s": self.solve_times_s[-1] if self.solve_times_s else None,
                "nodes": {str(k): dict(v.resources) for k, v in self._nodes.items()}}

    # -- persistence ----------------------------------------------------------------
    def to_json(self) -> str:
        """Everything a restarted allocator needs (strict JSON)."""
        return json.dumps({"members": {m: vars(r) for m, r in self.members.items()},
                           "shares": self.shares, "history": self.history,
                           "num_solves": self.num_solves, "ended": self.ended},
                          allow_nan=False, separators=(",", ":"))

    def restore(self, text: str) -> None:
        """Continue from :meth:`to_json` output: members (each with a fresh lease from
        now, so a restart does not expire them), shares and history.

        Raises:
            ValueError: malformed content."""
        try:
            data = json.loads(text)
            known = {f.name for f in dataclasses.fields(MemberRecord)}
            members = {m: MemberRecord(**{k: v for k, v in r.items() if k in known})
                       for m, r in data.get("members", {}).items()}
            shares = {k: list(v) for k, v in data.get("shares", {}).items()}
            history = {k: list(v) for k, v in data.get("history", {}).items()}
            num_solves = int(data.get("num_solves", 0))
            ended = [dict(r) for r in data.get("ended", [])]
        except (TypeError, AttributeError, ValueError) as exc:
            raise ValueError(f"malformed shared-solve state: {exc}") from exc
        now = float(self.clock())
        for record in members.values():
            record.seen = now
        self.members, self.shares, self.history = members, shares, history
        self.num_solves = num_solves
        self.ended = ended[-ENDED_KEPT:]
        self._speedups.clear()
        self._dirty = True


def _predicted(hints: Any, nodes: int, replicas: int) -> tuple[int | None, float | None]:
    """(batch size, goodput in samples/s) a job's hints predict at its size, or its
    initial batch and ``None`` before its model is fitted."""
    if not isinstance(hints, Mapping) or "init_batch_size" not in hints:
        return None, None
    try:
        from adaptdl_core.sched_hints import SchedHints
        parsed = SchedHints.from_dict(hints)
        fn = parsed.goodput_function()
        if fn is None or replicas < 1:
            return parsed.init_batch_size, None
        goodput, atomic, accum = fn.optimize(
            nodes, replicas, parsed.max_batch_size or parsed.init_batch_size,
            parsed.local_bsz_bounds, parsed.gradient_accumulation)
        batch = int(round(float(atomic) * replicas * (float(accum) + 1)))
        return batch, float(goodput)
    except (ValueError, TypeError):
        return None, None

