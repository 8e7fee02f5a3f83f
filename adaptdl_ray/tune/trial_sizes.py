"""The sizes of one experiment's trials, as its decision core decides them.

:class:`TrialSizes` holds what each trial runs on (its latest report), what it was told to
run on (the experiment's control actor carries it to the trial, which resizes itself in
place), and drives the experiment's :class:`~adaptdl_core.decision.DecisionCore` through
its :class:`~adaptdl_core.decision.CoreDriver`, in trial ids and counts only:
:class:`~adaptdl_ray.tune.scheduler.AdaptDLScheduler` turns Tune's events into these calls
and owns everything that needs Tune's objects.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any, Callable, Iterable, Mapping

from adaptdl_core.decision import (CoreDriver, Decision, DecisionCore, JobProgress,
                                   progress_from_status)
from adaptdl_core.decision.resize_cost import describe_resize
from adaptdl_core.policy.typed import mixed_types
from adaptdl_ray.tune.results import METRIC_PREFIX
from adaptdl_ray.tune.trial_types import needs_typed_relaunch, nodes_to_report

LOG = logging.getLogger(__name__)
# (see adaptdl_ray.tune.scheduler: one line per resize, for users)
RESIZE_LOG = logging.getLogger("ray.tune.adaptdl")

__all__ = ["TrialSizes"]


class TrialSizes:
    """The trials' sizes and the core's resizes of them (see the module docstring).

    Args:
        core: the experiment's decision core.
        driver: how the core is driven (its solves, its state file).
        hints_fn: returns the latest scheduler hints of the given trial ids; ``None``:
            what the trials posted to :attr:`control`.

    Attributes:
        control: the experiment's control actor (``None`` until the scheduler runs on
            Ray; nothing is told to trials then).
    """

    def __init__(self, core: DecisionCore, driver: CoreDriver,
                 hints_fn: Callable[[list[str]], Mapping[str, dict]] | None = None) -> None:
        self.core = core
        self.driver = driver
        self.hints_fn = hints_fn
        self.control: Any = None
        self._now: dict[str, int] = {}      # replicas each trial's latest result reported
        self._targets: dict[str, int] = {}  # replicas each trial was last told to run on
        self._launches: dict[str, tuple] = {}  # (node ids, restarts) each launch posted
        self._asked: dict[str, Any] = {}  # the restart count each trial's nodes were asked at

    # -- sizes ----------------------------------------------------------------------------
    def held(self, trial_id: str, base: int) -> int:
        """The replicas a trial runs on now: its latest report's count, else ``base`` (its
        placement group's, its minimum)."""
        return self._now.get(trial_id) or base

    def target_of(self, trial_id: str) -> int | None:
        """The replicas the trial was last told to run on (``None``: none)."""
        return self._targets.get(trial_id)

    def tell(self, trial_id: str, replicas: int) -> None:
        """Tell the trial how many replicas to run on (it resizes itself in place)."""
        self._targets[trial_id] = int(replicas)
        if self.control is not None:
            self.control.set_target.remote(trial_id, int(replicas), time.time())

    # -- a trial's results ------------------------------------------------------------------
    def reported(self, trial_id: str, result: Mapping[str, Any], base: int) -> tuple[int, bool]:
        """A result of a running trial: the core hears its size (first: a count that
        changed through a resize begun here is not a new one), on a cluster of several
        accelerator types where its replicas run (their node ids, as its launch posted
        them), and its progress. Returns the replicas it runs on and whether restarts or a
        resize cost changed."""
        value = result.get(METRIC_PREFIX + "replicas")
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            self._now[trial_id] = value
        current = self.held(trial_id, base)
        placed = self._placement(trial_id, current, result.get(METRIC_PREFIX + "restarts"))
        if placed is not None:
            self.core.running(trial_id, nodes=placed)
        else:
            self.core.running(trial_id, replicas=current)
        return current, self.progress(trial_id, result)

    def _placement(self, trial_id: str, replicas: int, restarts: Any) -> list | None:
        """The node ids the trial's replicas run on, to tell the core, on a cluster of
        several types only (see :func:`~adaptdl_ray.tune.trial_types.nodes_to_report`):
        the control actor is asked once per launch (a result whose restart count its
        last posted launch does not carry)."""
        if not mixed_types(self.core.nodes):
            return None
        launch = self._launches.get(trial_id)
        if self.control is not None and isinstance(restarts, int) and \
                (launch is None or launch[1] != restarts) and self._asked.get(trial_id) != restarts:
            import ray
            self._asked[trial_id] = restarts
            try:
                self.launch_nodes([trial_id])
            except ray.exceptions.RayError as exc:
                LOG.debug("trial %s: could not read where its replicas run: %s", trial_id, exc)
            launch = self._launches.get(trial_id)
        return nodes_to_report(launch, replicas, restarts, self.core.nodes)

    def progress(self, trial_id: str, result: Mapping[str, Any]) -> bool:
        """Pass a result's progress to the core; the line of a resize it closes (its
        measured cost) goes out. Returns whether restarts or a resize cost changed."""
        record = self.core.state.jobs[trial_id]
        resizing = record.resize_pending
        status = {k[len(METRIC_PREFIX):]: v for k, v in result.items()
                  if k.startswith(METRIC_PREFIX)}
        changed = self.core.update(trial_id, progress=progress_from_status(
            status, trained_s=result.get("time_total_s"),
            resize_cost_s=status.get("resize_s"), launch_s=status.get("launch_s")))
        if resizing and not record.resize_pending and record.resize_log:
            RESIZE_LOG.info(describe_resize(trial_id, record.resize_log[-1], "trial"))
        return changed

    def resize(self, trial_id: str, current: int, room_for: Callable[[int], bool],
               request_kind: str | None = None) -> Decision | None:
        """Carry out the core's standing decision for a trial running on ``current``
        replicas that just reported: cancel a resize the policy changed its mind about,
        or begin one (a grow only once ``room_for(replicas)`` says its room is free) and
        tell the trial. A trial is never preempted to zero here: Tune admits trials.

        Args:
            request_kind: the accelerator type the trial's placement group request names
                (``None``: none).

        Returns:
            The decision when it is carried out by a relaunch on its accelerator type (a
            move to another type, or a grow of a trial whose request names another type
            or none: see :func:`~adaptdl_ray.tune.trial_types.needs_typed_relaunch`):
            nothing is begun or told then; the caller pauses the trial to relaunch it
            there (:meth:`move`).
            ``None`` otherwise."""
        record = self.core.state.jobs[trial_id]
        verdict = self.core.decision_for(trial_id)
        pending = record.resize_log[-1]["to"] if record.resize_pending and \
            record.resize_log else None
        # (A hold whose proposal is the pending size is the resize rule waiting for that
        # very resize to be measured: not a change of mind.)
        if pending is not None and verdict.action in ("keep", "hold") and \
                (verdict.proposed or verdict.replicas) != pending:
            self.core.cancel_resize(trial_id, "the policy kept its size")
            self.tell(trial_id, current)
            return None
        if verdict.action != "resize" or verdict.replicas < 1 or verdict.replicas == pending:
            return None
        if needs_typed_relaunch(verdict.accelerator_type, request_kind,
                                record.placed if record.placed_known else None,
                                self.core.nodes, grows=verdict.replicas > current):
            return verdict
        if verdict.replicas == current:
            return None  # (a move to the type it now runs on: the core learns it next report)
        if verdict.replicas > current and not room_for(verdict.replicas):
            return None  # grow only once the shrinking trials have freed the room
        self.core.begin_resize(trial_id, verdict)
        LOG.info("trial %s: resizing in place %d -> %d replicas (%s; predicted cost %.1f s); "
                 "one line follows once its cost is measured", trial_id, current,
                 verdict.replicas, verdict.reason, record.resize_log[-1]["cost_s"])
        self.tell(trial_id, verdict.replicas)
        self.driver.save()
        return None

    def launch_nodes(self, trial_ids: list[str]) -> dict[str, list[str]]:
        """The node ids of the replicas of each given trial's current launch, as the trials
        posted them to :attr:`control` (each launch's restart count is kept for
        :meth:`move`).

        Raises:
            ray.exceptions.GetTimeoutError: the control actor did not answer in 10 s."""
        import ray
        self.note_launches(ray.get(self.control.get_nodes.remote(trial_ids), timeout=10))
        return {t: self._launches[t][0] for t in trial_ids if t in self._launches}

    def note_launches(self, launches: Mapping[str, tuple[list[str], int | None]]) -> None:
        """Keep what trials posted of their current launches (trial id -> ``(replica node
        ids, restart count)``, as
        :meth:`~adaptdl_ray.tune.control.ExperimentControl.get_nodes` answers)."""
        self._launches.update(launches)

    def launch_size(self, trial_id: str) -> int:
        """The replicas of the trial's current launch as it posted them (0: not known)."""
        return len(self._launches.get(trial_id, ((), None))[0])

    def move(self, trial_id: str, current: int, to: int, reason: str,
             decision: Decision | None = None) -> None:
        """The trial, running on ``current`` replicas, is paused to relaunch on ``to``
        replicas elsewhere (``reason``; ``decision``: the core's decision it carries out,
        e.g. a move to another accelerator type). A resize in place that its current launch
        carried out and no report has told yet ends here (its cost is not measured): the
        move is the resize whose cost the relaunch's report gives."""
        self.core.running(trial_id, replicas=current)
        restarts = self._launches.get(trial_id, ((), None))[1]
        if restarts is not None and restarts > self.core.state.jobs[trial_id].restarts:
            self.core.update(trial_id, progress=JobProgress(restarts=restarts))
        self.core.begin_resize(trial_id, decision, to=to, reason=reason)
        self.driver.save()
        RESIZE_LOG.warning("trial %s: %s: pausing to relaunch with %d replica(s)",
                           trial_id, reason, to)

    def move_type(self, trial_id: str, current: int, decision: Decision) -> None:
        """The trial, running on ``current`` replicas, is paused to relaunch on the
        accelerator type ``decision`` names, on ``decision.replicas`` (see :meth:`move`)."""
        self.move(trial_id, current, decision.replicas,
                  f"relaunching on {decision.accelerator_type} ({decision.reason})", decision)

    def summary(self) -> str:
        """The allocations so far, the replicas in use and the trials using them, in words."""
        state = self.core.state
        live = [r for r in state.jobs.values() if r.live and r.target > 0]
        return (f"{state.num_allocations} allocations, {sum(r.target for r in live)} "
                f"replicas over {len(live)} trials")

    def place_first(self, trial_id: str) -> str | None:
        """A trial about to be staged by Tune (new, or again after a failure): on a
        cluster of several accelerator types, solve now, so that its first placement-group
        request names the type its decision chose (Tune stages it right after adding it,
        and a staged request cannot change; without a type it would start wherever Ray
        finds room and be moved, at one relaunch's cost). Returns that type (``None``: a
        cluster of one type, or the policy has no room for the trial now)."""
        if not mixed_types(self.core.nodes):
            return None
        self.driver.solve_now()
        return self.decided_type(trial_id)

    def decided_type(self, trial_id: str) -> str | None:
        """The accelerator type the trial's standing decision places it on (``None``: any
        node: a cluster of one type, or no decision yet)."""
        record = self.core.state.jobs.get(trial_id)
        if record is None or not record.live:
            return None
        return self.core.decision_for(trial_id, log=False).accelerator_type

    def ended(self, trial_id: str, outcome: str) -> bool:
        """The trial ended (``finished``, ``stopped``, ``failed``: a retried trial starts
        again at the size it had). Returns whether no trial is live any more."""
        record = self.core.state.jobs.get(trial_id)
        if record is not None and record.live and record.resize_pending and record.resize_log:
            RESIZE_LOG.info("%s (the trial ended first)",
                            describe_resize(trial_id, record.resize_log[-1], "trial"))
        self.core.remove(trial_id, outcome)
        self._now.pop(trial_id, None)
        self._launches.pop(trial_id, None)
        self._asked.pop(trial_id, None)
        if outcome != "failed":
            self._targets.pop(trial_id, None)
        if self.control is not None:
            self.control.forget.remote(trial_id)
        self.driver.save_soon()
        return not any(r.live for r in self.core.state.jobs.values())

    # -- solves ---------------------------------------------------------------------------
    def decide(self, trials: Callable[[], Iterable[tuple[str, bool, int]]],
               nodes: Callable[[], Mapping[Any, Any]]) -> None:
        """Have the driver start a re-solve when it is due, and apply a finished one.

        Args:
            trials: returns ``(trial id, whether it runs, the replicas it holds)`` of the
                experiment's live trials (running, waiting to start or to relaunch); asked
                only when a solve is due.
            nodes: returns the cluster now (likewise).
        """
        def prepare() -> None:
            ids = []
            for trial_id, runs, held in trials():
                record = self.core.state.jobs.get(trial_id)
                if record is None or not record.live:
                    continue
                ids.append(trial_id)
                if record.resize_pending and record.resize_log:
                    # About to hold its new size: counted as holding it, the solve keeps it
                    # there (as nothing, it would give the room away before the resize lands).
                    held = record.resize_log[-1]["to"]
                elif not runs:
                    held = 0  # Tune starts it at its request once there is room
                self.core.running(trial_id, replicas=held)
            self.refresh_hints(ids)
            self.core.set_nodes(nodes())

        self.driver.step(prepare)

    def refresh_hints(self, trial_ids: list[str]) -> None:
        """Pull the trials' latest scheduler hints (posted by the trials, not in results);
        on failure the last ones stay (logged)."""
        if not trial_ids:
            return
        import ray
        try:
            if self.hints_fn is not None:
                fresh = dict(self.hints_fn(trial_ids))
            elif self.control is not None:
                fresh = {k: json.loads(v) for k, v in ray.get(
                    self.control.get_hints.remote(trial_ids), timeout=10).items()}
            else:
                return
        except (ray.exceptions.RayError, ValueError) as exc:
            LOG.warning("could not read the trials' scheduler hints (%s); using the last ones",
                        exc)
            return
        for trial_id, hints in fresh.items():
            record = self.core.state.jobs.get(trial_id)
            if record is not None and record.live and hints:
                self.core.update(trial_id, hints=hints)
