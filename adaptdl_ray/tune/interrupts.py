"""The driver's first Ctrl-C or SIGTERM: let AdaptDL trials save, then let Tune stop.

Ray Tune ends a run on the first SIGINT by stopping every trial where it is (a trial then
resumes from its last checkpoint, repeating the work since), and does not handle SIGTERM
at all. :class:`InterruptRelay` is installed by ``AdaptDLScheduler`` in Tune's event loop
(the main thread, after Tune's own handler): the first SIGINT or SIGTERM only records the
request, the scheduler asks every running trial to save at its next batch boundary, and
once they have (or ``deadline_s`` passed) it hands the signal to Tune's handler, which ends
the run gracefully. A second signal goes straight to the previous handler (Tune's, then
the default one).
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from typing import Any, Callable, Iterable

LOG = logging.getLogger(__name__)

__all__ = ["InterruptRelay", "InterruptSave", "unsaved_trials"]

# A signal arriving this long after the scheduler's last hook call finds no live Tune run
# (the run ended): it goes straight to the previous handler.
_IDLE_S = 5.0
# On an interrupt, time for writing the trials' state on top of their stop timeouts.
_INTERRUPT_MARGIN_S = 30.0


def unsaved_trials(trials: Iterable[tuple[str, str, bool]], acked: Iterable[str]) -> set[str]:
    """The trials an interrupt must still wait for before Tune may stop the run.

    A trial counts as saved only once it acknowledged the interrupt (its state is in its
    trial directory) or once it neither runs nor saves. A trial inside a Tune save (a
    user checkpoint, a periodic one, the save before a pause) is never saved "enough":
    Tune records that checkpoint only when the save returns, so stopping the run during
    it loses it; a running trial acknowledges after that save, at its next step.

    Args:
        trials: ``(trial id, Tune status, whether a Tune save is in flight)`` of every
            trial of the run.
        acked: ids of the trials that acknowledged the interrupt.

    Returns:
        the ids still to wait for.
    """
    done = set(acked)
    return {trial_id for trial_id, status, saving in trials
            if saving or (status == "RUNNING" and trial_id not in done)}


class InterruptRelay:
    """Holds back the first SIGINT/SIGTERM of a Tune run until the trials have saved.

    Args:
        clock: monotonic seconds (injectable for tests).
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._previous: dict[int, Any] = {}
        self._requested_at: float | None = None
        self._last_seen = clock()
        self._released = False

    @property
    def requested_at(self) -> float | None:
        """When the held-back signal arrived (``clock`` seconds), or ``None``."""
        return self._requested_at

    def install(self) -> bool:
        """Put the relay in front of the current SIGINT handler and of the default SIGTERM
        action (a SIGTERM handler the program installed itself is left alone). Idempotent;
        does nothing outside the main thread.

        Returns:
            True if the relay handles at least one signal now.
        """
        self._last_seen = self._clock()
        if self._previous or self._requested_at is not None:
            return bool(self._previous)
        if threading.current_thread() is not threading.main_thread():
            return False
        for sig in self.SIGNALS:
            current = signal.getsignal(sig)
            if sig == signal.SIGTERM and current not in (signal.SIG_DFL, None):
                continue
            signal.signal(sig, self._handle)
            self._previous[sig] = current
        return bool(self._previous)

    def alive(self) -> None:
        """Note that the run is alive (called from every scheduler hook)."""
        self._last_seen = self._clock()

    def _handle(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        self._restore()
        if self._clock() - self._last_seen > _IDLE_S:
            signal.raise_signal(signum)  # no live run: the previous handler takes it
            return
        self._requested_at = self._clock()
        LOG.warning("%s received: AdaptDL trials are saving where they are before Tune stops "
                    "(send it again to stop at once)", name)

    def _restore(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous = {}

    def release(self) -> None:
        """Hand the held-back signal to Tune's SIGINT handler (ends the run gracefully)."""
        if self._released or self._requested_at is None:
            return
        self._released = True
        handler = signal.getsignal(signal.SIGINT)
        if callable(handler):
            handler(signal.SIGINT, None)
        else:
            raise KeyboardInterrupt

    def uninstall(self) -> None:
        """Restore the previous handlers (idempotent)."""
        self._restore()


class InterruptSave:
    """The wait between the held-back signal and Tune's stop: every running trial is told
    (through the experiment's control actor) to save at its next batch boundary, and the
    run may stop once each has acknowledged or is no longer running, or once the longest
    stop timeout of the live trials (plus a margin for writing their state) has passed.

    Args:
        relay: the signal relay (a new one by default).
        clock: monotonic seconds (injectable for tests).
    """

    def __init__(self, relay: InterruptRelay | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.relay = relay or InterruptRelay(clock)
        self._clock = clock
        self._deadline: float | None = None
        self._done = False

    @property
    def requested(self) -> bool:
        """Whether a signal is held back (no trial starts or resizes from then on)."""
        return self.relay.requested_at is not None

    def step(self, trials: Iterable[tuple[str, str, bool]], stop_timeout_s: float,
             control: Any) -> bool:
        """Advance the wait; ``True`` exactly once, when the run may stop (then write the
        experiment's state and call :meth:`release`).

        Args:
            trials: ``(trial id, Tune status, whether a Tune save is in flight)`` of every
                trial of the run.
            stop_timeout_s: the longest stop timeout of the live trials (seconds).
            control: the experiment's control actor (``None``: not on Ray; nothing to tell).
        """
        if not self.requested or self._done:
            return False
        import ray

        trials = list(trials)
        if self._deadline is None:
            self._deadline = self._clock() + stop_timeout_s + _INTERRUPT_MARGIN_S
            if control is not None:
                control.interrupt.remote()
            LOG.warning("saving %d running trial(s) before stopping",
                        sum(status == "RUNNING" for _, status, _ in trials))
        acked = ray.get(control.acks.remote(), timeout=10) if control is not None else []
        waiting = unsaved_trials(trials, acked)
        if waiting and self._clock() < self._deadline:
            return False
        if waiting:
            LOG.warning("trials %s did not save in time; stopping anyway", sorted(waiting))
        self._done = True
        return True

    def release(self) -> None:
        """Hand the held-back signal to Tune (see :meth:`InterruptRelay.release`)."""
        self.relay.release()
