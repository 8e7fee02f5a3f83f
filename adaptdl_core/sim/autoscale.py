"""Elastic clusters in the simulator: autoscaling by a cluster-size rule, spot preemptions.

:class:`ElasticCluster` is the ``cluster`` of :func:`adaptdl_core.sim.rounds.run_rounds`: at
every step it says which nodes are usable, and it keeps the books (node-hours, cost,
preemptions). :func:`adaptdl_core.sim.cluster.simulate` builds one from
:class:`ElasticSettings` (``python -m adaptdl_core.sim cluster --autoscale ...``).

The model, in the order :meth:`ElasticCluster.update` applies it at each step (a step is one
scheduling round in the cluster mode; node events are seen at round boundaries):

* **Nodes.** All nodes are alike (``gpus_per_node`` GPUs). The nodes the cluster starts
  with are ready at time 0. A node asked for at ``t`` is usable from ``t + node_startup_s``
  (default :data:`DEFAULT_NODE_STARTUP_S`: booting a cloud GPU instance and joining the
  cluster takes minutes). A node counts in the node-hours from its request until it is
  removed, or until the last job ends; ``cost = node_hours * node_hour_cost``.
* **Preemptions** (spot nodes). Each node, once ready, gets a preemption notice after an
  exponentially distributed time of mean ``1 / preemptions_per_node_hour`` hours (a Poisson
  process per node-hour, drawn from ``numpy.random.default_rng(seed)`` in the order the
  nodes are asked for), and is lost ``preemption_notice_s`` seconds after the notice. From
  the first step at or after the notice the node is no longer usable: the jobs on it are
  stopped and re-placed by the policy at that step, paying their restart cost. A job that
  moved by the deadline loses no progress (it checkpoints when it is told to move, as
  AdaptDL's jobs do). A job still on the node after the deadline (the notice was shorter
  than the time to the next step: ``preemption_notice_s = 0`` always is) loses the
  progress since its last checkpoint: jobs checkpoint at every start or change of
  allocation and every ``checkpoint_s`` seconds of running (checked at step boundaries).
  Without autoscaling, a lost node is replaced: a new node is asked for when the old one
  is lost (ready ``node_startup_s`` later). With autoscaling, the node is out of the
  count from its notice, and an autoscaling decision is taken at that step, which asks
  for a replacement if the rule still wants the size.
* **Autoscaling** (``autoscale=True``). The cluster starts with ``min_nodes`` ready nodes.
  Every ``autoscale_every`` rounds (and at a preemption notice) the rule gives the desired
  node count for the active jobs: :class:`~adaptdl_core.policy.ClusterSizeRule` over their
  :class:`~adaptdl_core.policy.JobInfo` (built as the decision core builds them from each
  job's scheduler hints, bounded by what ``max_nodes`` nodes hold, as
  :meth:`SharedSolve.desired_size <adaptdl_core.decision.SharedSolve.desired_size>` does),
  allocated by Pollux (``PolluxPolicy(p=-1, fair_share=True)``, the simulator's policy).
  Rule ``"goodput"`` measures each job by its goodput speedup (Pollux, section 5.4.1);
  ``"throughput"`` by its throughput speedup: the same jobs and rule, with statistical
  efficiency taken as 1 (:func:`throughput_hints`), i.e. a throughput-based autoscaler in
  the manner of Or et al. (MLSys'20): grow while throughput per GPU stays above ``U`` of
  the ideal. A larger count asks for new nodes; a smaller one removes nodes at once: nodes
  still starting first (newest first), then the ready nodes where jobs hold the fewest
  GPUs (newest first among equals); jobs on a removed node are re-placed by the policy,
  paying their restart cost.

Everything is deterministic for a given seed.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from adaptdl_core import validation

from ..decision import NodeInfo, job_info, speedup_from_hints
from ..policy import PolluxPolicy
from ..policy.cluster_size import (DEFAULT_LOWER_UTILITY, DEFAULT_UPPER_UTILITY,
                                   ClusterSizeDecision, ClusterSizeRule)
from .job_model import SimJob
from .pollux import job_spec, remaining_seconds

__all__ = ["RULES", "DEFAULT_NODE_STARTUP_S", "DEFAULT_PREEMPTION_NOTICE_S",
           "DEFAULT_CHECKPOINT_S", "ElasticSettings", "SimNode", "Autoscaler",
           "ElasticCluster", "throughput_hints"]

#: The autoscaling rules: by goodput (Pollux) or by throughput (statistical efficiency 1).
RULES = ("goodput", "throughput")
#: Seconds from asking for a node to its being usable (instance boot and cluster join).
DEFAULT_NODE_STARTUP_S = 180.0
#: Seconds between a preemption notice and the loss of the node (AWS gives two minutes).
DEFAULT_PREEMPTION_NOTICE_S = 120.0
#: Seconds of running between a job's periodic checkpoints (it also checkpoints at every
#: start or change of allocation).
DEFAULT_CHECKPOINT_S = 600.0

# Gradient statistics with an unbounded noise scale: statistical efficiency 1 at any batch.
_NO_NOISE = {"sqr": 1e-300, "var": 1.0}


@dataclass(frozen=True)
class ElasticSettings:
    """How the simulated cluster changes over time (see the module doc).

    Attributes:
        autoscale: change the node count by ``rule`` (else the count is fixed, apart from
            preemptions and their replacements).
        min_nodes: fewest nodes with ``autoscale`` (integer ``>= 1``; ``None``: 1). The
            cluster starts with this many.
        max_nodes: most nodes with ``autoscale`` (integer ``>= min_nodes``; ``None``: the
            simulation's ``nodes``).
        rule: ``"goodput"`` or ``"throughput"`` (``None``: ``"goodput"``).
        autoscale_every: rounds between autoscaling decisions (integer ``>= 1``; ``None``:
            1).
        upper, lower: the rule's ``U`` and ``L`` (``0 < L <= U <= 1``).
        node_startup_s: seconds from asking for a node to its being usable (``>= 0``).
        node_hour_cost: cost of one node for one hour, any currency (``>= 0``; default 1:
            the cost is then the node-hours).
        preemptions_per_node_hour: mean preemptions per node-hour (``>= 0``; 0: none).
        preemption_notice_s: seconds between a preemption's notice and the node's loss
            (``>= 0``).
        checkpoint_s: seconds of running between a job's periodic checkpoints (``> 0``).

    Raises:
        ValueError: for a malformed value (the message names the field, its value and the
            fix), or an autoscaling option without ``autoscale``.
    """

    autoscale: bool = False
    min_nodes: Optional[int] = None
    max_nodes: Optional[int] = None
    rule: Optional[str] = None
    autoscale_every: Optional[int] = None
    upper: float = DEFAULT_UPPER_UTILITY
    lower: float = DEFAULT_LOWER_UTILITY
    node_startup_s: float = DEFAULT_NODE_STARTUP_S
    node_hour_cost: float = 1.0
    preemptions_per_node_hour: float = 0.0
    preemption_notice_s: float = DEFAULT_PREEMPTION_NOTICE_S
    checkpoint_s: float = DEFAULT_CHECKPOINT_S

    def __post_init__(self) -> None:
        """Checks every field (see the class doc)."""
        if not isinstance(self.autoscale, bool):
            raise ValueError(f"autoscale must be True or False, got {self.autoscale!r}")
        given = [name for name in ("min_nodes", "max_nodes", "rule", "autoscale_every")
                 if getattr(self, name) is not None]
        if not self.autoscale and given:
            raise ValueError(f"{given[0]}={getattr(self, given[0])!r} applies with "
                             "autoscale=True (--autoscale) only: turn autoscaling on or drop "
                             "it")
        if self.min_nodes is not None:
            validation.integer("min_nodes", self.min_nodes, 1)
        if self.max_nodes is not None:
            validation.integer("max_nodes", self.max_nodes, max(self.min_nodes or 1, 1))
        if self.rule is not None and self.rule not in RULES:
            raise ValueError(f"rule must be one of {', '.join(RULES)}, got {self.rule!r}")
        if self.autoscale_every is not None:
            validation.integer("autoscale_every", self.autoscale_every, 1)
        for name in ("upper", "lower"):
            validation.number(name, getattr(self, name), 0.0, 1.0, low_open=True,
                              what="a share of the ideal goodput per GPU")
        if self.lower > self.upper:
            raise ValueError(f"lower ({self.lower!r}) must be <= upper ({self.upper!r}); "
                             "the band between them is where the size holds")
        for name in ("node_startup_s", "preemption_notice_s"):
            validation.number(name, getattr(self, name), 0.0,
                              what="a finite number of seconds")
        validation.number("node_hour_cost", self.node_hour_cost, 0.0,
                          what="a finite cost per node-hour")
        validation.number("preemptions_per_node_hour", self.preemptions_per_node_hour, 0.0,
                          what="a finite rate per node-hour")
        validation.number("checkpoint_s", self.checkpoint_s, 0.0, low_open=True,
                          what="a finite number of seconds")

    def resolved(self, nodes: int) -> "ElasticSettings":
        """These settings with the defaults that depend on the cluster filled in: with
        ``autoscale``, ``min_nodes`` 1, ``max_nodes`` ``nodes``, ``rule`` ``"goodput"``,
        ``autoscale_every`` 1.

        Raises:
            ValueError: ``min_nodes`` above the ``max_nodes`` it resolves to (named).
        """
        if not self.autoscale:
            return self
        min_nodes = 1 if self.min_nodes is None else self.min_nodes
        max_nodes = nodes if self.max_nodes is None else self.max_nodes
        if max_nodes < min_nodes:
            raise ValueError(f"max_nodes ({max_nodes}, from --max-nodes or --nodes) must be "
                             f">= min_nodes ({min_nodes}): raise it or lower min_nodes")
        return ElasticSettings(**{**asdict(self), "min_nodes": min_nodes,
                                  "max_nodes": max_nodes, "rule": self.rule or "goodput",
                                  "autoscale_every": self.autoscale_every or 1})


def throughput_hints(hints: Mapping[str, Any]) -> Dict[str, Any]:
    """``hints`` (``SchedHints.to_dict()``) with gradient statistics whose noise scale is
    unbounded, so that statistical efficiency is 1 at any batch: the job's speedup
    function (:func:`~adaptdl_core.decision.speedup_from_hints`) then measures its
    throughput (samples per second at the batch that maximises it, up to its largest
    batch) relative to one replica. Hints without gradient statistics are returned as
    they are (their speedup is the linear prior either way)."""
    if not hints or hints.get("grad_params") is None:
        return dict(hints or {})
    return {**hints, "grad_params": dict(_NO_NOISE)}


class Autoscaler:
    """The desired node count for the simulator's jobs, by a :class:`ClusterSizeRule`.

    Args:
        rule: the rule (its template is one simulated node, e.g. ``{"GPU": 4}``).
        measure: ``"goodput"`` (Pollux) or ``"throughput"`` (see :func:`throughput_hints`).

    Raises:
        ValueError: an unknown ``measure``.
    """

    def __init__(self, rule: ClusterSizeRule, measure: str = "goodput") -> None:
        if measure not in RULES:
            raise ValueError(f"measure must be one of {', '.join(RULES)}, got {measure!r}")
        self.rule = rule
        self.measure = measure
        self._template = {i: NodeInfo(rule.node_template) for i in range(rule.max_nodes)}
        self._speedups: Dict[str, Tuple[dict, Any]] = {}

    def decide(self, now: float, jobs: Mapping[str, SimJob],
               allocations: Mapping[str, Sequence[int]], current_nodes: int
               ) -> ClusterSizeDecision:
        """The rule's decision for the active ``jobs`` (name -> :class:`SimJob`) running on
        ``allocations`` (name -> node ids), with ``current_nodes`` nodes now.

        Raises:
            ValueError: from the rule, for a malformed ``current_nodes`` (named).
        """
        for name in [k for k in self._speedups if k not in jobs]:
            del self._speedups[name]
        infos = {}
        for name, job in jobs.items():
            hints = job.hints().to_dict()
            if self.measure == "throughput":
                hints = throughput_hints(hints)
            cached = self._speedups.get(name)
            if cached is None or cached[0] != hints:
                cached = self._speedups[name] = (hints, speedup_from_hints(hints))
            infos[name] = job_info(job_spec(job), self._template,
                                   created=job.submission_time, hints=hints,
                                   restarts=job.num_restarts or 0,
                                   restart_cost_s=job.restart_s,
                                   current_replicas=len(allocations.get(name, ())),
                                   speedup_fn=cached[1], remaining_s=remaining_seconds(job))
        return self.rule.decide(infos, current_nodes, now=now)


@dataclass
class SimNode:
    """One node of an :class:`ElasticCluster` (times in simulated seconds).

    Attributes:
        id: never reused.
        requested_at: when it was asked for (or 0 for the starting nodes).
        ready_at: when it is usable.
        notice_at: when its preemption notice comes (``inf``: never).
        lost_at: when the preemption takes it (``inf``: never).
        removed_at: when it left the cluster (``None``: still in it).
        why: ``"scale-down"``, ``"preempted"`` or ``""``.
    """

    id: int
    requested_at: float
    ready_at: float
    notice_at: float = math.inf
    lost_at: float = math.inf
    removed_at: Optional[float] = None
    why: str = ""

    def alive(self) -> bool:
        """Still in the cluster (asked for and not removed)."""
        return self.removed_at is None

    def usable(self, now: float) -> bool:
        """Ready, in the cluster and without a preemption notice at ``now``."""
        return self.alive() and self.ready_at <= now and self.notice_at > now


class ElasticCluster:
    """A cluster whose nodes change over simulated time (see the module doc); the
    ``cluster`` argument of :func:`~adaptdl_core.sim.rounds.run_rounds`.

    Args:
        settings: the :class:`ElasticSettings`, resolved (:meth:`ElasticSettings.resolved`).
        nodes: nodes at the start without ``autoscale`` (with it: ``min_nodes``).
        gpus_per_node: GPUs of every node.
        interval: seconds per scheduling round (autoscaling decisions come every
            ``autoscale_every`` of them).
        seed: seeds the preemption times.

    Attributes:
        nodes: every node ever asked for, in order (:class:`SimNode`).
        decisions: ``(time, current, desired, reason)`` of every autoscaling decision that
            changed the size.
        progress_lost_s: seconds to redo after preemptions without enough notice: for
            each job rolled back, the time from its checkpoint to the rollback, summed.
        rollbacks: jobs rolled back to a checkpoint by such losses.

    Raises:
        ValueError: malformed ``nodes``, ``gpus_per_node`` or ``interval`` (named).
    """

    def __init__(self, settings: ElasticSettings, nodes: int, gpus_per_node: int, *,
                 interval: float, seed: int = 0) -> None:
        self.settings = s = settings.resolved(validation.integer("nodes", nodes, 1))
        self.gpus_per_node = validation.integer("gpus_per_node", gpus_per_node, 1)
        self.interval = validation.number("interval", interval, 0.0, low_open=True,
                                          what="a finite number of seconds")
        self._rng = np.random.default_rng(seed)
        self.nodes: List[SimNode] = []
        self.decisions: List[Tuple[float, int, int, str]] = []
        self.progress_lost_s = 0.0
        self.rollbacks = 0
        self.autoscaler: Optional[Autoscaler] = None
        if s.autoscale:
            rule = ClusterSizeRule({"GPU": self.gpus_per_node}, s.min_nodes, s.max_nodes,
                                   upper=s.upper, lower=s.lower,
                                   policy=PolluxPolicy(p=-1.0, fair_share=True))
            self.autoscaler = Autoscaler(rule, s.rule)
        self._next_autoscale = 0.0
        # Per job: (progress, epoch, time) at its last checkpoint and at the last step.
        self._checkpoint: Dict[str, Tuple[float, int, float]] = {}
        self._last: Dict[str, Tuple[float, int, float]] = {}
        self._seen: Dict[str, Tuple[int, ...]] = {}
        self._timeline: List[Tuple[float, int, int]] = []
        self._prev_now = -math.inf
        self._initial = s.min_nodes if s.autoscale else nodes
        for _ in range(self._initial):
            self._add(0.0, ready_now=True)

    # -- nodes ------------------------------------------------------------------------
    def _add(self, now: float, ready_now: bool = False) -> SimNode:
        ready = now if ready_now else now + self.settings.node_startup_s
        node = SimNode(len(self.nodes), now, ready)
        rate = self.settings.preemptions_per_node_hour
        if rate > 0:
            node.notice_at = ready + float(self._rng.exponential(3600.0 / rate))
            node.lost_at = node.notice_at + self.settings.preemption_notice_s
        self.nodes.append(node)
        return node

    def _remove(self, node: SimNode, at: float, why: str) -> None:
        node.removed_at, node.why = at, why

    def usable_nodes(self, now: float) -> Dict[int, int]:
        """Node id -> GPUs of the nodes usable at ``now``."""
        return {n.id: self.gpus_per_node for n in self.nodes if n.usable(now)}

    def size(self, now: float) -> int:
        """Nodes in the cluster at ``now`` that count for the autoscaler: ready or
        starting, without a preemption notice."""
        return sum(1 for n in self.nodes if n.alive() and n.notice_at > now)

    # -- the hook of run_rounds ---------------------------------------------------------
    def update(self, now: float, jobs: Mapping[str, SimJob],
               allocations: Mapping[str, Sequence[int]]) -> Dict[int, int]:
        """Apply what happened by ``now`` (checkpoints, losses, notices, autoscaling; see
        the module doc) and return the usable nodes (id -> GPUs).

        Args:
            now: the step's time (seconds).
            jobs: the active jobs (a job still on a node lost before ``now`` is rolled
                back to its last checkpoint).
            allocations: their allocations in force during the last step (node ids).
        """
        now = float(now)
        self._checkpoints(now, jobs, allocations)
        noticed = False
        for node in self.nodes:
            if not node.alive():
                continue
            if node.lost_at <= now:
                self._remove(node, node.lost_at, "preempted")
                if node.lost_at < now:
                    self._roll_back(node.id, jobs, allocations)
                if self.autoscaler is None:
                    self._add(node.lost_at)   # the spot replacement
            elif self._prev_now < node.notice_at <= now:
                noticed = True
        if self.autoscaler is not None and (now >= self._next_autoscale or noticed):
            self._autoscale(now, jobs, allocations)
        usable = self.usable_nodes(now)
        held = sum(1 for n in self.nodes if n.alive())
        if not self._timeline or self._timeline[-1][1:] != (held, len(usable)):
            self._timeline.append((now, held, len(usable)))
        self._prev_now = now
        return usable

    def _checkpoints(self, now: float, jobs: Mapping[str, SimJob],
                     allocations: Mapping[str, Sequence[int]]) -> None:
        for name in [k for k in self._checkpoint if k not in jobs]:
            for book in (self._checkpoint, self._last, self._seen):
                book.pop(name, None)
        for name, job in jobs.items():
            state = (job.progress, job.epoch, now)
            placed = tuple(allocations.get(name, ()))
            if name not in self._checkpoint:
                self._checkpoint[name] = state
            elif placed != self._seen.get(name):
                # (Re)started or stopped at the last step's start: it checkpointed then.
                self._checkpoint[name] = self._last.get(name, state)
            elif placed and now - self._checkpoint[name][2] >= self.settings.checkpoint_s:
                self._checkpoint[name] = state
            self._seen[name] = placed
            self._last[name] = state

    def _roll_back(self, node_id: int, jobs: Mapping[str, SimJob],
                   allocations: Mapping[str, Sequence[int]]) -> None:
        for name, alloc in allocations.items():
            if node_id not in alloc or name not in jobs:
                continue
            job = jobs[name]
            progress, epoch, at = self._checkpoint[name]
            if job.progress > progress:
                self.progress_lost_s += job.now - at
                self.rollbacks += 1
            job.progress, job.epoch = progress, epoch
            # Its progress is back at the checkpoint's, and so is what it has to redo.
            self._last[name] = (progress, epoch, self._last[name][2])

    def _autoscale(self, now: float, jobs: Mapping[str, SimJob],
                   allocations: Mapping[str, Sequence[int]]) -> None:
        s = self.settings
        self._next_autoscale = now + s.autoscale_every * self.interval - 1e-9
        current = self.size(now)
        decision = self.autoscaler.decide(now, jobs, allocations, current)
        desired = decision.desired_nodes
        if desired != current:
            self.decisions.append((now, current, desired, decision.reason))
        for _ in range(desired - current):
            self._add(now)
        if desired < current:
            held: Dict[int, int] = {}
            for alloc in allocations.values():
                for n in alloc:
                    held[n] = held.get(n, 0) + 1
            candidates = [n for n in self.nodes if n.alive() and n.notice_at > now]
            # Starting nodes first, then the least used; newest first among equals.
            candidates.sort(key=lambda n: (n.ready_at <= now, held.get(n.id, 0), -n.id))
            for node in candidates[:current - desired]:
                self._remove(node, now, "scale-down")

    # -- the books ----------------------------------------------------------------------
    def summary(self, end: float) -> Dict[str, Any]:
        """The cluster's books up to ``end`` (seconds; the last job's end), JSON-ready:
        ``node_hours`` (each node from its request to its removal, or ``end``), ``cost``
        (``node_hours * node_hour_cost``), ``preemptions`` (notices by ``end``),
        ``nodes_added`` (asked for after the start), ``nodes_scaled_down``,
        ``peak_nodes`` / ``mean_nodes`` (nodes held, the mean over ``[0, end]``),
        ``progress_lost_s``, ``rollbacks``, ``autoscale_decisions`` (size changes),
        ``node_timeline`` (``[time, nodes held, nodes usable]`` at each change) and the
        settings.
        """
        end = float(end)
        seconds = 0.0
        for n in self.nodes:
            stop = min(n.removed_at if n.removed_at is not None else math.inf, n.lost_at, end)
            seconds += max(stop - n.requested_at, 0.0)
        start_count = self._initial
        node_hours = seconds / 3600.0
        return {
            "node_hours": node_hours,
            "cost": node_hours * self.settings.node_hour_cost,
            "preemptions": sum(1 for n in self.nodes if n.notice_at <= end and (
                n.removed_at is None or n.notice_at <= n.removed_at)),
            "nodes_added": len(self.nodes) - start_count,
            "nodes_scaled_down": sum(1 for n in self.nodes if n.why == "scale-down"),
            "peak_nodes": max((t[1] for t in self._timeline), default=start_count),
            "mean_nodes": seconds / end if end > 0 else float(start_count),
            "progress_lost_s": self.progress_lost_s,
            "rollbacks": self.rollbacks,
            "autoscale_decisions": [list(d) for d in self.decisions],
            "node_timeline": [list(t) for t in self._timeline],
            "settings": asdict(self.settings),
        }
