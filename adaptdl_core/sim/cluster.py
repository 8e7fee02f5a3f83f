"""Simulate a workload of training jobs on a GPU cluster under one scheduling policy.

:func:`simulate` is the whole simulation; ``python -m adaptdl_core.sim cluster`` wraps it.

The clock advances in rounds of ``interval`` seconds (the Pollux paper's setting: 60 s, 16
nodes x 4 GPUs, 30 s per start or change of allocation), in the round loop of
:mod:`adaptdl_core.sim.rounds` that the sweep mode shares (jobs admitted as they are
submitted, a decision at every round from the first ``interval`` on). In each round every
job first trains on its current allocation for the round (see :meth:`SimJob.advance`), then the
policy sees the jobs submitted by the end of the round and not finished, and decides the
next allocations; a job whose allocation changed is restarted on its new one. A job
arriving mid-round therefore waits for the next round boundary, as in the paper's
simulator.

Policies (see :func:`make_policy`; :func:`simulate` also takes a policy object):

* ``pollux``: this library's :class:`~adaptdl_core.policy.PolluxPolicy` (p = -1) behind
  :mod:`adaptdl_core.sim.pollux`, fed the scheduler hints each job's own agent produces;
  every job adapts its batch (ncf keeps a fixed batch on one GPU, as in the paper).
* ``adaptdl``: :class:`~adaptdl_core.policy.RemainingWorkPolicy` (Pollux weighted by each
  job's estimated remaining work) through the same decision core, same jobs.
* ``tiresias`` / ``optimus``: the TunedJobs baselines of :mod:`adaptdl_core.sim.baselines`.

``pollux`` and ``adaptdl`` learn of a job's remaining work only what a front-end knows: the
core's estimate from its finished epochs and training time
(:func:`.pollux.remaining_seconds`). ``tiresias`` reads none (only the GPU time a job has
attained). ``optimus`` is the paper's Optimus+Oracle: it reads the exact remaining
optimizer steps and the traced step times (:meth:`SimJob.remaining_iterations`), which no
front-end knows.

With ``elastic`` settings (:class:`~adaptdl_core.sim.autoscale.ElasticSettings`) the node
set changes over time: autoscaling by the goodput or throughput rule, node start-up delays,
a cost per node-hour and spot preemptions (:mod:`adaptdl_core.sim.autoscale`); the result
then also holds the node-hours, cost and preemptions.
"""

from __future__ import annotations

import contextlib
import csv
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import List, Mapping, Optional, Sequence, Union

import numpy as np

from adaptdl_core import validation

from .autoscale import ElasticCluster, ElasticSettings
from .gpu_types import RESTART_DELAY_S, ClusterSpec, cluster_spec
from .job_model import DATA_DIR, SimJob, get_application
from .rounds import ArrivalAdmission, Observer, Schedule, run_rounds

__all__ = ["WorkloadJob", "POLICIES", "WORKLOADS_DIR", "PUBLISHED_DIR", "load_workload",
           "resolve_workload", "published", "make_policy", "simulate", "synthetic_workload",
           "MIN_INTERVAL_S"]

logger = logging.getLogger(__name__)

POLICIES = ("pollux", "adaptdl", "tiresias", "optimus", "sia")
WORKLOADS_DIR = DATA_DIR / "workloads"
PUBLISHED_DIR = DATA_DIR / "published"
#: Shortest scheduling round (seconds) :func:`simulate` accepts: the round count is the
#: workload's makespan over the interval, and below a second rounds model nothing real.
MIN_INTERVAL_S = 1.0
#: ncf does not scale out: the paper runs it on one GPU at a fixed batch under Pollux.
POLLUX_FIXED_BATCH = {"ncf": 32768}


@dataclass(frozen=True)
class WorkloadJob:
    """One row of a workload: ``name``, submission ``time`` (s), ``application`` and its
    TunedJobs ``num_replicas`` / ``batch_size``."""

    name: str
    time: float
    application: str
    num_replicas: int
    batch_size: int

    def __post_init__(self) -> None:
        """Raises ValueError for an empty name, a time that is not a finite number of
        seconds ``>= 0``, or a count that is not an integer ``>= 1``: a job of 0 replicas
        would never finish, and the simulation would never end."""
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"name must be a non-empty string, got {self.name!r}")
        validation.number("time", self.time, 0.0, what="a finite number of seconds")
        validation.integer("num_replicas", self.num_replicas, 1)
        validation.integer("batch_size", self.batch_size, 1)


def resolve_workload(spec: Union[str, Path]) -> Path:
    """Path of a workload CSV: an existing file, or a vendored name such as
    ``load-1.0/workload-3``.

    Raises:
        FileNotFoundError: neither exists (the message lists the vendored names).
    """
    p = Path(spec)
    if p.is_file():
        return p
    name = str(spec)
    if not name.endswith(".csv"):
        name += ".csv"
    q = WORKLOADS_DIR / name
    if q.is_file():
        return q
    raise FileNotFoundError(
        f"workload {spec!r}: no such file, and no vendored workload of that name; use a CSV "
        f"path or one of load-0.5/workload-1..8, load-1.0/workload-1..8 (the Pollux "
        f"paper's), philly/workload-1..8, helios/workload-1..10 (the Sia paper's)")


def load_workload(spec: Union[str, Path]) -> List[WorkloadJob]:
    """Read a workload CSV (columns ``name, time, application, num_replicas, batch_size``),
    given as a path or vendored name (see :func:`resolve_workload`), in file order.

    Raises:
        FileNotFoundError: see :func:`resolve_workload`.
        ValueError: a missing column or a malformed value (names the row), or a file that
            is not a UTF-8 CSV (names the file).
    """
    path = resolve_workload(spec)
    out = []
    with open(path, newline="", encoding="utf-8") as f:
        try:
            rows = list(csv.DictReader(f))
        except (UnicodeDecodeError, csv.Error) as e:
            raise ValueError(f"workload {str(path)!r} is not a UTF-8 CSV file ({e}); give a "
                             "CSV with columns name, time, application, num_replicas, "
                             "batch_size") from None
    for i, row in enumerate(rows):
        try:
            out.append(WorkloadJob(row["name"], float(row["time"]), row["application"],
                                   int(row["num_replicas"]), int(row["batch_size"])))
        except (KeyError, ValueError, TypeError) as e:
            raise ValueError(f"{path}: row {i + 1} malformed ({e}); columns must be name, "
                             "time, application, num_replicas, batch_size") from None
    if not out:
        raise ValueError(f"{path}: no jobs")
    return out


def published(policy: str, load: str) -> dict:
    """The paper's results for ``policy`` at ``load`` (``"0.5"`` or ``"1.0"``): a dict with
    ``jcts[workload][job]``, ``avgs[workload]`` and ``mean`` (seconds).

    Raises:
        FileNotFoundError: no such published file.
    """
    path = PUBLISHED_DIR / f"{policy}-{load}.json"
    if not path.is_file():
        raise FileNotFoundError(f"no published results {path.name}: policies {POLICIES}, "
                                "loads 0.5 and 1.0")
    return json.loads(path.read_text())


def synthetic_workload(num_jobs: int, num_nodes: int, *, seed: int = 0,
                       base: Union[str, Path] = "load-1.0/workload-1",
                       base_nodes: int = 16) -> List[WorkloadJob]:
    """A larger workload with the same application mix and arrival pattern as ``base``:
    jobs are drawn (seeded, with replacement) from ``base``, and arrivals are ``base``'s
    submission times with the job rate scaled by ``num_nodes / base_nodes`` and the number
    of jobs by ``num_jobs / len(base)``: the arrival curve keeps its shape and the load per
    GPU stays the same when ``num_jobs / num_nodes`` does.

    Raises:
        ValueError: ``num_jobs`` or ``num_nodes`` < 1.
    """
    validation.integer("num_jobs", num_jobs, 1)
    validation.integer("num_nodes", num_nodes, 1)
    rows = load_workload(base)
    rng = np.random.default_rng(seed)
    times = np.sort(np.array([r.time for r in rows]))
    # Arrival quantiles of the base, stretched so that the same jobs-per-node rate holds.
    stretch = (num_jobs / len(rows)) / (num_nodes / base_nodes)
    q = np.sort(rng.uniform(0, 1, num_jobs))
    arrivals = np.interp(q, np.linspace(0, 1, len(times)), times) * stretch
    picks = rng.integers(0, len(rows), num_jobs)
    out = []
    for i, (t, k) in enumerate(zip(arrivals, picks)):
        r = rows[int(k)]
        out.append(WorkloadJob(f"{r.application}-{i}", float(round(t)), r.application,
                               r.num_replicas, r.batch_size))
    return out


def make_policy(name: str, *, gpus_per_node: int = 4, p: float = -1.0,
                use_core: Optional[bool] = None, interval: float = 60.0,
                options: Optional[Mapping[str, float]] = None,
                cluster: Optional[ClusterSpec] = None):
    """The policy object for ``name`` (one of :data:`POLICIES`); ``options`` go to
    :class:`~adaptdl_core.policy.RemainingWorkPolicy` (``adaptdl`` only). On a typed
    ``cluster``: ``pollux`` type-unaware as the Sia paper ran it
    (:class:`~adaptdl_core.sim.typed.TypeUnawarePollux`), ``adaptdl`` type-aware through
    the decision core (nodes carry their type, jobs of one model share their profiles),
    ``sia`` the Sia baseline (:class:`~adaptdl_core.sim.sia.SiaPolicy`).

    Raises:
        ValueError: an unknown name, options for another policy or malformed ones, or a
            policy that does not run on the cluster given.
    """
    if options and name != "adaptdl":
        raise ValueError(f"policy options {dict(options)} apply to policy 'adaptdl' only, "
                         f"not {name!r}: drop them")
    if cluster is not None and name in ("tiresias", "optimus"):
        raise ValueError(f"policy {name!r} runs on the default one-type cluster only (its "
                         "TunedJobs configurations are for T4 nodes); drop --cluster, or use "
                         "pollux, sia or adaptdl")
    if name == "sia":
        if cluster is None:
            raise ValueError("policy 'sia' needs a typed cluster: pass --cluster "
                             "sia-heterogeneous, sia-homogeneous or a cluster file")
        if use_core is not None:
            raise ValueError("use_core (--no-core) applies to policy 'pollux' only")
        from .sia import SiaPolicy
        return SiaPolicy(cluster, interval=interval)
    if name == "adaptdl":
        from ..policy import RemainingWorkPolicy
        from .pollux import CorePollux
        if use_core is False:
            raise ValueError("use_core=False (--no-core) applies to policy 'pollux' only")
        try:
            opts = dict(options or {})
            policy = RemainingWorkPolicy(opts.pop("p", p), **opts)
        except TypeError as e:
            raise ValueError(f"policy options {dict(options or {})}: {e}; see "
                             "RemainingWorkPolicy for the options") from None
        if cluster is not None:
            return CorePollux(interval=interval, policy=policy,
                              node_types=cluster.node_types(), profile_groups=True,
                              report_restarting=True)
        return CorePollux(interval=interval, policy=policy)
    if name == "tiresias":
        from .baselines import TiresiasPolicy
        return TiresiasPolicy()
    if name == "optimus":
        from .baselines import OptimusPolicy
        return OptimusPolicy(gpus_per_node=gpus_per_node)
    if name == "pollux":
        from .pollux import MAX_REPLICAS, make_pollux
        if cluster is not None:
            from .typed import TypeUnawarePollux
            # As the Sia paper ran it: no job larger than the smallest type's GPUs.
            cap = min(MAX_REPLICAS, *cluster.gpus_by_type().values())
            return TypeUnawarePollux(make_pollux(p=p, use_core=use_core, interval=interval,
                                                 max_replicas=cap), cluster)
        return make_pollux(p=p, use_core=use_core, interval=interval)
    raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {name!r}")


def _make_jobs(rows: Sequence[WorkloadJob], tuned: Sequence[str], restart_s: float,
               traces: Optional[Union[str, Path]]) -> List[SimJob]:
    """The jobs of ``rows``: with the workload's TunedJobs ``batch_size`` (and
    ``num_replicas``) where the policy's ``tuned`` names them, else adaptive (ncf at its
    fixed batch, as in the paper)."""
    jobs = []
    for r in rows:
        app = get_application(r.application, traces)
        if "batch_size" in tuned:
            batch = r.batch_size
        else:
            batch = POLLUX_FIXED_BATCH.get(r.application)
        replicas = r.num_replicas if "num_replicas" in tuned else None
        jobs.append(SimJob(r.name, app, r.time, target_batch_size=batch,
                           target_num_replicas=replicas, restart_s=restart_s))
    return jobs


def simulate(workload: Union[str, Path, Sequence[WorkloadJob]], policy="pollux", *,
             traces: Optional[Union[str, Path]] = None, interval: float = 60.0,
             restart_s: Optional[float] = None, nodes: int = 16, gpus_per_node: int = 4,
             seed: int = 0, interference: float = 0.0, max_time: Optional[float] = None,
             use_core: Optional[bool] = None, timeline: bool = False,
             policy_options: Optional[Mapping[str, float]] = None,
             elastic: Optional[ElasticSettings] = None,
             cluster: Optional[Union[str, Path, ClusterSpec]] = None,
             calibrate: bool = True) -> dict:
    """Run ``workload`` (a CSV path, a vendored name like ``load-1.0/workload-3``, or rows)
    under ``policy`` until every job finishes, in the round loop of
    :mod:`adaptdl_core.sim.rounds` (jobs admitted as they are submitted, a decision at
    every round).

    Args:
        policy: one of :data:`POLICIES` (built by :func:`make_policy`), or a policy object:
            ``decide(now, jobs, allocations, nodes)`` (see :mod:`adaptdl_core.sim.rounds`),
            ``name`` (reported), and optionally ``tuned``: the workload columns its jobs
            keep fixed (``("batch_size", "num_replicas")`` for Tiresias, ``("batch_size",)``
            for Optimus; absent: adaptive jobs).
        traces: traces folder (default: the vendored traces).
        interval: seconds per scheduling round (finite, ``>=`` :data:`MIN_INTERVAL_S`).
        restart_s: seconds without progress after every start or change of allocation
            (``None``: 30 s, the Pollux paper's; on a typed ``cluster`` each model's own
            delay, :data:`~adaptdl_core.sim.gpu_types.RESTART_DELAY_S`).
        nodes, gpus_per_node: the cluster (one kind of GPU, the Pollux traces' T4), unless
            ``cluster`` is given.
        cluster: a cluster of typed nodes (:func:`~adaptdl_core.sim.gpu_types.cluster_spec`:
            ``"sia-heterogeneous"``, ``"sia-homogeneous"`` or a JSON/TOML file); jobs then
            run on the Sia artifact's traces of each type (:mod:`adaptdl_core.sim.typed`).
            Policies ``pollux``, ``adaptdl`` and ``sia``; no ``elastic``.
        calibrate: on a typed ``cluster``, slow training by each model's calibration
            factor (the Sia simulator's, ``data/README.md``).
        seed: seeds numpy's global generator (the policies here are deterministic; kept so
            that a randomised policy is reproducible).
        interference: slowdown fraction of a multi-node job sharing a node with another
            multi-node job, in ``[0, 1)`` (0: none, the paper's default).
        max_time: stop after this many simulated seconds, ``> 0`` (``None``: run to
            completion; unfinished jobs are then missing from ``jcts``).
        use_core: ``"pollux"`` only: go through :mod:`adaptdl_core.decision` (``None``: when
            available).
        timeline: include ``timeline``: per round, GPUs held per job (``gpus``) and, on a
            typed ``cluster``, the type each running job is on (``types``).
        policy_options: ``"adaptdl"`` only: keyword arguments of
            :class:`~adaptdl_core.policy.RemainingWorkPolicy` (e.g. ``{"alpha": 1.0}``).
        elastic: ``None`` (a fixed cluster of ``nodes``), or how the cluster changes over
            time (:class:`~adaptdl_core.sim.autoscale.ElasticSettings`; with ``autoscale``
            it starts at ``min_nodes`` and ``max_nodes`` defaults to ``nodes``; autoscaling
            needs an adaptive policy: ``pollux``, ``adaptdl`` or a policy object).

    Returns:
        A JSON-serialisable dict: ``policy``, ``workload``, ``avg_jct``, ``p99_jct``,
        ``makespan`` (first submission to last completion), ``jcts`` (job -> s),
        ``gpu_hours`` (GPU time held, restarts included), ``decision_s``
        (``{"median", "p99", "max"}`` seconds per round), ``completed``, ``num_jobs``,
        ``restarts``, ``num_fits``, ``wall_s``, the settings, and optionally ``timeline``.
        On a typed ``cluster``: ``cluster`` (its name), ``gpu_hours_by_type`` (type ->
        GPU-hours held) and ``jobs_by_type`` (type -> jobs that ended on it).
        With ``elastic``: ``node_hours``, ``cost``, ``preemptions`` and ``elastic`` (the
        cluster's books, :meth:`~adaptdl_core.sim.autoscale.ElasticCluster.summary`).

    Raises:
        ValueError / FileNotFoundError: bad arguments (named).
    """
    if isinstance(policy, str):
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    elif not callable(getattr(policy, "decide", None)):
        raise ValueError(f"policy must be one of {', '.join(POLICIES)} or an object with a "
                         f"decide(now, jobs, allocations, nodes) method, got {policy!r}")
    elif use_core is not None or policy_options:
        raise ValueError("use_core and policy_options build a named policy; with a policy "
                         "object, configure the object instead")
    interval, restart_s, interference, max_time = _check_settings(
        interval=interval, restart_s=restart_s, nodes=nodes, gpus_per_node=gpus_per_node,
        interference=interference, max_time=max_time)
    spec = None
    if cluster is not None:
        spec = cluster_spec(cluster)
        if elastic is not None:
            raise ValueError("elastic settings need the default one-type cluster: drop "
                             "cluster or elastic")
    elif policy == "sia":
        raise ValueError("policy 'sia' needs a typed cluster: pass cluster='sia-homogeneous' "
                         "(--cluster), 'sia-heterogeneous' or a cluster file")
    if elastic is not None:
        if not isinstance(elastic, ElasticSettings):
            raise ValueError(f"elastic must be None or an ElasticSettings, got {elastic!r}")
        elastic = elastic.resolved(nodes)
        if elastic.autoscale and policy in ("tiresias", "optimus"):
            raise ValueError(f"autoscaling with policy {policy!r}: the cluster-size rule "
                             "measures the jobs' goodput models, which the TunedJobs "
                             "baselines' jobs do not fit; use pollux or adaptdl")
    with _one_blas_thread():
        return _simulate(workload, policy, traces=traces, interval=interval,
                         restart_s=restart_s, nodes=nodes, gpus_per_node=gpus_per_node,
                         seed=seed, interference=interference, max_time=max_time,
                         use_core=use_core, timeline=timeline,
                         policy_options=policy_options, elastic=elastic, spec=spec,
                         calibrate=calibrate)


def _check_settings(*, interval: float, restart_s: float, nodes: int, gpus_per_node: int,
                   interference: float, max_time: Optional[float]
                   ) -> tuple[float, float, float, Optional[float]]:
    """The arguments of :func:`simulate` that are numbers, checked; returns ``interval``,
    ``restart_s``, ``interference`` and ``max_time`` as floats.

    Raises:
        ValueError: naming the argument, its value and the range it needs: ``interval`` a
            finite number of seconds ``>=`` :data:`MIN_INTERVAL_S`, ``restart_s`` ``>= 0``,
            ``nodes`` and ``gpus_per_node`` integers ``>= 1``, ``interference`` in
            ``[0, 1)``, ``max_time`` ``None`` or ``> 0``.
    """
    try:
        interval = validation.number("interval", interval, MIN_INTERVAL_S,
                                     what="a finite number of seconds")
    except ValueError as e:
        raise ValueError(f"{e}: shorter rounds model no real scheduler and multiply the "
                         "rounds to simulate (the paper's setting is 60 s)") from None
    if restart_s is not None:
        restart_s = validation.number("restart_s", restart_s, 0.0,
                                      what="None or a finite number of seconds")
    validation.integer("nodes", nodes, 1)
    validation.integer("gpus_per_node", gpus_per_node, 1)
    # 1 would stop a multi-node job sharing a node for good, and the run would not end.
    interference = validation.number("interference", interference, 0.0, 1.0, high_open=True,
                                     what="a slowdown fraction")
    if max_time is not None:
        max_time = validation.number("max_time", max_time, 0.0, low_open=True,
                                     what="None or a finite number of seconds")
    return interval, restart_s, interference, max_time


def _one_blas_thread():
    """One BLAS thread while simulating: the only BLAS work is the agents' 7-parameter fits,
    where OpenBLAS threads only add hand-offs, and on a busy machine their spinning made
    each fit several times slower. A no-op without ``threadpoolctl``."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return contextlib.nullcontext()
    return threadpool_limits(limits=1, user_api="blas")


class _ClusterRecorder(Observer):
    """Per round, GPUs held per job and (``node_types``: node id -> type) each job's type
    (``timeline``), and progress in the log."""

    def __init__(self, timeline: bool, num_jobs: int,
                 node_types: Optional[Mapping[int, str]] = None) -> None:
        self.timeline: Optional[List[dict]] = [] if timeline else None
        self.node_types = node_types
        self.num_jobs = num_jobs
        self.done = 0
        self.rounds = 0
        self.t_wall = time.perf_counter()

    def allocated(self, now, jobs, allocations, decided) -> None:
        """Records the round's allocations (rounds where the policy decided)."""
        if not decided:
            return
        self.rounds += 1
        if self.timeline is not None:
            entry = {"t": now, "gpus": {k: len(v) for k, v in allocations.items()}}
            if self.node_types is not None:
                entry["types"] = {k: self.node_types[v[0]] for k, v in allocations.items()
                                  if v}
            self.timeline.append(entry)
        if self.rounds % 100 == 0:
            logger.info("t=%.0f s: %d active, %d/%d done, wall %.0f s", now, len(jobs),
                        self.done, self.num_jobs, time.perf_counter() - self.t_wall)

    def ended(self, job, status, at) -> None:
        """Counts finished jobs."""
        self.done += 1


def _simulate(workload, policy, *, traces, interval, restart_s, nodes, gpus_per_node, seed,
              interference, max_time, use_core, timeline, policy_options,
              elastic=None, spec: Optional[ClusterSpec] = None, calibrate: bool = True) -> dict:
    t_wall = time.perf_counter()
    np.random.seed(seed)
    if isinstance(workload, (str, Path)):
        wname = str(workload)
        rows = load_workload(workload)
    else:
        rows = list(workload)
        wname = f"<{len(rows)} jobs>"
    if isinstance(policy, str):
        pname = policy
        pol = make_policy(policy, gpus_per_node=gpus_per_node, use_core=use_core,
                          interval=interval, options=policy_options, cluster=spec)
    else:
        pol, pname = policy, getattr(policy, "name", type(policy).__name__)
    tuned = tuple(getattr(pol, "tuned", ()))
    node_types = None
    if spec is not None:
        from .typed import make_typed_jobs
        if tuned:
            raise ValueError(f"policy {pname!r} keeps TunedJobs configurations, which are "
                             "for the default one-type cluster; drop the cluster")
        jobs = make_typed_jobs(rows, spec, type_aware=getattr(pol, "type_aware", True),
                               restart_s=restart_s, calibrate=calibrate,
                               fixed_batch=POLLUX_FIXED_BATCH, traces=traces)
        nodes, gpus_per_node = len(spec.node_gpus()), None
        node_types = spec.node_types()
    else:
        jobs = _make_jobs(rows, tuned, 30.0 if restart_s is None else restart_s, traces)
    most_nodes = elastic.max_nodes if elastic is not None and elastic.autoscale else nodes
    too_big = [r.name for r in rows
               if "num_replicas" in tuned and r.num_replicas > most_nodes * gpus_per_node]
    if too_big:
        raise ValueError(f"workload: jobs {too_big[:5]} ask for more GPUs than the cluster's "
                         f"{most_nodes * gpus_per_node} (num_replicas); raise "
                         "nodes/gpus_per_node")
    if len({j.name for j in jobs}) != len(jobs):
        raise ValueError("workload: job names must be unique")
    node_gpus = (spec.node_gpus() if spec is not None
                 else {n: int(gpus_per_node) for n in range(int(nodes))})
    cluster = None
    if elastic is not None:
        cluster = ElasticCluster(elastic, nodes, gpus_per_node, interval=interval, seed=seed)
        node_gpus = cluster.usable_nodes(0.0)
    recorder = _ClusterRecorder(timeline, len(jobs), node_types)
    outcome = run_rounds(pol, ArrivalAdmission(jobs), nodes=node_gpus,
                         schedule=Schedule(tick=interval, interval=interval,
                                           first_round=interval),
                         observer=recorder, max_time=max_time, interference=interference,
                         cluster=cluster, node_types=node_types)
    decision_times = outcome.decision_times
    now = outcome.now
    jcts = {j.name: j.completion_time - j.submission_time for j in jobs if j.done}
    vals = np.array(list(jcts.values())) if jcts else np.array([0.0])
    first = min(j.submission_time for j in jobs)
    last = max((j.completion_time for j in jobs if j.done), default=now)
    out = {
        "policy": pname,
        "workload": wname,
        "avg_jct": float(vals.mean()),
        "p99_jct": float(np.percentile(vals, 99)),
        "makespan": float(last - first),
        "jcts": jcts,
        "gpu_hours": float(sum(j.attained_service for j in jobs) / 3600.0),
        "decision_s": {"median": float(np.median(decision_times)) if decision_times else 0.0,
                       "p99": float(np.percentile(decision_times, 99)) if decision_times
                       else 0.0,
                       "max": float(max(decision_times, default=0.0))},
        "completed": len(jcts),
        "num_jobs": len(jobs),
        "restarts": int(sum(j.num_restarts or 0 for j in jobs)),
        "num_fits": int(sum(j.num_fits for j in jobs)),
        "settings": {"interval": interval, "restart_s": restart_s if restart_s is not None
                     else (dict(RESTART_DELAY_S) if spec is not None else 30.0),
                     "nodes": nodes,
                     "gpus_per_node": gpus_per_node, "seed": seed,
                     "interference": interference,
                     "pollux_path": getattr(pol, "path", None),
                     "policy_options": dict(policy_options or {})},
        "wall_s": time.perf_counter() - t_wall,
    }
    if spec is not None:
        out["cluster"] = spec.name
        out["settings"]["cluster"] = spec.describe()
        out["settings"]["calibrate"] = bool(calibrate)
        by_type: dict = {}
        for j in jobs:
            for t, gs in j.gpu_seconds_by_type.items():
                by_type[t] = by_type.get(t, 0.0) + gs / 3600.0
        out["gpu_hours_by_type"] = by_type
        out["jobs_by_type"] = {t: sum(1 for j in jobs if j.done and j.gpu_type == t)
                               for t in spec.types}
    if timeline:
        out["timeline"] = recorder.timeline
    if cluster is not None:
        books = cluster.summary(last if len(jcts) == len(jobs) else now)
        out.update(node_hours=books["node_hours"], cost=books["cost"],
                   preemptions=books["preemptions"], elastic=books)
    logger.info("%s on %s: avg JCT %.0f s, makespan %.0f s, %d/%d done in %.1f s", pname,
                wname, out["avg_jct"], out["makespan"], len(jcts), len(jobs), out["wall_s"])
    return out
