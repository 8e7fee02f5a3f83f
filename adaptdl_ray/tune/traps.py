"""Silent traps of an AdaptDL sweep, each named once when it is seen, with the fix.

:class:`AdaptDLScheduler` resizes a trial only at one of its results, and only once its
remaining training is known (from ``remaining_epochs_until(N)``'s bound and its finished
epochs). Two kinds of trial therefore keep their size whatever the policy proposes, and
nothing said so:

* a trial that reports no planned number of epochs (``adaptdl/epochs`` is 0: it does not
  loop over ``remaining_epochs_until(N)``): its remaining training is never known;
* a trial that reports only at its end, or never: the policy wants another size, and no
  result comes to act on.

:class:`TrapWatch` is a plain object with an injected clock: the scheduler feeds it
results and, on its periodic check, the running trials' proposed and current sizes, and
logs what it returns. A trial run without AdaptDLScheduler at all (alone, or under
``ASHAScheduler``) keeps ``min_replicas``: the trial, which then finds no control actor,
says so (:func:`warn_unscheduled`).
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any, Callable, Iterable, Mapping

LOG = logging.getLogger(__name__)

__all__ = ["TrapWatch", "SILENT_AFTER_S", "warn_unscheduled"]

#: Seconds without a result after which a running trial that the policy would resize is
#: named (at least; also at least one allocation interval).
SILENT_AFTER_S = 60.0


class TrapWatch:
    """Remembers when each trial was last heard from; names each trap once per run.

    Args:
        allocation_interval_s: the scheduler's interval (a trial silent for less than
            this is not suspected: the policy may not even have re-solved).
        clock: monotonic seconds (injectable for tests).
    """

    def __init__(self, allocation_interval_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._silent_after_s = max(SILENT_AFTER_S, float(allocation_interval_s))
        self._clock = clock
        self._heard: dict[str, float] = {}
        self._named: set[str] = set()

    def result(self, trial_id: str, result: Mapping[str, Any],
               resizable: bool) -> str | None:
        """A result of ``trial_id`` arrived.

        Args:
            result: the result (its ``adaptdl/epochs`` is read).
            resizable: the trial's ``min_replicas < max_replicas`` (or no maximum).

        Returns:
            a warning to log (the first such trial of the run only), or ``None``.
        """
        self._heard[trial_id] = self._clock()
        epochs = result.get("adaptdl/epochs")
        planned = isinstance(epochs, (int, float)) and not isinstance(epochs, bool) and \
            math.isfinite(epochs) and epochs > 0
        if planned or not resizable or "no-epochs" in self._named:
            return None
        self._named.add("no-epochs")
        return (f"trial {trial_id} reports no planned number of epochs (adaptdl/epochs is 0), "
                "so its remaining training is unknown and AdaptDLScheduler never resizes it. "
                "Loop over adaptdl_core.torch.remaining_epochs_until(N) in the training "
                "function")

    def forget(self, trial_id: str) -> None:
        """The trial ended (or was paused): its silence means nothing."""
        self._heard.pop(trial_id, None)

    def check(self, running: Iterable[tuple[str, int, int]]) -> str | None:
        """The periodic check.

        Args:
            running: ``(trial id, replicas the policy proposes, replicas it holds)`` of
                every running trial.

        Returns:
            a warning to log (the first silent trial the policy would resize, once per
            run), or ``None``.
        """
        now = self._clock()
        for trial_id, proposed, current in running:
            since = self._heard.setdefault(trial_id, now)
            if "silent" in self._named or proposed in (0, current) or \
                    now - since < self._silent_after_s:
                continue
            self._named.add("silent")
            return (f"trial {trial_id} has reported nothing for {now - since:.0f} s while "
                    f"AdaptDLScheduler would resize it from {current} to {proposed} "
                    "replicas: a trial is resized only at a result, so one that reports "
                    "only at its end (or never) keeps its size. Call tune.report(...) every "
                    "epoch (or more often)")
        return None


def warn_unscheduled(spec: Any) -> None:
    """Name the trap of an AdaptDL trial run without AdaptDLScheduler (alone or under
    ASHAScheduler): nothing resizes it. The text holds no trial name, so that Ray's log
    deduplication shows it once for the whole sweep.

    Args:
        spec: the trial's replica spec (``min_replicas``, ``max_replicas``); a fixed size
            (``min_replicas == max_replicas``) is not a trap.
    """
    if spec.max_replicas == spec.min_replicas:
        return
    LOG.warning("no AdaptDLScheduler runs this experiment, so AdaptDL trials train at a fixed "
                "min_replicas=%d replica(s) and are never resized. To resize them, pass "
                "tune.TuneConfig(scheduler=AdaptDLScheduler()), or AdaptDLScheduler("
                "base_scheduler=ASHAScheduler(...)) to keep early stopping",
                spec.min_replicas)
