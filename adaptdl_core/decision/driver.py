"""How a front-end drives the decision core: when it solves, where, and how its state is kept.

Every front-end (the Ray Tune scheduler, a cluster job, the cluster allocator's clients,
the simulator) drives :class:`~adaptdl_core.decision.DecisionCore` the same way, through
one :class:`CoreDriver`:

* **Solving off the event loop.** A front-end's hook calls :meth:`CoreDriver.step` often;
  when the core says a solve is due, the driver lets the front-end bring the core up to
  date (its ``prepare`` callback: sizes, hints, nodes), snapshots the inputs
  (:meth:`~adaptdl_core.decision.DecisionCore.begin_solve`) and runs the solve in one
  worker thread, so that a large solve never blocks the front-end. A hook waits for the
  solve it started only while solves are quick (the previous one took at most
  ``solve_wait_s``): small solves then take effect at once, and a slow one is not waited
  for (beside a busy solve thread any wait overshoots); its result is applied at a later
  :meth:`CoreDriver.step`. ``solve_wait_s=None`` solves in the calling thread
  (deterministic: tests, scripted benchmarks, the simulator).
* **Where the solve runs.** By default in this process (``SolveRequest.run``). A
  ``solver`` callback may run it elsewhere, e.g. in the cluster allocator, which divides
  the cluster among every experiment's jobs at once; it fills in the request as ``run``
  would (see :meth:`~adaptdl_core.decision.SolveRequest.accept`).
* **State on disk.** After each applied solve, and at most every ``save_interval_s`` for
  other changes, a snapshot of :class:`~adaptdl_core.decision.CoreState` is taken in the
  caller's thread (consistent) and written by a :class:`~adaptdl_core.decision.StateWriter`
  thread (atomic: temporary file, then rename), so a front-end that restarts continues
  from it.
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import time
from typing import Any, Callable, Hashable

from adaptdl_core import validation

from .core import Decision, DecisionCore
from .solve_request import SolveRequest
from .state import CoreState, StateWriter

LOG = logging.getLogger(__name__)

__all__ = ["CoreDriver", "DEFAULT_SOLVE_WAIT_S", "DEFAULT_SAVE_INTERVAL_S"]

#: How long a hook that starts a solve waits for it, while solves are that quick.
DEFAULT_SOLVE_WAIT_S = 0.02
#: Hints and progress change with every result: other changes are written at most this
#: often (seconds).
DEFAULT_SAVE_INTERVAL_S = 5.0


class CoreDriver:
    """Runs a :class:`DecisionCore`'s solves and keeps its state on disk.

    Args:
        core: the decision core to drive.
        solve_wait_s: seconds a :meth:`step` that starts a solve waits for it while the
            previous solve took no longer; ``None``: solve and write in the calling thread.
        solver: runs a :class:`SolveRequest` in place of ``request.run()`` (called in the
            worker thread); it must fill the request in (``accept`` or ``run``) and not
            raise. Default: solve here.
        save_interval_s: least seconds between two writes of ordinary changes (finite,
            ``>= 0``); solves, :meth:`save` and :meth:`flush` write at once.
        state_dir: where the state file goes (``None``: nowhere until :attr:`state_dir`
            is set).
        monotonic: the clock of the write throttle (seconds; injectable for tests).

    Raises:
        TypeError: ``core`` is not a DecisionCore, or a callback is not callable.
        ValueError: a negative or non-finite ``solve_wait_s`` or ``save_interval_s``.
    """

    def __init__(self, core: DecisionCore, *, solve_wait_s: float | None = DEFAULT_SOLVE_WAIT_S,
                 solver: Callable[[SolveRequest], None] | None = None,
                 save_interval_s: float = DEFAULT_SAVE_INTERVAL_S,
                 state_dir: str | None = None,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        if not isinstance(core, DecisionCore):
            raise TypeError(f"core must be a DecisionCore, got {core!r}")
        if solve_wait_s is not None:
            validation.number("solve_wait_s", solve_wait_s, 0.0,
                              what="None (always wait) or a finite number of seconds")
        validation.number("save_interval_s", save_interval_s, 0.0,
                          what="a finite number of seconds")
        for name, fn in (("solver", solver), ("monotonic", monotonic)):
            if fn is not None and not callable(fn):
                raise TypeError(f"{name} must be a function, got {fn!r}")
        self.core = core
        self.solve_wait_s = solve_wait_s
        self.solver = solver
        self.save_interval_s = float(save_interval_s)
        #: Directory of the state file (``None``: the state is not written).
        self.state_dir = state_dir
        self._monotonic = monotonic
        self._writer = StateWriter(sync=solve_wait_s is None)
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._inflight: tuple[SolveRequest, concurrent.futures.Future | None] | None = None
        self._last_save = -math.inf
        self._save_pending = False
        #: Seconds the latest applied solve took (``None`` before the first).
        self.last_solve_s: float | None = None

    def __getstate__(self) -> dict:
        # Front-ends are pickled with their configuration (Tune pickles its scheduler):
        # the worker thread and a solve in flight stay behind.
        state = dict(self.__dict__)
        state["_executor"] = state["_inflight"] = None
        return state

    # -- solving --------------------------------------------------------------------
    @property
    def solving(self) -> bool:
        """Whether a solve has started and not been applied yet."""
        return self._inflight is not None

    def step(self, prepare: Callable[[], None] | None = None) -> bool:
        """Apply a finished solve; if none is running and the core says one is due, call
        ``prepare()`` (the front-end brings the core's jobs, hints and nodes up to date),
        start it and wait for it as ``solve_wait_s`` says.

        Returns:
            ``True`` if a solve was applied during this call.
        """
        applied = self.collect(0.0)
        if self._inflight is not None or not self.core.due():
            return applied
        if prepare is not None:
            prepare()
        if self.solve_wait_s is None:
            self._solve_here()
        else:
            request = self.core.begin_solve()
            run = self.solver or SolveRequest.run
            if self._executor is None:
                self._executor = concurrent.futures.ThreadPoolExecutor(
                    1, thread_name_prefix="adaptdl-solve")
            self._inflight = (request, self._executor.submit(run, request))
        return self.collect(self._wait_s()) or applied

    def solve_now(self) -> bool:
        """Solve in the calling thread now, whatever the core's interval and rate limits
        say, after applying the solve in flight (waiting for it): for a front-end that
        must place a job before it can come back for the result (a Tune trial's first
        placement-group request names the accelerator type its decision chose, and Tune
        stages the trial right after adding it).

        Returns:
            ``True`` if the solve was applied (a failed one is logged, as in
            :meth:`collect`, and the jobs keep their targets)."""
        self.collect(None)
        self._solve_here()
        return self.collect(None)

    def _solve_here(self) -> None:
        """Take the core's inputs and solve them in this thread; the result is in flight
        until :meth:`collect` applies it."""
        request = self.core.begin_solve()
        (self.solver or SolveRequest.run)(request)
        self._inflight = (request, None)

    def decide(self, prepare: Callable[[], None] | None = None) -> dict[Hashable, Decision]:
        """:meth:`step`, then the standing decision of every live job (what
        :meth:`DecisionCore.decide` answers, with the solve driven by this driver)."""
        self.step(prepare)
        return {job_id: self.core.decision_for(job_id)
                for job_id, record in self.core.state.jobs.items() if record.live}

    def _wait_s(self) -> float | None:
        """How long a step waits for the solve it started: ``solve_wait_s`` while solves
        are quick, else not at all (its wait would time out anyway, and waking up again
        beside a busy solve thread can take many times the wait)."""
        if self.solve_wait_s is None:
            return None
        if self.last_solve_s is not None and self.last_solve_s > self.solve_wait_s:
            return 0.0
        return self.solve_wait_s

    def collect(self, wait_s: float | None = 0.0) -> bool:
        """Apply the solve in flight if it has finished (waiting up to ``wait_s`` seconds;
        ``None``: until it has). A failed solve is logged and the jobs keep their targets.

        Returns:
            ``True`` if a solve was applied."""
        if self._inflight is None:
            return False
        request, future = self._inflight
        if future is not None:
            try:
                future.result(timeout=wait_s)
            except concurrent.futures.TimeoutError:
                return False
        self._inflight = None
        self.last_solve_s = request.seconds
        try:
            self.core.finish_solve(request)
        except ValueError as exc:
            LOG.warning("the allocation failed (%s); the jobs keep their sizes", exc)
            return False
        # Solves are rate-limited by the core (its interval and event gap), so are these.
        self.save()
        return True

    # -- state ----------------------------------------------------------------------
    def save_soon(self) -> None:
        """Mark the state as changed: it is written within ``save_interval_s``."""
        self._save_pending = True
        self.save_if_due()

    def save_if_due(self) -> None:
        """Write a pending change once ``save_interval_s`` has passed since the last
        write (a hook then never pays for a write per event)."""
        if self._save_pending and \
                self._monotonic() - self._last_save >= self.save_interval_s:
            self.save()

    def save(self) -> None:
        """Snapshot the state now (serialised in this thread, so it is consistent) and
        have the writer thread write it (this thread when ``solve_wait_s`` is ``None``).
        A state that cannot be serialised is logged, not raised."""
        self._last_save = self._monotonic()
        self._save_pending = False
        if self.state_dir is None:
            return
        try:
            text = self.core.state.to_json()
        except ValueError as exc:  # a non-finite number slipped into a record
            LOG.warning("could not serialise the decision state: %s", exc)
            return
        self._writer.submit(self.state_dir, text)

    def restore_saved(self) -> int | None:
        """Continue the core from the state file in :attr:`state_dir` (see
        :meth:`~adaptdl_core.decision.DecisionCore.restore`), if there is one. Returns how
        many jobs it recorded, or ``None`` when there was none to read; an unreadable file
        is logged and ignored (the core starts afresh, and the next save replaces it)."""
        if self.state_dir is None:
            return None
        try:
            saved = CoreState.load(self.state_dir)
        except (OSError, ValueError) as exc:
            LOG.warning("ignoring the saved decision state in %s (%s); starting afresh",
                        self.state_dir, exc)
            return None
        if saved is None:
            return None
        self.core.restore(saved)
        return len(saved.jobs)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until the snapshots taken so far are written (at most ``timeout`` seconds;
        ``None``: as long as it takes). Returns ``True`` if nothing is left to write."""
        return self._writer.flush(timeout)

    @property
    def writer(self) -> StateWriter:
        """The state writer (its ``writes`` and ``failures`` counts, read-only use)."""
        return self._writer

    def describe(self) -> dict[str, Any]:
        """Counters for logs and tests: solves applied, the last solve's seconds, writes."""
        return {"solves": self.core.state.num_allocations, "last_solve_s": self.last_solve_s,
                "writes": self._writer.writes, "write_failures": self._writer.failures}
