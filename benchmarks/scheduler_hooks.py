"""How long AdaptDLScheduler's hooks block Ray Tune's event loop, at 100 and 500 trials.

Drives the real ``AdaptDLScheduler`` (no Ray processes: stub trials and a stub controller,
as ``tests/ray/test_scheduler_unit.py`` does) through a sweep on a simulated clock:

1. N trials are added at once (a searcher's burst), with ``choose_trial_to_run`` after
   each addition, as Tune's event loop interleaves them;
2. the trials that fit start (16 nodes x 4 CPUs, one CPU per replica); each running trial
   reports a result every 10 simulated seconds with ``adaptdl/`` progress keys, and posts
   scheduler hints (a fitted throughput model that scales, refreshed every third result);
3. a trial the scheduler pauses for a resize is resumed when the scheduler chooses it and
   reports its relaunch (restarts, measured resize cost) 10 s later;
4. each trial finishes after 15-40 results (seeded), and waiting trials take its room.

Every hook call is timed with the real clock (``time.perf_counter``); the scheduler's own
clocks (``time.time``, ``time.monotonic`` in its module) follow the simulated one, so its
interval (30 s) and throttles behave as in a run of that length. Simulated time runs as
fast as the hooks answer, except while a solve is under way (from the decision core's
``begin_solve`` to the end of ``SolveRequest.run`` in the scheduler's worker thread): then
it runs no faster than real time (the script sleeps, untimed, for the
simulated gap between two events or until the solve ends), as a real sweep's results keep
arriving at their own pace while a solve runs. Without this pacing (``--no-pace``) a whole
run takes about as long as its solves, so that the solve thread is busy during nearly
every hook, and a scheduler that does not wait for its solves sees them finish many
simulated minutes late. Printed per N: p50, p99 and max milliseconds per hook, policy
solves and their total time, state writes and the state file's final size.

Usage: ``python benchmarks/scheduler_hooks.py [--trials 100 500] [--seed 0] [--no-pace]``.
To measure
another version of the scheduler, put its tree first on ``PYTHONPATH`` (for example an
older commit unpacked with ``git archive COMMIT adaptdl_core adaptdl_ray | tar -x -C DIR``);
the script imports only the public ``adaptdl_ray.tune`` and ``adaptdl_core.policy`` names.
"""

from __future__ import annotations

import argparse
import heapq
import os
import random
import statistics
import sys
import tempfile
import threading
import time
import types

from ray.tune.experiment import Trial

import adaptdl_ray.tune.scheduler as scheduler_module
from adaptdl_core.decision import DecisionCore, SolveRequest
from adaptdl_core.policy import NodeInfo, PolluxPolicy
from adaptdl_ray.tune import AdaptDLScheduler, AdaptDLTrainableCreator
from adaptdl_ray.tune.resources import num_replicas_of

NODES, CPUS_PER_NODE = 16, 4
RESULT_PERIOD_S = 10.0
RELAUNCH_S = 10.0
ADD_STEP_S = 0.005  # simulated time between two additions of a burst


def train_fn(config):
    """Never run: the trials are stubs."""


TRAINABLE = AdaptDLTrainableCreator(train_fn)


class StubTrial:
    """The parts of a Tune Trial the scheduler uses."""

    def __init__(self, trial_id: str, state_dir: str) -> None:
        self.trial_id = trial_id
        self.status = Trial.PENDING
        self.placement_group_factory = TRAINABLE.default_resource_request({})
        self.storage = types.SimpleNamespace(experiment_driver_staging_path=state_dir)
        self.checkpoint = None
        self.local_path = self.path = None
        self.is_saving = False

    def get_trainable_cls(self):
        """The trainable class (made by AdaptDLTrainableCreator)."""
        return TRAINABLE

    def update_resources(self, pgf) -> None:
        """Tune's resource update (refused while running, as Tune does)."""
        if self.status == Trial.RUNNING:
            raise ValueError("Cannot update resources while Trial is running.")
        self.placement_group_factory = pgf

    @property
    def replicas(self) -> int:
        """Replicas its placement group requests."""
        return num_replicas_of(self.placement_group_factory)


class StubController:
    """Tune's controller as the scheduler sees it."""

    def __init__(self) -> None:
        self.trials: list[StubTrial] = []

    def get_trials(self) -> list[StubTrial]:
        """All trials, in the order they were added."""
        return list(self.trials)


class SimClock:
    """The simulated time the scheduler module sees as time.time and time.monotonic."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


class CountingPolicy(PolluxPolicy):
    """PolluxPolicy counting its solves and their time."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0
        self.seconds = 0.0

    def allocate(self, *args, **kwargs):
        """Solve, counted."""
        t0 = time.perf_counter()
        try:
            return super().allocate(*args, **kwargs)
        finally:
            self.calls += 1
            self.seconds += time.perf_counter() - t0


def hints_for(rng: random.Random, replicas_seen: int) -> dict:
    """A trial's scheduler hints: a fitted model that scales well, jittered per refresh."""
    jitter = 1.0 + 0.05 * rng.random()
    return {"init_batch_size": 64, "max_batch_size": 2048,
            "perf_params": [0.02 * jitter, 0.002, 0.01, 0.0001, 0.005 * jitter, 0.00005, 1.5],
            "grad_params": [1.0, 200.0 * jitter], "local_bsz_bounds": [16, 512],
            "max_profiled_replicas": replicas_seen, "max_profiled_nodes": 1}


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (nearest rank) of ``values``."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(round(q / 100 * len(ordered))) - 1))]


def run(num_trials: int, seed: int, pace: bool = True) -> dict:
    """One simulated sweep of ``num_trials`` trials; returns the timings and counts.

    ``pace``: while a solve runs, simulated time passes no faster than real time."""
    rng = random.Random(seed)
    clock = SimClock()
    scheduler_module.time = types.SimpleNamespace(time=clock, monotonic=clock,
                                                  perf_counter=time.perf_counter)
    writes = {"count": 0, "bytes": 0}
    # Count the state files written: through the decision core's atomic writer where the
    # scheduler has one (it may write from a background thread), else SchedulerState.save.
    state_module = sys.modules.get("adaptdl_core.decision.state")
    if state_module is not None and hasattr(state_module, "write_atomic"):
        owner, attr = state_module, "write_atomic"
    else:
        owner, attr = scheduler_module.SchedulerState, "save"
    original_write = getattr(owner, attr)

    def counting_write(*args, **kwargs):
        path = original_write(*args, **kwargs)
        writes["count"] += 1
        writes["bytes"] = os.path.getsize(path)
        return path

    setattr(owner, attr, counting_write)
    nodes = {f"n{i}": NodeInfo({"CPU": float(CPUS_PER_NODE)}) for i in range(NODES)}
    hints: dict[str, dict] = {}
    policy = CountingPolicy()
    sched = AdaptDLScheduler(nodes_fn=lambda: nodes, policy=policy, allocation_interval_s=30.0,
                             hints_fn=lambda ids: {t: hints[t] for t in ids if t in hints})
    tc = StubController()
    lat: dict[str, list[float]] = {k: [] for k in ("on_trial_add", "choose_trial_to_run",
                                                   "on_trial_result", "on_trial_complete")}

    errors: dict[str, str] = {}

    def timed(name, fn, *args):
        t0 = time.perf_counter()
        try:
            out = fn(*args)
        except ValueError as exc:
            # Tune would end the experiment here; counted, so that a version that fails
            # can still be timed (the hook is taken as having answered CONTINUE / None).
            errors.setdefault(f"{name}: {exc}", 0)
            errors[f"{name}: {exc}"] += 1
            out = None
        lat[name].append(time.perf_counter() - t0)
        return out

    # A solve is under way from begin_solve (in a hook) to the end of its run (in the
    # scheduler's worker thread, or in the hook when it waits).
    idle = threading.Event()
    idle.set()
    original_begin, original_run = DecisionCore.begin_solve, SolveRequest.run

    def begin_solve(self):
        idle.clear()
        return original_begin(self)

    def run_solve(self):
        try:
            return original_run(self)
        finally:
            idle.set()

    DecisionCore.begin_solve, SolveRequest.run = begin_solve, run_solve

    def advance(to: float) -> None:
        """Move the simulated clock to ``to`` (paced while a solve is under way)."""
        gap = to - clock.now
        if pace and gap > 0:
            idle.wait(gap)
        clock.now = max(clock.now, to)

    length = {}
    progress = {}  # trial id -> [results so far, restarts, replicas seen]
    events: list = []  # (time, seq, trial id): its next result
    seq = 0
    capacity = NODES * CPUS_PER_NODE

    def used() -> int:
        return sum(t.replicas for t in tc.trials if t.status == Trial.RUNNING)

    def loop_step() -> None:
        """One step of Tune's event loop: ask the scheduler, then start what fits."""
        nonlocal seq
        for _ in range(num_trials):
            trial = timed("choose_trial_to_run", sched.choose_trial_to_run, tc)
            if trial is None or trial.status != Trial.PAUSED:
                break
            trial.status = Trial.PENDING  # Tune resumes it from its checkpoint
        in_use = used()
        for t in tc.trials:
            if t.status == Trial.PENDING and in_use + t.replicas <= capacity:
                in_use += t.replicas
                relaunch = t.trial_id in progress
                t.status = Trial.RUNNING
                if relaunch:
                    progress[t.trial_id][1] += 1
                else:
                    progress[t.trial_id] = [0, 0, t.replicas]
                progress[t.trial_id][2] = max(progress[t.trial_id][2], t.replicas)
                seq += 1
                heapq.heappush(events, (clock.now + (RELAUNCH_S if relaunch else 5.0), seq,
                                        t.trial_id))

    with tempfile.TemporaryDirectory() as state_dir:
        for i in range(num_trials):
            trial = StubTrial(f"t{i:04d}", state_dir)
            length[trial.trial_id] = rng.randint(15, 40)
            tc.trials.append(trial)
            timed("on_trial_add", sched.on_trial_add, tc, trial)
            timed("choose_trial_to_run", sched.choose_trial_to_run, tc)
            advance(clock.now + ADD_STEP_S)
        loop_step()
        by_id = {t.trial_id: t for t in tc.trials}
        finished = 0
        while events:
            when, _, trial_id = heapq.heappop(events)
            advance(when)
            trial = by_id[trial_id]
            if trial.status != Trial.RUNNING:
                continue  # paused since: its next result comes after its relaunch
            done, restarts, seen = progress[trial_id]
            done += 1
            progress[trial_id][0] = done
            if done % 3 == 1:
                hints[trial_id] = hints_for(rng, seen)
            total = length[trial_id]
            result = {"loss": 1.0 / done, "training_iteration": done,
                      "time_total_s": RESULT_PERIOD_S * done,
                      "adaptdl/epochs_done": done, "adaptdl/epochs": total,
                      "adaptdl/restarts": restarts, "adaptdl/resize_s": RELAUNCH_S,
                      "adaptdl/launch_s": 5.0}
            if done >= total:
                trial.status = Trial.TERMINATED
                timed("on_trial_complete", sched.on_trial_complete, tc, trial, result)
                finished += 1
            else:
                action = timed("on_trial_result", sched.on_trial_result, tc, trial, result)
                if action == "PAUSE":
                    trial.status = Trial.PAUSED
                else:
                    seq += 1
                    heapq.heappush(events, (clock.now + RESULT_PERIOD_S, seq, trial_id))
            loop_step()
            if not events and finished < num_trials:
                # Paused trials wait for room: let simulated time pass.
                advance(clock.now + 1.0)
                loop_step()
                if not events:
                    break
        if hasattr(sched, "flush_state"):
            sched.flush_state()
        setattr(owner, attr, original_write)
        DecisionCore.begin_solve, SolveRequest.run = original_begin, original_run
        resizes = sum(r.resizes for r in sched.state.jobs.values())
        return {"trials": num_trials, "finished": finished, "sim_s": clock.now - 1_000_000.0,
                "latency": lat, "solves": policy.calls, "solve_s": policy.seconds,
                "writes": writes["count"], "state_bytes": writes["bytes"], "resizes": resizes,
                "errors": errors}


def main(argv: list[str] | None = None) -> None:
    """Command line: run the sweeps and print one table per trial count."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, nargs="+", default=[100, 500])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-pace", action="store_true",
                        help="let simulated time run as fast as the hooks answer, also "
                             "while the policy solves (the script's behaviour before pacing)")
    args = parser.parse_args(argv)
    print(f"scheduler: {scheduler_module.__file__}; "
          f"{'unpaced' if args.no_pace else 'paced while solving'}")
    for n in args.trials:
        t0 = time.perf_counter()
        out = run(n, args.seed, pace=not args.no_pace)
        wall = time.perf_counter() - t0
        print(f"\n## {n} trials ({out['finished']} finished, {out['resizes']} resizes, "
              f"{out['sim_s']:.0f} simulated s, {wall:.1f} s wall)")
        print(f"policy solves: {out['solves']} ({out['solve_s']:.2f} s); state writes: "
              f"{out['writes']} (final file {out['state_bytes'] / 1024:.1f} KiB)")
        for message, count in out["errors"].items():
            print(f"ERROR x{count}: {message}")
        print("| hook | calls | p50 ms | p99 ms | max ms | total s |")
        print("|---|---|---|---|---|---|")
        for name, values in out["latency"].items():
            if not values:
                continue
            ms = [1e3 * v for v in values]
            print(f"| {name} | {len(ms)} | {statistics.median(ms):.2f} | "
                  f"{percentile(ms, 99):.2f} | {max(ms):.1f} | {sum(values):.2f} |")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
