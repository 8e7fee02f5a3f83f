"""The decision core: which job runs with how many replicas where, and why (no Ray, no Tune).

A front-end (the Ray Tune scheduler, the trace-driven simulator, a cluster service) feeds
the core plain events and acts on its plain answers::

    core = DecisionCore(clock=sim_clock)            # any policy with .allocate(...)
    core.set_nodes({"n0": NodeInfo({"GPU": 4})})    # the cluster, whenever it changes
    core.add_job("j1", JobSpec({"GPU": 1}))         # arrival
    core.update("j1", hints=..., progress=JobProgress(remaining_s=600.0, restarts=1))
    core.running("j1", nodes=["n0", "n0"])          # what it holds now
    for job_id, d in core.decide().items():         # re-solves only when due
        ...                                          # d.action: start/resize/hold/keep/wait
    core.remove("j1")                                # finished, failed or removed

The rules, each applied here and nowhere else:

* **When** the policy re-solves: when jobs or nodes were added or removed since the last
  solve (a burst of events before the next :meth:`DecisionCore.decide` is one solve; with
  ``min_event_gap_s`` event-driven solves are also spaced in time), and otherwise every
  ``interval_s`` seconds. Between solves the standing targets are answered.
* **Jobs for the policy** (:func:`~adaptdl_core.decision.job_info`): a speedup function
  from the job's hints (the linear prior before it has a fit; built once per hints and
  reused), bounded exploration, min/max replicas, and the restart penalty with the job's
  resize cost: its last measured resize, else its launch time, else the policy's prior.
* **Shared profiles**: jobs of one ``JobSpec.profile_group`` (e.g. the trials of a sweep,
  which train the same model) are modelled with the throughput profile of the group's
  most widely profiled job until their own covers as many replicas
  (:func:`~adaptdl_core.decision.group_hints`), so a new trial starts at the size the
  group's profile supports instead of one replica.
* **Finishing jobs** (less training left than ``MIN_COST_MULTIPLES`` resize costs) are
  pinned where they are (non-preemptible for that solve), and so are jobs the front-end
  reports restarting (``JobProgress.restarting``).
* **Placement of a running job** is what the front-end reported, else the policy's last
  placement when its size matches, else a packing guess.
* **Per resize**, the job's own check (``resize_rule``, by default
  :func:`~adaptdl_core.policy.resize_verdict`): a proposed resize that does not pay is a
  ``hold`` with the reason (logged once per reason); every resize carried out is recorded
  with its reason, predicted saving and assumed cost, and later its measured cost.
* **Accelerator types**: on nodes of several types (``NodeInfo.accelerator_type``) the
  core keeps each job's hints per type it reported from (the hints' ``"accelerator_type"``
  key, else the type of the nodes it runs on) and its profile group's best per type, and
  gives the policy each job's speedup on every type
  (:mod:`~adaptdl_core.decision.type_models`: measured, borrowed from the group, or
  projected). A move to another type is a resize, checked by
  :func:`~adaptdl_core.policy.move_verdict`.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import math
import time
from typing import Any, Callable, Hashable, Mapping, Sequence

import numpy as np

from adaptdl_core import validation
from adaptdl_core.policy import (DEFAULT_RESTART_COST_S, MIN_COST_MULTIPLES, NodeInfo,
                                 ResizeVerdict, mixed_types, move_verdict,
                                 common_type, node_types, placement_type, resize_verdict,
                                 warn_if_type_unaware)

from .jobs import (JobSpec, allocation_policy, check_profile_group,
                   checked_nodes, cluster_capacity, group_hints, job_info, pack_guess,
                   profiled_extent, speedup_from_hints)
from .resize_cost import CostSample, ResizeCostEstimate, estimate_resize_cost
from .solve_request import SolveEntry, SolveRequest
from .state import CoreState, JobRecord
from .type_models import TypeSpeeds, typed_hints

LOG = logging.getLogger(__name__)

__all__ = ["Action", "Decision", "DecisionCore", "JobProgress", "ACTIONS"]


class Action(str, enum.Enum):
    """What a :class:`Decision` tells the front-end to do with a job.

    A ``str`` enum: each member equals (and prints as) its value, so ``d.action ==
    "resize"`` and state files or logs that hold the plain strings keep working.
    """

    START = "start"    #: (not running) start it with ``replicas``
    RESIZE = "resize"  #: (running) relaunch it with ``replicas`` (the new size pays)
    HOLD = "hold"      #: (running) the policy wants another size, which does not pay
    KEEP = "keep"      #: (running) no change
    WAIT = "wait"      #: (not running) nothing for it now

    def __str__(self) -> str:
        return self.value  # (Python 3.11 would print "Action.START" in f-strings)

    # As the string's: a dict keyed by "resize" finds Action.RESIZE (Enum hashes the name).
    __hash__ = str.__hash__


#: The actions a :class:`Decision` may carry (the :class:`Action` members).
ACTIONS = tuple(Action)


@dataclasses.dataclass(frozen=True)
class JobProgress:
    """What a job reports about its progress (every field optional: ``None`` = not known
    or unchanged).

    Attributes:
        remaining_s: estimated seconds of training left at its current size.
        restarts: checkpoint-restarts it has gone through so far (a count that grows with
            each relaunch; the first report after a growth closes a pending resize).
        resize_cost_s: measured seconds its latest relaunch cost; taken as the job's
            resize cost when it arrives with a grown ``restarts`` after a resize the
            front-end carried out (a relaunch after a failure is not a resize).
        launch_s: seconds its latest launch took to its first step (a resize costs at
            least that).
        restarting: the job is checkpointing or relaunching now (it has not trained since
            its latest start or resize). A restarting job keeps its allocation in the
            next solve, as a finishing one does: moving it would waste the restart it is
            paying for (the Sia scheduler's rule).
    """

    remaining_s: float | None = None
    restarts: int | None = None
    resize_cost_s: float | None = None
    launch_s: float | None = None
    restarting: bool | None = None


@dataclasses.dataclass(frozen=True)
class Decision:
    """The core's answer for one job.

    Attributes:
        job_id: the job.
        action: an :class:`Action` (given as one or as its value): ``start`` (not
            running, gets ``replicas``), ``resize`` (running, the new size pays), ``hold``
            (running, the policy wants another size but it does not pay: ``reason`` says
            why), ``keep`` (running, no change), ``wait`` (not running, gets nothing now).
        replicas: the target replica count (for hold/keep: the current one).
        nodes: node ids, one per replica, of the target (for hold/keep: the current
            placement as the core knows it).
        reason: one line for logs and users.
        saved_s: predicted seconds a growth saves over the job's remaining training, if
            computed.
        cost_s: seconds one resize of the job is assumed to cost (for start, resize and
            hold).
        proposed: the replica count the policy proposed (differs from ``replicas`` for
            a hold).
        accelerator_type: on a cluster of several accelerator types, the one type of
            the nodes in ``nodes`` (the type the solve chose for a start or resize; the
            type it runs on for hold/keep), which the front-end places the replicas on;
            ``None`` on a cluster of one type or none, or when the nodes are of no one
            known type (see :func:`~adaptdl_core.policy.placement_type`). A resize may
            change only this: a move to another type, carried out as a resize.
    """

    job_id: Hashable
    action: Action
    replicas: int
    nodes: tuple
    reason: str
    saved_s: float | None = None
    cost_s: float | None = None
    proposed: int | None = None
    accelerator_type: str | None = None

    def __post_init__(self) -> None:
        """The action as an :class:`Action` member.

        Raises:
            ValueError: an action that is none of them (names the allowed values).
        """
        try:
            object.__setattr__(self, "action", Action(self.action))
        except ValueError:
            raise ValueError(f"action must be one of {[a.value for a in Action]}, got "
                             f"{self.action!r}") from None


def _check_number(name: str, value: Any, *, minimum: float | None = None,
                  allow_none: bool = True) -> float | None:
    """``value`` as a float (see :func:`adaptdl_core.validation.number`), or ``None``."""
    if value is None and allow_none:
        return None
    return validation.number(name, value, minimum,
                             what="None or a finite number" if allow_none else "a finite number")


class DecisionCore:
    """Decides, for every live job, whether it starts, resizes, holds, keeps or waits.

    Args:
        policy: the allocation policy, anything with
            ``allocate(jobs, nodes, base_allocations, now=...)`` returning an
            :class:`~adaptdl_core.policy.AllocationResult`, or a name of
            :func:`~adaptdl_core.policy.policy_by_name` (``"pollux"``: Pollux as published;
            ``"adaptdl"``: weighted by each job's remaining work, from the
            ``JobProgress.remaining_s`` the front-end reports); default
            ``PolluxPolicy(p=-1, fair_share=True)`` (Pollux's normalisation).
        clock: returns the current time in seconds (wall clock or a simulated one); every
            time the core records or compares comes from it.
        interval_s: seconds between periodic re-solves (finite, ``> 0``).
        resize_rule: decides whether a proposed resize of a running job pays, called with
            :func:`~adaptdl_core.policy.resize_verdict`'s keyword arguments plus
            ``since_last_s`` and ``last_cost_s`` (the job's last resize: seconds since it
            began, its measured cost; ``None`` when unknown), returning a
            :class:`~adaptdl_core.policy.ResizeVerdict`; default ``resize_verdict`` (a
            front-end whose jobs resize in place passes
            :func:`~adaptdl_core.policy.amortised_resize_verdict`).
        min_event_gap_s: least seconds between two solves triggered by events (jobs or
            nodes added or removed); events in between wait for the next one. Default 0:
            every :meth:`decide` after an event re-solves.
        max_solve_share: at most this share of the time is spent solving (the policy's
            time, measured, as far as the core's clock saw it pass: a simulated clock
            imposes no rest): after a solve of ``s`` seconds the next comes no sooner than
            ``s / max_solve_share`` seconds later, whether events or the interval call
            for it. ``None`` (default): no bound. A front-end sharing its machine with
            the work it schedules sets it, so that a sweep of many short trials does not
            spend a core on re-solving (see benchmarks/many_trials.py).
        state: a :class:`CoreState` to continue from (e.g. loaded from a file); its
            records stay not live until their jobs are added again.
        resize_cost_prior_s: seconds a resize is assumed to cost before one of the job or
            its profile group is measured (raised to the longest start-up measured);
            default Pollux's 30 s. On a cluster where relaunches are quick (small models,
            warm nodes) a lower prior lets young jobs be resized sooner.
        profile_group: the profile group of jobs added with ``JobSpec.profile_group``
            ``None`` (see :class:`JobSpec`); ``None``: such jobs share no profile. Also
            the attribute :attr:`default_profile_group`, which applies to jobs added
            after it is set.

    Raises:
        TypeError: a policy without ``allocate``, or a clock or rule that is not callable.
        ValueError: an unknown policy name, a non-finite or non-positive interval, a
            negative gap, or an empty or non-string ``profile_group``.
    """

    def __init__(self, policy: Any = None, clock: Callable[[], float] = time.time,
                 interval_s: float = 60.0, resize_rule: Callable[..., Any] | None = None, *,
                 min_event_gap_s: float = 0.0, state: CoreState | None = None,
                 profile_group: str | None = None, max_solve_share: float | None = None,
                 resize_cost_prior_s: float = DEFAULT_RESTART_COST_S) -> None:
        policy = allocation_policy(policy)
        if not callable(clock):
            raise TypeError(f"clock must be a function returning seconds, got {clock!r}")
        if resize_rule is not None and not callable(resize_rule):
            raise TypeError(f"resize_rule must be a function, got {resize_rule!r}")
        validation.number("interval_s", interval_s, 0.0, low_open=True,
                          what="a finite number of seconds")
        _check_number("min_event_gap_s", min_event_gap_s, minimum=0.0, allow_none=False)
        if max_solve_share is not None:
            validation.number("max_solve_share", max_solve_share, 0.0, 1.0, low_open=True,
                              what="None or a share of the time in (0, 1]")
        check_profile_group(profile_group)
        validation.number("resize_cost_prior_s", resize_cost_prior_s, 0.0, low_open=True,
                          what="a finite number of seconds")
        #: Seconds a resize is assumed to cost before any is measured (raised to the
        #: longest start-up measured).
        self.resize_cost_prior_s = float(resize_cost_prior_s)
        #: Profile group of jobs added without one of their own (``None``: no sharing).
        self.default_profile_group = profile_group
        self.policy = policy
        self.clock = clock
        self.interval_s = float(interval_s)
        self.resize_rule = resize_rule or resize_verdict
        self.min_event_gap_s = float(min_event_gap_s)
        self.max_solve_share = None if max_solve_share is None else float(max_solve_share)
        self._last_solve_s = 0.0  # the policy's time in the latest solve
        self._state = CoreState()
        self._nodes: dict[Hashable, NodeInfo] = {}
        self._dirty = False
        self._last_event_solve = -math.inf
        self._specs: dict[Hashable, JobSpec] = {}
        self._speedups: dict[Hashable, tuple[Any, Any]] = {}
        self._unfit: set = set()
        # Profile group -> (job id, hints) of its most widely profiled job so far (kept
        # after that job ends: its profile stays true of the model).
        self._group_best: dict[str, tuple[Hashable, dict]] = {}
        # Job id -> (own hints, donor hints, hints the policy sees), reused while both
        # inputs are the same objects (so that the speedup cache keeps hitting).
        self._effective: dict[Hashable, tuple[Any, Any, Any]] = {}
        # Accelerator types of the nodes (first seen first); with several, the per-type
        # models below are used.
        self._types: list = []
        self._mixed = False
        # (profile group, type) -> (job id, hints) of its most widely profiled job there.
        self._group_typed: dict[tuple, tuple[Hashable, dict]] = {}
        self._speeds: TypeSpeeds | None = None
        # Job id -> (inputs, per-type hints), and (job id, type) -> (hints, speedup fn).
        self._typed_cache: dict[Hashable, tuple[tuple, dict]] = {}
        self._typed_fns: dict[tuple, tuple[Any, Any]] = {}
        # Job id -> its per-type speedups of the latest solve (for the move check).
        self._last_typed: dict[Hashable, dict] = {}
        # Profile group -> (its measured resizes, its start-ups), rebuilt when one of its
        # jobs measures a resize or a launch (so that a solve does not scan every record
        # of a large sweep once per job).
        self._group_costs: dict[str, tuple[list, list]] = {}
        # (job id, target) -> its estimate, until the next measurement anywhere (rare):
        # a solve asks for every job's cost several times.
        self._cost_cache: dict[tuple, ResizeCostEstimate] = {}
        # Job id -> {"name", "outcome"} of the jobs removed since the last solve began.
        self._ended: dict[Hashable, dict] = {}
        #: Seconds each policy solve took (most recent last; at most 1000 kept).
        self.solve_times_s: list[float] = []
        if state is not None:
            self.restore(state)

    # -- state ----------------------------------------------------------------------
    @property
    def state(self) -> CoreState:
        """The core's records (plain data; save with :meth:`CoreState.save`)."""
        return self._state

    @property
    def nodes(self) -> dict[Hashable, NodeInfo]:
        """The cluster as last given to :meth:`set_nodes`."""
        return self._nodes

    def restore(self, state: CoreState) -> None:
        """Continue from ``state``: every record is kept but not live until its job is
        added again (:meth:`add_job` keeps its creation time, restarts, costs and log).

        Raises:
            TypeError: ``state`` is not a :class:`CoreState`."""
        if not isinstance(state, CoreState):
            raise TypeError(f"state must be a CoreState, got {type(state).__name__}")
        for record in state.jobs.values():
            record.live = False
            record.current = 0
            record.placed_known = False
        self._state = state
        self._specs.clear()
        self._speedups.clear()
        self._effective.clear()
        self._group_best.clear()
        self._group_costs.clear()
        self._cost_cache.clear()
        self._group_typed.clear()
        self._speeds = None
        self._typed_cache.clear()
        self._typed_fns.clear()
        self._last_typed.clear()
        for job_id, record in state.jobs.items():
            if record.spec is not None:
                self._offer(job_id, record)
                for kind in record.hints_by_type:
                    self._offer_typed(job_id, record, kind)
        self._dirty = True

    def record(self, job_id: Hashable) -> JobRecord:
        """The record of ``job_id`` (live or not).

        Raises:
            KeyError: the core never saw the job."""
        try:
            return self._state.jobs[job_id]
        except KeyError:
            raise KeyError(f"job {job_id!r} is unknown to the decision core: add it with "
                           "add_job() first") from None

    def _live(self, job_id: Hashable) -> JobRecord:
        record = self.record(job_id)
        if not record.live:
            raise KeyError(f"job {job_id!r} was removed; add it again with add_job()")
        return record

    # -- events ---------------------------------------------------------------------
    def set_nodes(self, nodes: Mapping[Hashable, NodeInfo]) -> None:
        """The cluster now: node id -> :class:`~adaptdl_core.policy.NodeInfo`. A change
        (a node added, removed or resized) makes the next :meth:`decide` re-solve.

        Raises:
            TypeError: a value that is not a NodeInfo."""
        nodes = checked_nodes(nodes)
        if nodes != self._nodes:
            self._nodes = nodes
            self._types = node_types(nodes)
            self._mixed = mixed_types(nodes)
            self._dirty = True
            if self._mixed:
                warn_if_type_unaware(self.policy, nodes)

    def add_job(self, job_id: Hashable, spec: JobSpec, *, replicas: int | None = None,
                submitted: float | None = None, name: str | None = None) -> None:
        """A job arrived (or was added again after a failure or a restore: its record,
        creation time and measurements are kept).

        Args:
            job_id: any hashable id (a string if the state is to be saved as JSON).
            spec: its shape.
            replicas: the size the front-end itself starts it at (e.g. Tune's own
                admission), taken as its target until the next solve; ``None``: it waits
                for the policy.
            submitted: when the job was submitted (seconds, the core's clock), if the
                front-end knows it; a job's age (its restart penalty and its rank among
                jobs) counts from then. ``None``: from now. It must not be in the future;
                a job added again keeps its first creation time.
            name: how people know the job, if not by its id (a Tune trial's name).

        Raises:
            TypeError: ``spec`` is not a JobSpec.
            ValueError: the cluster (when known) cannot hold ``spec.min_replicas``
                replicas at all, ``replicas`` is not an integer >= 0, or ``submitted`` is
                not a finite time no later than now.
        """
        if not isinstance(spec, JobSpec):
            raise TypeError(f"spec must be a JobSpec, got {spec!r}")
        if spec.profile_group is None and self.default_profile_group is not None:
            spec = dataclasses.replace(spec, profile_group=self.default_profile_group)
        now = float(self.clock())
        submitted = _check_number("submitted", submitted)
        if submitted is not None and submitted > now + 1e-9:
            raise ValueError(f"submitted ({submitted:g}) is after the core's clock ({now:g}): "
                             "pass the submission time on the same clock, or None")
        if self._nodes and cluster_capacity(spec, self._nodes) < spec.min_replicas:
            job_info(spec, self._nodes, created=0.0, hints=None)  # raises the clear error
        if replicas is not None:
            validation.integer("replicas", replicas, 0, what="None or an integer")
        record = self._state.jobs.get(job_id)
        if record is None:
            record = self._state.jobs[job_id] = JobRecord(
                created=now if submitted is None else submitted)
        record.spec = spec.to_dict()
        if name is not None:
            record.name = str(name)
        self._ended.pop(job_id, None)
        self._group_costs.pop(spec.profile_group, None)
        self._cost_cache.clear()
        record.live = True
        record.current = 0
        record.placed_known = False
        self._specs[job_id] = spec
        self._effective.pop(job_id, None)
        self._offer(job_id, record)
        self._unfit.discard(job_id)
        if replicas is not None and replicas != record.target:
            record.history.append([float(self.clock()), replicas])
            record.target = replicas
            record.nodes = []
        self._dirty = True

    def update(self, job_id: Hashable, hints: Mapping[str, Any] | None = None,
               progress: JobProgress | None = None) -> bool:
        """New scheduler hints and/or progress of a live job.

        Args:
            hints: ``SchedHints.to_dict()`` output (``None``: unchanged).
            progress: see :class:`JobProgress` (``None`` fields: unchanged).

        Returns:
            ``True`` if its restarts or measured resize cost changed (worth saving).

        Raises:
            KeyError: the job is not live.
            ValueError: a malformed progress field (named).
        """
        record = self._live(job_id)
        if hints is not None:
            if not isinstance(hints, Mapping):
                raise ValueError(f"hints must be a dict (SchedHints.to_dict()), got {hints!r}")
            if hints and hints != record.hints:
                record.hints = dict(hints)
                self._offer(job_id, record)
                kind = self._hints_type(record, hints)
                if kind is not None and profiled_extent(hints):
                    record.hints_by_type[kind] = record.hints
                    self._offer_typed(job_id, record, kind)
        if progress is None:
            return False
        if not isinstance(progress, JobProgress):
            raise ValueError(f"progress must be a JobProgress, got {progress!r}")
        before = (record.restarts, record.resize_s)
        restarts = progress.restarts
        cost = _check_number("progress.resize_cost_s", progress.resize_cost_s, minimum=0.0)
        if restarts is not None:
            validation.integer("progress.restarts", restarts, 0)
            if int(restarts) != record.restarts:
                record.restarts = int(restarts)
                # The relaunch of a resize this core saw begun: its cost is the first one
                # reported from now on (a front-end may see the relaunch before its first
                # step, and must not send an older resize's cost with it).
                record.cost_pending = record.resize_pending
                record.resize_pending = False
        if record.cost_pending and cost is not None and cost > 0:
            record.cost_pending = False
            record.resize_s = cost
            if record.resize_log:
                record.resize_log[-1]["measured_s"] = cost
            self._group_costs.pop(self._group_of(job_id, record), None)
            self._cost_cache.clear()
        launch = _check_number("progress.launch_s", progress.launch_s, minimum=0.0)
        if launch is not None and launch > 0:
            if launch != record.launch_s:
                self._group_costs.pop(self._group_of(job_id, record), None)
                self._cost_cache.clear()
            record.launch_s = launch
        remaining = _check_number("progress.remaining_s", progress.remaining_s, minimum=0.0)
        if remaining is not None:
            record.remaining_s = remaining
        if progress.restarting is not None:
            if not isinstance(progress.restarting, (bool, np.bool_)):
                raise ValueError(f"progress.restarting must be True, False or None, got "
                                 f"{progress.restarting!r}")
            record.restarting = bool(progress.restarting)
        return (record.restarts, record.resize_s) != before

    def running(self, job_id: Hashable, nodes: Sequence[Hashable] | None = None, *,
                replicas: int | None = None) -> None:
        """What a live job holds now: ``nodes`` (one node id per replica, ``[]``: none),
        or only the count ``replicas`` when the front-end does not know where they are
        (the core then guesses: the policy's placement if its size matches, else packed).

        A running job whose count changes without :meth:`begin_resize` is recorded as
        resized by the standing decision.

        Raises:
            KeyError: the job is not live.
            ValueError: neither or both of ``nodes`` and ``replicas``, or a bad count.
        """
        record = self._live(job_id)
        if (nodes is None) == (replicas is None):
            raise ValueError("pass exactly one of nodes (a list of node ids, one per "
                             "replica) or replicas (a count)")
        count = len(nodes) if nodes is not None else replicas
        validation.integer("replicas", count, 0)
        if record.current and count and count != record.current and not record.resize_pending:
            self.begin_resize(job_id, to=count)
        record.current = count
        if nodes is not None:
            record.placed, record.placed_known = list(nodes), True
        elif not count:
            record.placed, record.placed_known = [], False
        elif len(record.placed) == count:
            pass  # as reported, or as guessed before: the same size needs no new guess
        else:
            record.placed_known = False
            record.placed = self._guess_placement(job_id, record, count)

    def remove(self, job_id: Hashable, outcome: str | None = None) -> None:
        """The job finished, failed or was removed: its replicas are free at the next
        solve. Its record stays (not live) for the history; unknown ids are ignored.

        Args:
            outcome: how it ended, in a word (``finished``, ``failed``, ``stopped``...),
                passed on with the next solve (a shared cluster lists ended jobs)."""
        record = self._state.jobs.get(job_id)
        if record is None:
            return
        if record.live:
            self._ended[job_id] = {"name": record.name, "outcome": outcome or "ended"}
        if record.target:
            record.history.append([float(self.clock()), 0])
        record.target, record.nodes, record.current = 0, [], 0
        record.placed, record.placed_known = [], False
        record.resize_pending = record.cost_pending = False
        record.held = None
        if record.live:
            record.live = False
            self._dirty = True
        self._speedups.pop(job_id, None)
        self._effective.pop(job_id, None)
        self._unfit.discard(job_id)
        self._typed_cache.pop(job_id, None)
        self._last_typed.pop(job_id, None)
        for key in [k for k in self._typed_fns if k[0] == job_id]:
            del self._typed_fns[key]

    def cancel_resize(self, job_id: Hashable, reason: str) -> None:
        """A resize begun (:meth:`begin_resize`) will not be carried out (the policy
        changed its mind before the front-end could): it is logged as cancelled and
        nothing waits for its cost.

        Raises:
            KeyError: the job is not live."""
        record = self._live(job_id)
        if record.resize_pending and record.resize_log:
            record.resize_log[-1]["cancelled"] = reason
        record.resize_pending = False

    def pending_outcomes(self) -> dict[Hashable, str]:
        """How each job removed since the latest solve began ended (job id -> outcome):
        what a front-end that leaves a shared cluster now still owes it."""
        return {job_id: entry["outcome"] for job_id, entry in self._ended.items()}

    def begin_resize(self, job_id: Hashable, decision: Decision | None = None, *,
                     to: int | None = None, reason: str | None = None) -> None:
        """The front-end is carrying out a resize (of ``decision``, else the standing
        one, or to ``to`` replicas, for ``reason`` if given: e.g. a move off a node being
        drained): counted, logged with its reason, predicted saving and assumed cost; the
        next :meth:`update` with grown restarts gives its measured cost.

        Raises:
            KeyError: the job is not live."""
        record = self._live(job_id)
        if decision is None:
            decision = self.decision_for(job_id, log=False)
        target = to if to is not None else decision.replicas
        if reason is None:
            reason = decision.reason if decision.action == "resize" or to is None else \
                "resized by the front-end"
        record.resizes += 1
        record.resize_pending = True
        record.cost_pending = False  # (a new resize: an older one's cost is no longer due)
        record.last_veto = None
        cost = self.resize_cost_estimate(job_id, target)
        record.resize_log.append({"time": float(self.clock()), "from": record.current,
                                  "to": target, "reason": reason,
                                  "saved_s": decision.saved_s if decision.action == "resize"
                                  else None, "cost_s": cost.seconds,
                                  "cost_basis": cost.basis})

    # -- decisions ------------------------------------------------------------------
    def due(self) -> bool:
        """Whether the next :meth:`decide` re-solves (events pending past the gap, or
        the interval elapsed)."""
        now = self.clock()
        if self.max_solve_share is not None and now - self._state.last_allocation < \
                self._last_solve_s / self.max_solve_share:
            return False
        if self._dirty and now - self._last_event_solve >= self.min_event_gap_s:
            return True
        return now - self._state.last_allocation >= self.interval_s

    def decide(self, *, force: bool = False) -> dict[Hashable, Decision]:
        """Re-solve if due (or ``force``), then the decision of every live job.

        Raises:
            ValueError: from the policy, for inputs it rejects."""
        if force or self.due():
            self.solve()
        return {job_id: self._decision(job_id, record, log=True)
                for job_id, record in self._state.jobs.items() if record.live}

    def decision_for(self, job_id: Hashable, *, log: bool = True) -> Decision:
        """The standing decision of one live job (no solve; cheap).

        Args:
            log: log a hold's reason once per reason (and remember it as ``last_veto``).

        Raises:
            KeyError: the job is not live."""
        return self._decision(job_id, self._live(job_id), log=log)

    def hints_for(self, job_id: Hashable) -> Mapping[str, Any] | None:
        """The hints the policy models a job with: its own, or, in a profile group whose
        best-profiled job covers more replicas, those merged with that job's profile
        (see :func:`~adaptdl_core.decision.group_hints`).

        Raises:
            KeyError: unknown job."""
        return self._effective_hints(job_id, self.record(job_id))

    def group_profile(self, group: str) -> tuple[Hashable, dict] | None:
        """``(job id, hints)`` of the most widely profiled job of profile group ``group``
        seen so far (also after it ended), or ``None``."""
        return self._group_best.get(group)

    def resize_cost(self, job_id: Hashable, target: int | None = None) -> float:
        """Seconds the next resize of the job (to ``target`` replicas, ``None``: any) is
        predicted to cost (see :meth:`resize_cost_estimate`).

        Raises:
            KeyError: unknown job."""
        return self.resize_cost_estimate(job_id, target).seconds

    def resize_cost_estimate(self, job_id: Hashable,
                             target: int | None = None) -> ResizeCostEstimate:
        """The predicted cost of the job's next resize and what it rests on: the resizes
        measured so far in the job and its profile group, as the machine's load made
        them, else the policy's prior raised to the longest start-up measured (see
        :func:`~adaptdl_core.decision.resize_cost.estimate_resize_cost`).

        Raises:
            KeyError: unknown job."""
        cached = self._cost_cache.get((job_id, target))
        if cached is not None:
            return cached
        record = self.record(job_id)
        group = self._group_of(job_id, record)
        if group is None:
            # resize_s is set with every measurement: no scan of a long log without one.
            samples = _cost_samples(record, own=True) if record.resize_s is not None else []
            launches = [record.launch_s] if record.launch_s else []
        else:
            cached = self._group_costs.get(group)
            if cached is None:
                members = [(k, r) for k, r in self._state.jobs.items()
                           if self._group_of(k, r) == group]
                cached = self._group_costs[group] = (
                    [(k, s) for k, r in members for s in _cost_samples(r, own=False)],
                    [r.launch_s for _, r in members if r.launch_s])
            samples = [dataclasses.replace(s, own=True) if k == job_id else s
                       for k, s in cached[0]]
            launches = cached[1]
        estimate = self._cost_cache[(job_id, target)] = estimate_resize_cost(
            samples, target=target, launches_s=launches, prior_s=self.resize_cost_prior_s)
        return estimate

    def _group_of(self, job_id: Hashable, record: JobRecord) -> str | None:
        """The job's profile group (``None``: none, or its spec is not known yet)."""
        if record.spec is None and job_id not in self._specs:
            return None
        return self._spec(job_id, record).profile_group

    def finishing(self, job_id: Hashable) -> bool:
        """Less training left than the resize rule allows (see ``resize_verdict``).

        Raises:
            KeyError: unknown job."""
        record = self.record(job_id)
        return record.remaining_s is not None and \
            record.remaining_s < MIN_COST_MULTIPLES * self.resize_cost(job_id)

    def solve(self) -> None:
        """Re-divide the cluster among the live jobs now (normally :meth:`decide` calls
        this when due): :meth:`begin_solve`, :meth:`SolveRequest.run`, :meth:`finish_solve`.

        Raises:
            ValueError: from the policy, for inputs it rejects."""
        request = self.begin_solve()
        request.run()
        self.finish_solve(request)

    def begin_solve(self) -> "SolveRequest":
        """Snapshot the inputs of a solve (cheap: no speedup model is evaluated here) and
        count it as started: events after this call make a later solve due. Run the
        returned request anywhere (a worker thread, so that a front-end's event loop is
        never blocked by the policy), then hand it to :meth:`finish_solve`."""
        now = float(self.clock())
        if self._dirty:
            self._last_event_solve = now
        self._dirty = False
        self._state.last_allocation = now
        live = {k: r for k, r in self._state.jobs.items() if r.live}
        entries = []
        typed = self._mixed
        for job_id, record in live.items():
            entries.append(SolveEntry(job_id, self._spec(job_id, record), record.created,
                                  self._effective_hints(job_id, record), record.restarts,
                                  self.resize_cost(job_id),
                                  record.current,
                                  bool(record.current) and (record.restarting
                                                            or self.finishing(job_id)),
                                  record.remaining_s, record.name,
                                  self._type_hints(job_id, record) if typed else None,
                                  self._placed_type(record) if typed else None))
        base = self._bases(live)
        request = SolveRequest(now, dict(self._nodes), entries, base, self.policy,
                               self._speedup_for)
        request.ended, self._ended = self._ended, {}
        if typed:
            request.speeds = self._type_speeds()
            request.typed_speedup_for = self._typed_speedup_for
        return request

    def finish_solve(self, request: "SolveRequest") -> None:
        """Apply a solved request: the new target of every job in it that is still live
        (jobs added since keep theirs until the next solve).

        Raises:
            ValueError: the request has not run, or its run failed (its error)."""
        if request.error is not None:
            raise request.error
        if request.result is None and request.entries:
            raise ValueError("the solve request has not run: call request.run() first")
        for job_id, message in request.unfit.items():
            if job_id not in self._unfit:
                LOG.warning("job %s cannot run on this cluster: %s", job_id, message)
                self._unfit.add(job_id)
        self._state.num_allocations += 1
        changes = []
        allocations = request.result.allocations if request.result is not None else {}
        for entry in request.entries:
            record = self._state.jobs.get(entry.job_id)
            if record is None or not record.live:
                continue
            if entry.job_id not in request.unfit:
                self._unfit.discard(entry.job_id)
            placement = list(allocations.get(entry.job_id, []))
            record.held = request.reasons.get(entry.job_id)
            if len(placement) != record.target:
                changes.append(f"{entry.job_id}: {record.target}->{len(placement)}")
                record.history.append([request.now, len(placement)])
            record.target = len(placement)
            record.nodes = placement
            info = request.infos.get(entry.job_id)
            if info is not None and info.type_speedups:
                self._last_typed[entry.job_id] = info.type_speedups
            else:
                self._last_typed.pop(entry.job_id, None)
        solve_s = request.result.solve_time_s if request.result is not None else 0.0
        # The policy's time, but never more than the core's clock saw pass since the
        # solve began (a simulated or frozen clock then imposes no rest in real seconds).
        self._last_solve_s = max(0.0, min(float(solve_s), float(self.clock()) - request.now))
        self.solve_times_s.append(request.seconds)
        del self.solve_times_s[:-1000]
        LOG.info("allocation #%d in %.0f ms (policy %.0f ms): %s",
                 self._state.num_allocations, 1e3 * request.seconds, 1e3 * solve_s,
                 ", ".join(changes) or "no change")

    # -- internals ------------------------------------------------------------------
    def _spec(self, job_id: Hashable, record: JobRecord) -> JobSpec:
        spec = self._specs.get(job_id)
        if spec is None:
            spec = self._specs[job_id] = JobSpec.from_dict(record.spec)
        return spec

    def _speedup_fn(self, job_id: Hashable, record: JobRecord) -> Any:
        """The job's speedup function for its current hints (see :meth:`_speedup_for`)."""
        return self._speedup_for(job_id, self._effective_hints(job_id, record))

    def _offer(self, job_id: Hashable, record: JobRecord) -> None:
        """Make the job's hints its group's profile if they cover more replicas than the
        group's best so far (or are a newer fit of the best job itself)."""
        group = self._spec(job_id, record).profile_group
        extent = profiled_extent(record.hints)
        if group is None or not extent:
            return
        best = self._group_best.get(group)
        if best is None or extent > profiled_extent(best[1]) or best[0] == job_id:
            if best is None or best[0] != job_id:
                LOG.info("profile group %r: job %s's throughput profile (%d replicas) now "
                         "models the group's less profiled jobs", group, job_id, extent)
            self._group_best[group] = (job_id, record.hints)

    def _effective_hints(self, job_id: Hashable, record: JobRecord) -> Any:
        """See :meth:`hints_for` (cached per job while its inputs are unchanged)."""
        group = self._spec(job_id, record).profile_group if record.spec is not None or \
            job_id in self._specs else None
        best = self._group_best.get(group) if group is not None else None
        donor = best[1] if best is not None and best[0] != job_id else None
        if donor is None:
            return record.hints
        cached = self._effective.get(job_id)
        if cached is not None and cached[0] is record.hints and cached[1] is donor:
            return cached[2]
        merged = group_hints(record.hints, donor)
        self._effective[job_id] = (record.hints, donor, merged)
        return merged

    def _speedup_for(self, job_id: Hashable, hints: Any) -> Any:
        """The speedup function of ``hints``, built once per hints object (its goodput
        tables are then reused across solves). Safe from a worker thread: a race builds
        the same function twice, nothing worse."""
        cached = self._speedups.get(job_id)
        if cached is not None and cached[0] is hints:
            return cached[1]
        fn = speedup_from_hints(hints)
        self._speedups[job_id] = (hints, fn)
        return fn

    # -- accelerator types ----------------------------------------------------------
    def _nodes_type(self, nodes: Sequence[Hashable]) -> Any:
        """The one accelerator type of ``nodes`` (see :func:`common_type`)."""
        return common_type(self._nodes, nodes)

    def _chosen_type(self, nodes: Sequence[Hashable]) -> str | None:
        """The accelerator type a decision places its replicas on (see
        :attr:`Decision.accelerator_type`): ``None`` unless the cluster is mixed."""
        return placement_type(self._nodes, nodes) if self._mixed else None

    def _placed_type(self, record: JobRecord) -> Any:
        """The type of the nodes the job runs on (``None``: not running or unknown)."""
        return self._nodes_type(record.placed) if record.current and record.placed else None

    def _hints_type(self, record: JobRecord, hints: Mapping[str, Any]) -> str | None:
        """The accelerator type ``hints`` were measured on: their ``"accelerator_type"``
        key, else the type of the nodes the job runs on (``None``: not known)."""
        kind = hints.get("accelerator_type")
        if isinstance(kind, str) and kind:
            return kind
        placed = self._placed_type(record)
        return placed if isinstance(placed, str) else None

    def _offer_typed(self, job_id: Hashable, record: JobRecord, kind: str) -> None:
        """Make the job's hints on ``kind`` its group's best there if they cover more
        replicas than the group's best so far (or are a newer fit of that job)."""
        group = self._spec(job_id, record).profile_group if record.spec is not None or \
            job_id in self._specs else None
        hints = record.hints_by_type.get(kind)
        extent = profiled_extent(hints)
        if group is None or not extent:
            return
        best = self._group_typed.get((group, kind))
        if best is None or extent > profiled_extent(best[1]) or best[0] == job_id:
            self._group_typed[(group, kind)] = (job_id, hints)
            self._speeds = None

    def _type_speeds(self) -> TypeSpeeds:
        """Speed ratios between types, from the groups' per-type fits (cached)."""
        if self._speeds is None:
            fits: dict = {}
            for (group, kind), (_, hints) in self._group_typed.items():
                fits.setdefault(group, {})[kind] = hints
            self._speeds = TypeSpeeds(fits)
        return self._speeds

    def _type_hints(self, job_id: Hashable, record: JobRecord) -> dict:
        """The hints the job is modelled with on each type of the cluster
        (:func:`~adaptdl_core.decision.type_models.typed_hints`), cached while their
        inputs are the same objects."""
        spec = self._spec(job_id, record)
        group = {kind: hints for (g, kind), (donor, hints) in self._group_typed.items()
                 if g is not None and g == spec.profile_group and donor != job_id}
        speeds = self._type_speeds()
        key = (tuple(self._types), id(record.hints),
               tuple((k, id(v)) for k, v in record.hints_by_type.items()),
               tuple((k, id(v)) for k, v in group.items()), id(speeds))
        cached = self._typed_cache.get(job_id)
        if cached is not None and cached[0] == key:
            return cached[1]
        out = typed_hints(self._types, record.hints_by_type, group, record.hints, speeds)
        self._typed_cache[job_id] = (key, out)
        return out

    def _typed_speedup_for(self, job_id: Hashable, kind: Any, hints: Any) -> Any:
        """The speedup function of ``hints`` on type ``kind``, built once per hints
        object (see :meth:`_speedup_for`)."""
        cached = self._typed_fns.get((job_id, kind))
        if cached is not None and cached[0] is hints:
            return cached[1]
        fn = speedup_from_hints(hints)
        self._typed_fns[(job_id, kind)] = (hints, fn)
        return fn

    def _type_move(self, record: JobRecord) -> tuple | None:
        """``(type now, type targeted)`` when the policy moves a running job to another
        accelerator type, else ``None``."""
        if not self._mixed or not record.current or not record.target:
            return None
        now, new = self._placed_type(record), self._nodes_type(record.nodes)
        if now is None or new is None or now == new:
            return None
        return now, new

    def _guess_placement(self, job_id: Hashable, record: JobRecord, count: int) -> list:
        # The policy's last placement stands in for the real one when its size matches.
        if len(record.nodes) == count:
            return list(record.nodes)
        return pack_guess(self._nodes, self._spec(job_id, record), count)

    def _bases(self, records: Mapping[Hashable, JobRecord]) -> dict[Hashable, list]:
        """Where the running jobs are: reported placements first, then the policy's last
        placement where its size matches, and the rest packed into the room those leave
        (guessing each job alone would stack them all on the first nodes)."""
        base: dict[Hashable, list] = {}
        guess = []
        free = {key: dict(node.resources) for key, node in self._nodes.items()}
        for job_id, record in records.items():
            if not record.current:
                continue
            if record.placed_known and len(record.placed) == record.current:
                base[job_id] = list(record.placed)
            elif len(record.nodes) == record.current:
                base[job_id] = list(record.nodes)
            else:
                guess.append(job_id)
                continue
            need = self._spec(job_id, record).resources
            for key in base[job_id]:
                if key in free:
                    for name, amount in need.items():
                        free[key][name] = free[key].get(name, 0.0) - amount
        for job_id in guess:
            record = records[job_id]
            need = self._spec(job_id, record).resources
            placement: list = []
            for key, room in free.items():
                while len(placement) < record.current and all(
                        room.get(name, 0.0) + 1e-9 >= amount for name, amount in need.items()):
                    placement.append(key)
                    for name, amount in need.items():
                        room[name] = room.get(name, 0.0) - amount
            if len(placement) < record.current:  # more than the room left: the plain guess
                placement = pack_guess(self._nodes, self._spec(job_id, record),
                                       record.current)
            base[job_id] = placement
        for job_id, placement in base.items():
            if not records[job_id].placed_known:
                records[job_id].placed = list(placement)
        return base

    def _decision(self, job_id: Hashable, record: JobRecord, *, log: bool) -> Decision:
        current, target = record.current, record.target
        if not current:
            if target:
                return Decision(job_id, Action.START, target, tuple(record.nodes),
                                "the policy gives it replicas", None,
                                self.resize_cost(job_id), target,
                                self._chosen_type(record.nodes))
            reason = "the cluster cannot hold its minimum size" if job_id in self._unfit \
                else "no room for it now"
            return Decision(job_id, Action.WAIT, 0, (), reason, None, None, 0)
        if target == current and self._type_move(record) is None:
            return Decision(job_id, Action.KEEP, current, tuple(record.placed),
                            record.held or "no change", None, None, target,
                            self._chosen_type(record.placed))
        verdict = self._verdict(job_id, record)
        cost = self.resize_cost(job_id, target)
        if verdict.pays:
            return Decision(job_id, Action.RESIZE, target, tuple(record.nodes), verdict.reason,
                            verdict.saved_s, cost, target, self._chosen_type(record.nodes))
        if log and record.last_veto != verdict.reason:
            LOG.info("job %s: keeping %d replicas instead of %d: %s", job_id, current, target,
                     verdict.reason)
            record.last_veto = verdict.reason
        return Decision(job_id, Action.HOLD, current, tuple(record.placed), verdict.reason,
                        verdict.saved_s, cost, target, self._chosen_type(record.placed))

    def _verdict(self, job_id: Hashable, record: JobRecord) -> ResizeVerdict:
        """Whether moving the job from its current to its target size pays."""
        current, target = record.current, record.target
        cost = self.resize_cost(job_id, target or None)
        if target == 0:
            # The policy preempts it: only the finishing rule can keep it running.
            if self.finishing(job_id):
                return ResizeVerdict(False, f"{record.remaining_s:.1f} s of training left, "
                                            f"under {MIN_COST_MULTIPLES:g} resize costs of "
                                            f"{cost:.1f} s")
            return ResizeVerdict(True, "preempted for other jobs")
        move = self._type_move(record)
        fns = self._last_typed.get(job_id)
        if move is not None and fns is not None and move[0] in fns and move[1] in fns:
            nodes_now = max(len(set(record.placed)), 1)
            nodes_new = max(len(set(record.nodes)), 1)
            return move_verdict(
                remaining_s=record.remaining_s, cost_s=cost,
                speedup_now=float(np.asarray(fns[move[0]](nodes_now, current))),
                speedup_new=float(np.asarray(fns[move[1]](nodes_new, target))))
        speedups = None
        if record.remaining_s is not None:
            kind = self._placed_type(record)
            fn = fns[kind] if fns is not None and kind in fns else \
                self._speedup_fn(job_id, record)
            nodes_now = max(len(set(record.placed)), 1) if record.placed else 1
            nodes_new = max(len(set(record.nodes)), 1)
            speedups = (float(np.asarray(fn(nodes_now, current))),
                        float(np.asarray(fn(nodes_new, target))))
        # What the job's last resize tells (for rules that wait for it to be amortised).
        last = next((e for e in reversed(record.resize_log) if "cancelled" not in e), None)
        since = None if last is None else max(float(self.clock()) - float(last["time"]), 0.0)
        return self.resize_rule(current=current, target=target, remaining_s=record.remaining_s,
                                cost_s=cost, speedup_now=speedups[0] if speedups else None,
                                speedup_new=speedups[1] if speedups else None,
                                since_last_s=since,
                                last_cost_s=None if last is None else last.get("measured_s"))


def _cost_samples(record: JobRecord, *, own: bool) -> list[CostSample]:
    """The measured resizes in a record's ``resize_log``."""
    return [CostSample(float(e["time"]), int(e["to"]), float(e["measured_s"]), own)
            for e in record.resize_log if e.get("measured_s") is not None]
