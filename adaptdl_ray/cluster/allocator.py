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

With autoscaling on (:meth:`ClusterAllocator.set_autoscale`, or ``adaptdl-ray start
--autoscale``), each re-division is followed by Pollux's cluster-size rule
(:class:`~adaptdl_core.policy.ClusterSizeRule`) over every job, and the size it wants is
asked of Ray's autoscaler (:class:`~adaptdl_ray.autoscale.ResourceRequester`), or the
request withdrawn when no node beyond the baseline is wanted.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import time
from typing import Any, Mapping

from adaptdl_core.decision import SharedSolve, write_atomic

LOG = logging.getLogger(__name__)

__all__ = ["ClusterAllocator", "STATE_FILE", "AUTOSCALE_FILE", "autoscale_parts",
           "template_nodes"]

#: Name of the state file in the allocator's state directory.
STATE_FILE = "adaptdl_allocator_state.json"
#: Name of the file that keeps the autoscaling options across the allocator's restarts.
AUTOSCALE_FILE = "adaptdl_allocator_autoscale.json"
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
        nodes_fn: returns ``(totals, available)``, both node -> resource -> amount, or
            ``(totals, available, types)`` with node -> accelerator type (default: the
            alive Ray nodes; tests pass their own).
        request_fn: what asks the autoscaler for resources, called as
            ``request_fn(bundles=[...])`` (default Ray's ``request_resources``; tests
            pass a recorder).
        autoscale_interval_s: the cluster-size rule runs at most this often (seconds).
            It solves one allocation per size it tries, inside a front-end's sync (the
            actor serves one call at a time), and nodes take minutes to come anyway;
            ``benchmarks/cluster_size.py`` measures its time.

    Autoscaling options found in the state directory are taken up again.
    """

    def __init__(self, state_dir: str, *, interval_s: float = 30.0, policy: str = "pollux",
                 nodes_fn: Any = None, request_fn: Any = None,
                 autoscale_interval_s: float = 30.0) -> None:
        self.state_dir = state_dir
        self.policy_name = policy
        self._shared = SharedSolve(policy, interval_s=interval_s)
        self._nodes_fn = nodes_fn or _ray_capacity
        self._nodes_read = -float("inf")
        self._last_save = -float("inf")
        self._gauges: dict[str, Any] | None = None
        self._exported: set = set()
        self._totals: dict = {}
        self._request_fn = request_fn
        self._autoscale_interval_s = float(autoscale_interval_s)
        self._autoscale: _Autoscaling | None = None
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
        path = os.path.join(state_dir, AUTOSCALE_FILE)
        if os.path.exists(path):
            try:
                with open(path) as f:
                    options = json.load(f)
                if options:
                    self._autoscale = self._scaling(options)
            except (OSError, ValueError) as exc:
                LOG.warning("allocator: could not take up its autoscaling options %s (%s); "
                            "autoscaling is off", path, exc)

    # -- called by front-ends -------------------------------------------------------
    def sync(self, member: str, request: Mapping[str, Any], label: str | None = None,
             interval_s: float | None = None, kind: str = "tune",
             owner: str | None = None) -> dict[str, Any]:
        """A front-end's solve (see :meth:`SharedSolve.sync`): its jobs' shares."""
        self._refresh_nodes()
        reply = self._shared.sync(member, request, label=label, interval_s=interval_s,
                                  kind=kind, owner=owner)
        self._after_change(force=reply["solved"])
        if reply["solved"]:
            self._size_cluster()
        return reply

    def leave(self, member: str, outcomes: Mapping[str, str] | None = None) -> bool:
        """A front-end ended: its jobs' share is freed (``outcomes``: job id -> how it
        ended, for listings)."""
        known = self._shared.leave(member, outcomes)
        self._after_change(force=True)
        return known

    # -- called by people (the command line) ----------------------------------------
    def jobs(self) -> list[dict[str, Any]]:
        """Every job on the cluster (see :meth:`SharedSolve.rows`)."""
        self._shared.expire()
        return self._shared.rows()

    def status(self) -> dict[str, Any]:
        """The allocator's counters, its policy, where it keeps its state, since when it
        runs, and its autoscaling (``None`` when off; else its options, the nodes the standing
        request asks for and the rule's last decision)."""
        self._refresh_nodes()
        autoscale = None
        if self._autoscale is not None:
            autoscale = dict(options=self._autoscale.options,
                             standing_nodes=self._autoscale.requester.standing_nodes,
                             last=self._autoscale.last)
        return dict(self._shared.status(), alive=True, state_dir=self.state_dir,
                    started=self.started, pid=os.getpid(), autoscale=autoscale,
                    policy=self.policy_name)

    def set_autoscale(self, options: Mapping[str, Any] | None) -> dict[str, Any] | None:
        """Turn autoscaling on with ``options``, or off with ``None`` (the standing
        request is then withdrawn, so Ray may remove idle nodes again).

        Args:
            options: ``{"node_template": {resource: amount}, "min_nodes": int,
                "max_nodes": int}``, optionally ``"baseline_nodes"`` (nodes the cluster
                keeps without asking; default 0), ``"upper"`` and ``"lower"`` (the rule's
                U and L). See :func:`autoscale_parts`.

        Returns:
            :meth:`status`'s ``"autoscale"`` after the change (the rule has run once).

        Raises:
            ValueError: a malformed option (named), before anything changes."""
        new = self._scaling(options) if options else None
        if self._autoscale is not None and new is None:
            self._autoscale.requester.withdraw()
        self._autoscale = new
        try:
            write_atomic(self.state_dir, AUTOSCALE_FILE,
                         json.dumps(new.options if new else None))
        except (OSError, ValueError) as exc:
            LOG.warning("allocator: could not keep its autoscaling options in %s: %s",
                        self.state_dir, exc)
        self._refresh_nodes()
        self._size_cluster()
        return self.status()["autoscale"]

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
            totals, available, *types = self._nodes_fn()
        except Exception as exc:  # noqa: BLE001 - keep the last capacity, say why
            LOG.warning("allocator: could not read the cluster's resources (%s)", exc)
            return
        self._totals = totals
        self._shared.set_usage(totals, available, types[0] if types else None)

    def _scaling(self, options: Mapping[str, Any]) -> _Autoscaling:
        """The autoscaling state for ``options`` (raises ValueError for a bad one)."""
        return _Autoscaling(*autoscale_parts(options, self._request_fn))

    def _size_cluster(self) -> None:
        """Run the cluster-size rule (at most every ``autoscale_interval_s``) and ask the
        autoscaler for what it wants. A failure is logged; the next solve retries."""
        scale = self._autoscale
        now = time.monotonic()
        if scale is None or now - scale.checked < self._autoscale_interval_s:
            return
        scale.checked = now
        rule = scale.rule
        current = template_nodes(self._totals, rule.node_template)
        try:
            decision = self._shared.desired_size(rule, current)
            scale.requester.request(decision.desired_nodes)
        except Exception as exc:  # noqa: BLE001 - keep allocating; say why
            LOG.warning("allocator: autoscaling failed this round (%s)", exc)
            return
        scale.last = dict(time=time.time(), current_nodes=current,
                          desired_nodes=decision.desired_nodes, action=decision.action,
                          reason=decision.reason)
        if decision.action != "hold":
            LOG.info("allocator: cluster size %d -> %d (%s)", current,
                     decision.desired_nodes, decision.reason)

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
            if row.get("ended") is not None:
                continue  # (listed, not measured)
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


@dataclasses.dataclass
class _Autoscaling:
    """The allocator's autoscaling: its options, rule and standing request, the rule's
    last decision (for ``status``) and when it last ran (``time.monotonic()``)."""

    options: dict
    rule: Any
    requester: Any
    last: dict | None = None
    checked: float = -math.inf


def autoscale_parts(options: Mapping[str, Any], request_fn: Any = None
                    ) -> tuple[dict[str, Any], Any, Any]:
    """Check autoscaling options and build what they describe.

    Args:
        options: see :meth:`ClusterAllocator.set_autoscale`.
        request_fn: passed to the :class:`~adaptdl_ray.autoscale.ResourceRequester`.

    Returns:
        ``(options as plain data, ClusterSizeRule, ResourceRequester)``.

    Raises:
        ValueError: an unknown or malformed option; the message names it and the fix."""
    from adaptdl_core.policy import ClusterSizeRule
    from adaptdl_ray.autoscale import ResourceRequester
    if not isinstance(options, Mapping):
        raise ValueError(f"autoscale options must be a dict, got {options!r}")
    known = {"node_template", "min_nodes", "max_nodes", "baseline_nodes", "upper", "lower"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ValueError(f"unknown autoscale option(s) {unknown}: use {sorted(known)}")
    missing = [k for k in ("node_template", "min_nodes", "max_nodes") if k not in options]
    if missing:
        raise ValueError(f"autoscale options need {missing} (e.g. node_template={{'CPU': 8}}, "
                         "min_nodes=1, max_nodes=8)")
    plain = json.loads(json.dumps(dict(options)))
    rule_args = {k: plain[k] for k in ("upper", "lower") if k in plain}
    requester = ResourceRequester(plain["node_template"],
                                  baseline_nodes=plain.get("baseline_nodes", 0),
                                  request_fn=request_fn)
    rule = ClusterSizeRule(plain["node_template"], plain["min_nodes"], plain["max_nodes"],
                           **rule_args)
    return plain, rule, requester


def template_nodes(totals: Mapping[Any, Mapping[str, float]],
                   template: Mapping[str, float]) -> int:
    """How many of the nodes (node -> resource -> amount) hold a whole ``template``."""
    return sum(1 for resources in totals.values()
               if all(float(resources.get(k, 0.0)) >= float(v) for k, v in template.items()))


def _ray_capacity() -> tuple[dict, dict, dict]:
    """(totals, available, types) of the alive Ray nodes: node id -> resource -> amount,
    and node id -> accelerator type (``None``: none known)."""
    from adaptdl_ray.replicas._ray_private import available_resources_per_node
    from adaptdl_ray.replicas.nodes import cluster_nodes
    nodes = cluster_nodes()
    totals = {node: dict(info.resources) for node, info in nodes.items()}
    types = {node: info.accelerator_type for node, info in nodes.items()}
    return totals, available_resources_per_node(), types
