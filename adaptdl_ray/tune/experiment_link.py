"""What an AdaptDLScheduler keeps on Ray for its experiment: the experiment's control actor,
the interrupt relay, its membership of the cluster allocator, and its state file.

All of it starts lazily, at the scheduler's first hook on a running Ray (Tune constructs
and pickles the scheduler before Ray may be up); a scheduler used without Ray (unit tests,
scripted benchmarks) has none of it and decides alone.
"""

from __future__ import annotations

import logging
from typing import Any

from adaptdl_core.decision import CoreDriver
from adaptdl_ray.cluster.client import AllocatorSolver, new_member_id
from adaptdl_ray.tune import control
from adaptdl_ray.tune.interrupts import InterruptSave
from adaptdl_ray.tune.trial_sizes import TrialSizes

LOG = logging.getLogger(__name__)

__all__ = ["ExperimentLink"]


class ExperimentLink:
    """The experiment's links to Ray (see the module docstring).

    Args:
        sizes: the trials' sizes (the control actor, once started, is set on it).
        driver: the experiment's core driver (its solves go to the allocator when shared;
            its state file goes to the experiment directory).
        share_cluster: join the cluster allocator.
        policy_name: the allocator's policy if this experiment starts it.
    """

    def __init__(self, sizes: TrialSizes, driver: CoreDriver, *, share_cluster: bool,
                 policy_name: str) -> None:
        self.sizes = sizes
        self.driver = driver
        self.share_cluster = share_cluster
        self.policy_name = policy_name
        self.allocator: AllocatorSolver | None = None
        self.interrupts = InterruptSave()
        self._restored = False

    def __getstate__(self) -> dict:
        # (Tune pickles the scheduler before the run: an interrupt does not travel, a
        # restored run starts uninterrupted.)
        state = dict(self.__dict__)
        state["interrupts"] = InterruptSave()
        return state

    def hook(self) -> None:
        """At every scheduler hook: on a running Ray, start what is not started yet."""
        import ray

        if self.sizes.control is not None or not ray.is_initialized():
            return
        self.sizes.control = control.start()
        self.interrupts.relay.install()
        if self.share_cluster and self.allocator is None:
            self.allocator = AllocatorSolver(new_member_id("tune"), "experiment",
                                             interval_s=self.driver.core.interval_s,
                                             policy=self.policy_name)
            self.driver.solver = self.allocator

    def attach(self, storage: Any) -> int | None:
        """A trial's Tune storage (``None`` outside Tune): the state file goes to its
        experiment's driver staging directory (Tune uploads it with the experiment and
        ``Tuner.restore`` brings it back) and, the first time, the saved state is restored
        from there. Returns how many trials the restored state recorded, or ``None``."""
        if self.driver.state_dir is None:
            self.driver.state_dir = getattr(storage, "experiment_driver_staging_path", None)
        name = getattr(storage, "experiment_dir_name", None)
        if self.allocator is not None and name:
            self.allocator.label = name  # what `adaptdl-ray ls` shows as the experiment
        if self._restored or self.driver.state_dir is None:
            return None
        self._restored = True
        return self.driver.restore_saved()

    def leave(self) -> None:
        """No trial is live: this experiment's share of the cluster is freed now (it joins
        again with its next trial), with how its last trials ended."""
        if self.allocator is not None:
            self.allocator.leave({str(k): v for k, v in
                                  self.driver.core.pending_outcomes().items()})

    def last_write(self, flush_s: float) -> None:
        """The experiment may be over (no live trial, or an interrupt): leave the cluster
        and write the state now, waiting at most ``flush_s`` seconds for the write."""
        self.leave()
        self.driver.save()
        self.driver.flush(flush_s)

    def announce_pause(self, trial_id: str) -> None:
        """Tell the trial that the save Tune asks for next precedes a pause, so that its
        replicas stop at the checkpoint (waited for: the save must not overtake it)."""
        import ray

        if self.sizes.control is None:
            return
        try:
            ray.get(self.sizes.control.pausing.remote(trial_id), timeout=10)
        except ray.exceptions.RayError as exc:
            LOG.warning("trial %s: could not announce its pause (%s); its replicas train on "
                        "until stopped", trial_id, exc)
