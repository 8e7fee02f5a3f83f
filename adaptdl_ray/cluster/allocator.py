"""The cluster allocator: one Ray actor that divides a shared cluster among every AdaptDL job.

Every :class:`~adaptdl_ray.tune.AdaptDLScheduler` (each experiment, each ``run_job``) and
every command-line job on a cluster asks this actor, instead of its own policy, how many
replicas each of its jobs gets: :class:`ClusterAllocator` hosts one
:class:`~adaptdl_core.decision.SharedSolve` (one power-mean objective over every job on the
cluster) and keeps it fed with the cluster's capacity, less what other work holds.

It is a named, detached actor (one per cluster and namespace, see
:mod:`adaptdl_ray.cluster.client`), pinned to the head node and restarted by Ray if it
dies; its state (every job's place, age and history) is written to a file on the head
node after each change, so a restarted allocator continues where it stopped. Each job's
replicas, batch size, goodput and restarts are exported as Ray metrics
(``adaptdl_job_*``, tagged with the job and experiment), beside Ray's own in its
dashboard and Prometheus export.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Mapping

from adaptdl_core.decision import SharedSolve, write_atomic

LOG = logging.getLogger(__name__)

__all__ = ["ClusterAllocator", "STATE_FILE"]

#: Name of the state file in the allocator's state directory.
STATE_FILE = "adaptdl_allocator_state.json"
# The cluster's node list and free resources are re-read at most this often (seconds).
_NODES_TTL_S = 2.0
# Ordinary changes (hints, progress) are written at most this often; solves at once.
_SAVE_INTERVAL_S = 2.0


class ClusterAllocator:
    """Actor body: a :class:`SharedSolve` over the cluster's capacity.

    Args:
        state_dir: directory of the state file (created if missing); the state found
            there is continued.
        interval_s: seconds after which a sync re-divides the cluster even when nothing
            changed.
        policy: a policy name of :func:`~adaptdl_core.policy.policy_by_name`
            (``"pollux"`` by default).
        nodes_fn: returns ``(totals, available)``, both node -> resource -> amount
            (default: the alive Ray nodes; tests pass their own).
    """

    def __init__(self, state_dir: str, *, interval_s: float = 30.0, policy: str = "pollux",
                 nodes_fn: Any = None) -> None:
        self.state_dir = state_dir
        self._shared = SharedSolve(policy, interval_s=interval_s)
        self._nodes_fn = nodes_fn or _ray_capacity
        self._nodes_read = -float("inf")
        self._last_save = -float("inf")
        self._gauges: dict[str, Any] | None = None
        self._exported: set = set()
        self.started = time.time()
        path = os.path.join(state_dir, STATE_FILE)
        if os.path.exists(path):
            try:
                with open(path) as f:
                    self._shared.restore(f.read())
                LOG.info("allocator: continued from %s (%d members)", path,
                         len(self._shared.members))
            except (OSError, ValueError) as exc:
                LOG.warning("allocator: could not read its state %s (%s); starting afresh",
                            path, exc)

    # -- called by front-ends -------------------------------------------------------
    def sync(self, member: str, request: Mapping[str, Any], label: str | None = None,
             interval_s: float | None = None, kind: str = "tune") -> dict[str, Any]:
        """A front-end's solve (see :meth:`SharedSolve.sync`): its jobs' shares."""
        self._refresh_nodes()
        reply = self._shared.sync(member, request, label=label, interval_s=interval_s,
                                  kind=kind)
        self._after_change(force=reply["solved"])
        return reply

    def leave(self, member: str) -> bool:
        """A front-end ended: its jobs' share is freed."""
        known = self._shared.leave(member)
        self._after_change(force=True)
        return known

    # -- called by people (the command line) ----------------------------------------
    def jobs(self) -> list[dict[str, Any]]:
        """Every job on the cluster (see :meth:`SharedSolve.rows`)."""
        self._shared.expire()
        return self._shared.rows()

    def status(self) -> dict[str, Any]:
        """The allocator's counters, where it keeps its state and since when it runs."""
        self._refresh_nodes()
        return dict(self._shared.status(), alive=True, state_dir=self.state_dir,
                    started=self.started, pid=os.getpid())

    def history(self) -> dict[str, list]:
        """Each job's share over time: job key -> ``[time, replicas]`` per change."""
        return {k: [list(e) for e in v] for k, v in self._shared.history.items()}

    def ping(self) -> bool:
        """Returns ``True`` (a liveness check)."""
        return True

    # -- internals ------------------------------------------------------------------
    def _refresh_nodes(self) -> None:
        now = time.monotonic()
        if now - self._nodes_read < _NODES_TTL_S:
            return
        self._nodes_read = now
        try:
            totals, available = self._nodes_fn()
        except Exception as exc:  # noqa: BLE001 - keep the last capacity, say why
            LOG.warning("allocator: could not read the cluster's resources (%s)", exc)
            return
        from adaptdl_core.decision import capacity_left
        self._shared.set_nodes(capacity_left(totals, available, self._shared.held()))

    def _after_change(self, force: bool) -> None:
        now = time.monotonic()
        if force or now - self._last_save >= _SAVE_INTERVAL_S:
            self._last_save = now
            try:
                write_atomic(self.state_dir, STATE_FILE, self._shared.to_json())
            except (OSError, ValueError) as exc:
                LOG.warning("allocator: could not write its state to %s: %s", self.state_dir,
                            exc)
            self._export_metrics()

    def _export_metrics(self) -> None:
        """Each job's replicas, target, batch size, goodput and restarts as Ray gauges."""
        try:
            from ray.util import metrics
        except ImportError:  # pragma: no cover - ray always has it
            return
        if self._gauges is None:
            tags = ("job", "experiment")
            self._gauges = {
                "replicas": metrics.Gauge("adaptdl_job_replicas", "replicas a job runs on",
                                          tag_keys=tags),
                "target": metrics.Gauge("adaptdl_job_target_replicas",
                                        "replicas the allocator gives a job", tag_keys=tags),
                "batch_size": metrics.Gauge("adaptdl_job_batch_size",
                                            "a job's predicted total batch size",
                                            tag_keys=tags),
                "goodput": metrics.Gauge("adaptdl_job_goodput",
                                         "a job's predicted goodput (samples/s)",
                                         tag_keys=tags),
                "restarts": metrics.Gauge("adaptdl_job_restarts",
                                          "a job's checkpoint-restarts", tag_keys=tags)}
        seen = set()
        for row in self._shared.rows():
            tags = {"job": str(row["name"]), "experiment": str(row["experiment"])}
            seen.add((tags["job"], tags["experiment"]))
            for key, gauge in self._gauges.items():
                value = row.get(key)
                if value is not None:
                    gauge.set(float(value), tags=tags)
        for job, experiment in self._exported - seen:  # ended jobs read 0
            for gauge in self._gauges.values():
                gauge.set(0.0, tags={"job": job, "experiment": experiment})
        self._exported = seen


def _ray_capacity() -> tuple[dict, dict]:
    """(totals, available) of the alive Ray nodes, node id -> resource -> amount."""
    from adaptdl_ray.tune._ray_private import available_resources_per_node
    from adaptdl_ray.tune.resources import cluster_nodes
    totals = {node: dict(info.resources) for node, info in cluster_nodes().items()}
    return totals, available_resources_per_node()
