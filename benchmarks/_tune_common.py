"""Helpers shared by the Ray Tune benchmarks (sweep.py, resize_cost.py).

The training function (the digits CNN of ``examples/``), a local Ray instance on the
machine's real CPUs, a Tune callback that records what every trial held and reported over
time, and CPU accounting for a whole process tree. Library-like: logs, never prints.
"""

from __future__ import annotations

import ctypes
import logging
import os
import resource
import sys
import time
from typing import Any

from _common import ROOT  # noqa: F401  (puts the repository on sys.path)
from _processes import proc_stat
from adaptdl_ray.tune.results import RESIZE_PHASES  # noqa: E402  (after the path is set)

LOG = logging.getLogger(__name__)

EXAMPLES = os.path.join(str(ROOT), "examples")
if EXAMPLES not in sys.path:
    sys.path.insert(0, EXAMPLES)

METRIC = "mean_accuracy"


# ---------------------------------------------------------------------------------------
# The training function (run by every replica of every trial)
# ---------------------------------------------------------------------------------------
def train_digits(config: dict) -> None:
    """The digits trial function (``examples/digits_data.py``) with the
    searched values taken from a nested ``hp`` dict (how the arms' grids pass them)."""
    from digits_data import train_digits as example_train_digits
    example_train_digits(dict(config, **config.get("hp", {})))


# ---------------------------------------------------------------------------------------
# Ray
# ---------------------------------------------------------------------------------------
def init_ray(num_cpus: int) -> None:
    """A private local Ray instance with ``num_cpus`` (real) CPUs; workers can import the
    repository and ``examples/digits_data``."""
    import ray
    pythonpath = os.pathsep.join(p for p in (str(ROOT), EXAMPLES,
                                             os.path.dirname(os.path.abspath(__file__)),
                                             os.environ.get("PYTHONPATH")) if p)
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False,
             log_to_driver=False, object_store_memory=200 * 2**20,
             logging_level=logging.WARNING,
             runtime_env={"env_vars": {"PYTHONPATH": pythonpath, "OMP_NUM_THREADS": "1",
                                       "MKL_NUM_THREADS": "1"}})


def make_recorder() -> Any:
    """A ``tune.Callback`` that records, per trial: start/end times, replicas held over
    time, every result's metric, and the resize phases of the first result after each
    resize."""
    from ray import tune

    from adaptdl_ray.tune.resources import num_replicas_of

    class Recorder(tune.Callback):
        def __init__(self) -> None:
            self.t0 = time.time()
            self.trials: dict[str, dict[str, Any]] = {}
            self.cpu = TreeCpuSampler()

        def _rec(self, trial: Any) -> dict[str, Any]:
            rec = self.trials.get(trial.trial_id)
            if rec is None:
                rec = self.trials[trial.trial_id] = {
                    "config": {k: trial.config.get("hp", trial.config).get(k)
                               for k in ("lr", "momentum", "batch_size")},
                    "start": None, "end": None, "status": None, "timeline": [],
                    "results": [], "resizes": []}
            return rec

        def on_trial_start(self, iteration, trials, trial, **info):
            rec = self._rec(trial)
            if rec["start"] is None:
                rec["start"] = time.time() - self.t0

        def on_step_end(self, iteration, trials, **info):
            self.cpu.sample()
            now = time.time() - self.t0
            for trial in trials:
                n = num_replicas_of(trial.placement_group_factory) \
                    if trial.status == "RUNNING" else 0
                rec = self._rec(trial)
                if not rec["timeline"] or rec["timeline"][-1][1] != n:
                    rec["timeline"].append([now, n])

        def on_trial_result(self, iteration, trials, trial, result, **info):
            rec = self._rec(trial)
            now = time.time() - self.t0
            rec["results"].append({
                "t": now, METRIC: result.get(METRIC), "epoch": result.get("epoch"),
                "replicas": result.get("adaptdl/replicas"),
                "batch_size": result.get("adaptdl/batch_size"),
                "restarts": result.get("adaptdl/restarts")})
            # Every result carries the phases; they are non-zero only in the first result
            # after a relaunch.
            phases = {k: result.get(f"adaptdl/resize/{k}") or 0.0 for k in RESIZE_PHASES}
            if any(phases.values()):
                # (total_s: the stop request to the first step, what the trial measured)
                rec["resizes"].append(dict(phases, t=now, total_s=result.get(
                    "adaptdl/resize_s") or 0.0, replicas=result.get("adaptdl/replicas")))

        def _ended(self, trial: Any, status: str) -> None:
            rec = self._rec(trial)
            rec["end"] = time.time() - self.t0
            rec["status"] = status
            rec["timeline"].append([rec["end"], 0])

        def on_trial_complete(self, iteration, trials, trial, **info):
            self._ended(trial, "TERMINATED")

        def on_trial_error(self, iteration, trials, trial, **info):
            self._ended(trial, "ERROR")

    return Recorder()


# ---------------------------------------------------------------------------------------
# CPU accounting of a process tree
# ---------------------------------------------------------------------------------------
_PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Make this process adopt its orphaned descendants (Linux), so that the CPU time of
    Ray's worker processes still counts in ``getrusage(RUSAGE_CHILDREN)`` when their own
    parent (the raylet) exits before them. Returns whether it worked."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):  # not Linux
        return False


def reap_children(timeout_s: float = 30.0) -> int:
    """Wait for every remaining child (adopted orphans included) to exit, up to
    ``timeout_s``; returns how many were reaped."""
    reaped = 0
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped
        if pid == 0:
            time.sleep(0.1)
        else:
            reaped += 1
    LOG.warning("children still alive after %.0f s; their CPU time is not counted", timeout_s)
    return reaped


def _proc_table() -> dict[int, tuple[int, int, float]]:
    """pid -> (ppid, start time in ticks, user + system CPU seconds incl. waited-for
    children) of every process (Linux ``/proc``; empty elsewhere)."""
    out: dict[int, tuple[int, int, float]] = {}
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return out
    for pid in pids:
        stat = proc_stat(pid)
        if stat is not None:  # (else it exited meanwhile)
            out[pid] = (stat[0], int(stat[1]), stat[3])
    return out


class TreeCpuSampler:
    """CPU seconds used by a process tree, processes that have ended included.

    Ray's worker processes are children of the raylet, which does not reliably wait for
    them, so ``getrusage(RUSAGE_CHILDREN)`` misses them. Instead every process of the tree
    is sampled from ``/proc`` (call :meth:`sample` often, e.g. from a Tune callback): an
    ended process counts with its last sample, so up to one sampling interval of CPU per
    process is missed (its teardown). NaN where ``/proc`` is missing.
    """

    def __init__(self, root: int | None = None, min_interval_s: float = 0.5) -> None:
        self.root = os.getpid() if root is None else root
        self.min_interval_s = min_interval_s
        self._last = 0.0
        self._cpu: dict[tuple[int, int], float] = {}
        self.available = os.path.isdir("/proc")

    def sample(self, force: bool = False) -> None:
        now = time.monotonic()
        if not self.available or (not force and now - self._last < self.min_interval_s):
            return
        self._last = now
        table = _proc_table()
        children: dict[int, list[int]] = {}
        for pid, (ppid, _, _) in table.items():
            children.setdefault(ppid, []).append(pid)
        todo = [self.root]
        while todo:
            pid = todo.pop()
            if pid in table:
                _, start, cpu = table[pid]
                key = (pid, start)
                self._cpu[key] = max(self._cpu.get(key, 0.0), cpu)
            todo += children.get(pid, [])

    @property
    def cpu_s(self) -> float:
        return sum(self._cpu.values()) if self.available else float("nan")

    @property
    def num_processes(self) -> int:
        return len(self._cpu)


def children_cpu_s() -> float:
    """User + system CPU seconds of all waited-for descendants of this process."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def self_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


# ---------------------------------------------------------------------------------------
# Command lines
# ---------------------------------------------------------------------------------------
def add_output_arguments(parser: Any, json_name: str) -> None:
    """``--out DIR`` (where ``json_name`` is written; default ``benchmarks/results``) and
    ``--from-json PATH`` (print the tables of a saved run instead of running)."""
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"),
                        help=f"directory for {json_name}")
    parser.add_argument("--from-json", default=None, help="print the tables of a saved run")


def start_cli(args: Any, report: Any) -> bool:
    """Set up the benchmark's logging; if ``args.from_json`` names a saved run, print
    ``report(saved)`` and return True (nothing to run)."""
    import json
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    logging.getLogger("adaptdl_ray").setLevel(logging.WARNING)
    if args.from_json:
        with open(args.from_json) as f:
            print(report(json.load(f)))
        return True
    return False
