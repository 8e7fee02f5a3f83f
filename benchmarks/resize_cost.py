"""What one resize of a 2-replica torch trial costs, by phase, beside a submitted job's.

One AdaptDL trial (the digits CNN, ``AdaptDLTrainableCreator(max_replicas=2)``) starts on
1 replica (as every trial does) and is resized 1 -> 2 -> 1 -> 2 ... by a scripted policy
given to ``AdaptDLScheduler(policy=..., resize_rule=...)`` (every resize is made, whether
or not it would pay), on a local Ray instance with the machine's real CPUs. A trial
resizes in place: Tune does not pause it; the replicas that stay keep their processes and
a grow's new replica starts while the trial trains. The phases come from the
``adaptdl/resize/*`` metrics of the first result after each resize (read by a Tune
callback):

| here | adaptdl/resize/... |
|---|---|
| decision -> stop (trains on) | ``decided_to_stop_s`` (the scheduler's decision to the stop request; a grow's new replica starts meanwhile) |
| checkpoint | ``checkpoint_s`` + ``save_s`` (stop at a batch boundary, rank 0 writes) |
| Tune relaunch | ``relaunch_s`` (0 in place: no new trial actor, no new placement group) |
| replicas up | ``worker_start_s`` (the replica group formed from those that stay and the new) |
| state load | ``restore_s`` (checkpoint handed over, files unpacked) |
| first step | ``first_step_s`` (process group, states loaded, first optimizer step) |
| **resize** | ``adaptdl/resize_s``: the stop request to the first step after it |

Each resize's cost as the scheduler predicted it when it began the resize (its
``resize_log``) is reported beside the measured one, with the prediction error.

Then, in the same run and on the same Ray instance, a submitted job's resize (``--job``,
default on): ``examples/standalone_digits.py`` run unchanged by
:class:`~adaptdl_ray.cluster.elastic_job.ElasticJob` (what ``adaptdl-ray submit`` runs),
resized 1 -> 2 -> 1 ... by a scripted sizer, each resize timed from the stop request (the
last batch trained before it) to the first optimizer step after it, as the job measures it
(the supervisor: "the resize took ..."), and the time from the resize decision to the stop
beside it.

Next to it, in the same run: the floor of starting a fresh Python process that imports
torch and ray (``python -c "import torch, ray"``, before and after the trial), and Tune's
own floor for a pause-relaunch cycle (after the trial, unless ``--tune-floor 0``): a
trivial class trainable (no torch; each step sleeps 50 ms, a checkpoint is a few bytes)
paused by a scripted scheduler and relaunched with the other bundle count (1 <-> 2 CPU
bundles after an empty head bundle), timed from the scheduler's PAUSE decision to the
driver receiving the first result after the relaunch: what a resize by Tune's pause would
cost at least.

    python benchmarks/resize_cost.py              # 6 resizes, 3+3 floor samples
    python benchmarks/resize_cost.py --resizes 4 --floor 3
    python benchmarks/resize_cost.py --from-state EXPERIMENT/adaptdl_scheduler_state.json
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import iqr_text, machine_description, markdown_table  # noqa: E402
import _tune_common as tc  # noqa: E402

LOG = logging.getLogger("resize_cost")

PHASES = [("decision -> stop (trains on)", ("decided_to_stop_s",)),
          ("checkpoint", ("checkpoint_s", "save_s")),
          ("Tune relaunch", ("relaunch_s",)),
          ("replicas up", ("worker_start_s",)),
          ("state load", ("restore_s",)),
          ("first step", ("first_step_s",))]


class AlternatingPolicy:
    """Stands in for the Pollux policy: ``start`` replicas first, then a job that has
    restarted ``r`` times gets ``sizes[r % len(sizes)]`` replicas, until ``resizes``
    restarts; then it keeps what it has. (A job is resized only after its previous
    resize has completed, because the count depends on its restart count.)"""

    def __init__(self, start: int, sizes: list[int], resizes: int) -> None:
        self.start, self.sizes, self.resizes = start, sizes, resizes
        self.rounds = 0

    def allocate(self, jobs, nodes, base_allocations=None, *, now=None):
        from adaptdl_core.policy import AllocationResult
        node = next(iter(nodes))
        allocations = {}
        for key, job in jobs.items():
            # By restart count only, so that a trial paused for a resize keeps its target.
            count = self.start if self.rounds == 0 else \
                self.sizes[min(job.num_restarts, self.resizes - 1) % len(self.sizes)]
            allocations[key] = [node] * count
        self.rounds += 1
        return AllocationResult(allocations, {k: float(len(v)) for k, v in allocations.items()},
                                1.0, 0, True, 0.0)


def _trivial_trainable() -> type:
    from ray import tune

    class Trivial(tune.Trainable):
        """No torch, no work: what Tune's pause-relaunch costs by itself."""

        def step(self) -> dict:
            time.sleep(0.05)
            return {"x": 1.0}

        def save_checkpoint(self, checkpoint_dir: str) -> None:
            with open(os.path.join(checkpoint_dir, "state.json"), "w") as f:
                json.dump({"iteration": self.iteration}, f)

        def load_checkpoint(self, checkpoint_dir: str) -> None:
            with open(os.path.join(checkpoint_dir, "state.json")) as f:
                json.load(f)

    return Trivial


def _flip_scheduler(resizes: int) -> object:
    """A FIFO scheduler that pauses a trial on its 3rd result after each (re)start and
    relaunches it with the other bundle count, ``resizes`` times; ``samples`` holds
    seconds from each PAUSE decision to the first result after the relaunch."""
    from ray.tune.execution.placement_groups import PlacementGroupFactory
    from ray.tune.schedulers import FIFOScheduler, TrialScheduler

    class Flip(FIFOScheduler):
        def __init__(self) -> None:
            super().__init__()
            self.left, self.samples, self.paused_at, self.since = resizes, [], {}, {}
            self.bundles: dict[str, int] = {}

        def on_trial_result(self, tc, trial, result):
            key = trial.trial_id
            if key in self.paused_at:
                self.samples.append(time.time() - self.paused_at.pop(key))
            self.since[key] = self.since.get(key, 0) + 1
            if self.left > 0 and self.since[key] >= 3:
                self.left -= 1
                self.since[key] = 0
                self.paused_at[key] = time.time()
                return TrialScheduler.PAUSE
            if self.left == 0 and not self.paused_at:
                return TrialScheduler.STOP
            return TrialScheduler.CONTINUE

        def choose_trial_to_run(self, tc):
            for trial in tc.get_trials():
                if trial.status == "PAUSED":
                    n = 3 - self.bundles.get(trial.trial_id, 1)
                    self.bundles[trial.trial_id] = n
                    trial.update_resources(PlacementGroupFactory(
                        [{}] + [{"CPU": 1}] * n, strategy="PACK"))
                    return trial
            return super().choose_trial_to_run(tc)

    return Flip()


def _after_last_resize(resizes: int):
    """A Tune stopper ending the trial at the second result after its last resize: the
    first carries the resize's cost, and the scheduler records it beside the prediction
    only from a result it receives (a trial's final result goes to on_trial_complete)."""
    seen = []

    def stop(trial_id: str, result: dict) -> bool:
        if result.get("adaptdl/restarts", 0) >= resizes:
            seen.append(trial_id)
        return seen.count(trial_id) >= 2

    return stop


def tune_floor(resizes: int, storage: str) -> list[float]:
    """Seconds of Tune's own pause-relaunch cycles of a trivial trainable (see the module
    docstring), on the running Ray instance."""
    from ray import tune
    from ray.tune.execution.placement_groups import PlacementGroupFactory
    scheduler = _flip_scheduler(resizes)
    trainable = tune.with_resources(_trivial_trainable(), PlacementGroupFactory(
        [{}, {"CPU": 1}], strategy="PACK"))
    tune.run(trainable, name="tune_floor", scheduler=scheduler, storage_path=storage,
             verbose=0, reuse_actors=False, raise_on_failed_trial=False,
             stop={"training_iteration": 10 * (resizes + 2)})
    return scheduler.samples


class _ScriptedSizer:
    """A submitted job's sizer that starts it on 1 replica and resizes it 1 -> 2 -> 1 ...
    after ``reads`` status reads at each size, ``resizes`` times, then stops the job after
    ``reads`` more. Records each resize's measured cost (``JobProgress.resize_cost_s``, stop
    request to first step) and the seconds from its first decision to its begin (the grow's
    new replica starting while the job trains)."""

    def __init__(self, resizes: int, reads: int, stop: Any) -> None:
        self.resizes, self.reads, self.stop = resizes, reads, stop
        self.current, self.seen, self.begun = 1, 0, 0
        self.decided_at: float | None = None
        self.samples: list[dict] = []
        self._pending: dict | None = None

    def start(self) -> int:
        return 1

    def observe(self, replicas: int, *, nodes: Any = None, hints: Any = None,
                progress: Any = None) -> None:
        if replicas != self.current:
            self.current, self.seen = replicas, 0
            if self._pending is not None and progress is not None and \
                    progress.resize_cost_s is not None:
                self.samples.append({**self._pending, "pause_s": progress.resize_cost_s})
                self._pending = None
        self.seen += 1
        if self.begun >= self.resizes and self._pending is None and self.seen > self.reads:
            self.stop()

    def decision(self) -> Any:
        from adaptdl_core.decision import Decision
        if self.begun < self.resizes and self._pending is None and self.seen >= self.reads:
            if self.decided_at is None:
                self.decided_at = time.time()
            return Decision("job", "resize", 3 - self.current, (), "scripted")
        return Decision("job", "keep", self.current, (), "scripted")

    def begin_resize(self, decision: Any) -> None:
        self.begun += 1
        self._pending = {"from": self.current, "to": decision.replicas,
                         "decision_to_stop_s": time.time() - (self.decided_at or time.time())}
        self.decided_at = None

    def end(self, outcome: str = "ended") -> None:
        pass


def job_resizes(resizes: int, storage: str, reads: int = 2) -> list[dict]:
    """Each resize of a submitted job (see the module docstring) on the running Ray
    instance: ``from``, ``to``, ``pause_s`` (stop request to first step) and
    ``decision_to_stop_s``."""
    from adaptdl_core.decision import JobSpec
    from adaptdl_ray.cluster.elastic_job import ElasticJob
    from adaptdl_ray.cluster.job_files import JobFiles
    script = os.path.join(tc.EXAMPLES, "standalone_digits.py")
    holder: list[Any] = []
    sizer = _ScriptedSizer(resizes, reads, stop=lambda: holder[0].request_stop())
    job = ElasticJob(JobFiles("resize-cost", os.path.join(storage, "jobs")), script,
                     ["--epochs", "1000", "--batch-size", "64"], JobSpec({"CPU": 1}, 1, 2),
                     sizer=sizer, status_every_s=0.5, checkpoint_interval_s=None)
    holder.append(job)
    status = job.run()
    if status != 0:
        raise RuntimeError(f"the submitted job ended with status {status}")
    return sizer.samples


def floor_once() -> float:
    """Seconds to start ``python -c "import torch, ray"`` and let it exit."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch, ray"], check=True,
                   env=dict(os.environ, OMP_NUM_THREADS="1"))
    return time.perf_counter() - t0


def run(args: argparse.Namespace) -> dict:
    from ray import tune

    from adaptdl_core.policy import ResizeVerdict
    from adaptdl_ray.tune import AdaptDLScheduler, AdaptDLTrainableCreator

    floor = [floor_once() for _ in range(args.floor)]
    tc.init_ray(2 if args.cpus is None else args.cpus)
    recorder = tc.make_recorder()
    storage = tempfile.mkdtemp(prefix="resize-cost-")
    # Every scripted resize is made, whether or not it would pay: this measures its cost.
    scheduler = AdaptDLScheduler(allocation_interval_s=args.interval,
                                 policy=AlternatingPolicy(1, [2, 1], args.resizes),
                                 resize_rule=lambda **kw: ResizeVerdict(
                                     kw["current"] != kw["target"], "forced"))
    t0 = time.time()
    analysis = tune.run(
        AdaptDLTrainableCreator(tc.train_digits, max_replicas=2), name="resize_cost",
        config={"lr": 0.05, "momentum": 0.9, "batch_size": 64, "epochs": args.epochs,
                "report_every": 1, "seed": 0, "max_batch_size": 0},
        scheduler=scheduler, storage_path=storage, verbose=0, reuse_actors=False,
        raise_on_failed_trial=False, callbacks=[recorder],
        stop=_after_last_resize(args.resizes))
    wall = time.time() - t0
    tune_floor_s = tune_floor(args.tune_floor, storage) if args.tune_floor else []
    job = job_resizes(args.resizes, storage) if args.job else []
    import ray
    ray.shutdown()
    floor += [floor_once() for _ in range(args.floor)]
    trial = next(iter(recorder.trials.values()))
    return {"machine": machine_description(), "floor_s": floor, "wall_s": wall,
            "status": analysis.trials[0].status, "resizes": trial["resizes"],
            "timeline": trial["timeline"], "epochs": args.epochs, "tune_floor_s": tune_floor_s,
            "predictions": predictions(scheduler.state), "job_resizes": job}


def predictions(state: object) -> list[dict]:
    """Each resize's predicted cost (what the scheduler assumed when it began it) beside
    its measured one, from the scheduler's ``resize_log``."""
    return _measured([e for record in state.jobs.values() for e in record.resize_log])


def predictions_from_file(path: str) -> list[dict]:
    """:func:`predictions` from an experiment's ``adaptdl_scheduler_state.json`` (the
    records under ``"jobs"``, or ``"trials"`` as trees before the rename wrote them), so
    that the prediction error of any run, of this tree or an older one, can be read."""
    with open(path) as f:
        state = json.load(f)
    records = state.get("jobs", state.get("trials"))
    if not isinstance(records, dict):
        raise ValueError(f"{path} holds no 'jobs' (or 'trials') records: not an "
                         "adaptdl_scheduler_state.json")
    return _measured([e for record in records.values() for e in record.get("resize_log", [])])


def _measured(entries: list[dict]) -> list[dict]:
    """The ``resize_log`` entries whose cost was measured, in time order, as rows."""
    return [{"from": e["from"], "to": e["to"], "predicted_s": e["cost_s"],
             "measured_s": e["measured_s"]}
            for e in sorted(entries, key=lambda e: e["time"])
            if e.get("measured_s") is not None]


def prediction_error(rows: list[dict]) -> dict:
    """Median and largest relative error ``|predicted - measured| / measured``, and the
    median ratio ``measured / predicted`` (> 1: the prediction was optimistic)."""
    errors = [abs(r["predicted_s"] - r["measured_s"]) / r["measured_s"] for r in rows]
    ratios = [r["measured_s"] / r["predicted_s"] for r in rows if r["predicted_s"] > 0]
    return {"n": len(rows), "median_rel_error": statistics.median(errors) if errors else None,
            "max_rel_error": max(errors) if errors else None,
            "median_measured_over_predicted": statistics.median(ratios) if ratios else None}


def report(data: dict) -> str:
    resizes = data["resizes"]
    rows = []
    groups = [("2 -> 1", [r for r in resizes if r["replicas"] == 1]),
              ("1 -> 2", [r for r in resizes if r["replicas"] == 2]),
              ("all", resizes)]
    header = ["Tune trial, in place"] + [f"{name} (n={len(rs)}), s: median [p25, p75]"
                                         for name, rs in groups]
    for name, keys in PHASES:
        rows.append([name] + [iqr_text([sum(r[k] for k in keys) for r in rs], "{:.2f}")
                              if rs else "-" for _, rs in groups])
    rows.append(["**resize** (stop request -> first step)"] + [
        iqr_text([r["total_s"] for r in rs], "{:.2f}") if rs else "-" for _, rs in groups])
    floor = data["floor_s"]
    tune_s = data.get("tune_floor_s") or []
    tune_lines = [
        f"Tune's own pause -> relaunch -> first result, trivial trainable, 1 <-> 2 bundles "
        f"(n={len(tune_s)}): {iqr_text(tune_s, '{:.2f}')} s = "
        f"{statistics.median(tune_s) / statistics.median(floor):.1f}x the floor"] \
        if tune_s else []
    total = statistics.median(r["total_s"] for r in resizes) if resizes else float("nan")
    job_lines = job_report(data.get("job_resizes") or [], statistics.median(floor), total)
    return "\n".join([
        f"Machine: {data['machine']}",
        f"trial status {data['status']}, {len(resizes)} resizes measured, trial wall "
        f"{data['wall_s']:.0f} s", "",
        markdown_table(header, rows), "",
        f"floor, fresh `python -c \"import torch, ray\"` (n={len(floor)}, before and after "
        f"the trial): {iqr_text(floor, '{:.2f}')} s; median resize / floor = "
        f"{total / statistics.median(floor):.1f}x"] + tune_lines + job_lines
        + ([""] + prediction_report(data["predictions"]) if data.get("predictions") else []))


def job_report(job: list[dict], floor_s: float, tune_s: float) -> list[str]:
    """The submitted job's resizes (pause and decision-to-stop) by direction, against the
    floor ``floor_s`` and the Tune trial's median resize ``tune_s``."""
    if not job:
        return []
    rows = []
    for name, rs in (("1 -> 2", [r for r in job if r["to"] == 2]),
                     ("2 -> 1", [r for r in job if r["to"] == 1]), ("all", job)):
        if rs:
            pause = statistics.median(r["pause_s"] for r in rs)
            rows.append([name, str(len(rs)), iqr_text([r["pause_s"] for r in rs], "{:.2f}"),
                         f"{pause / floor_s:.2f}x",
                         iqr_text([r["decision_to_stop_s"] for r in rs], "{:.2f}")])
    pause = statistics.median(r["pause_s"] for r in job)
    return ["", "Submitted job (ElasticJob, replicas that stay kept), stop request -> first "
            "step, s:",
            markdown_table(["from -> to", "n", "pause: median [p25, p75]", "x floor",
                            "decision -> stop (trains on)"], rows),
            f"median job resize / floor = {pause / floor_s:.2f}x; median Tune-trial resize / "
            f"job resize = {tune_s / pause:.1f}x"]


def prediction_report(rows_p: list[dict]) -> list[str]:
    """Each resize's predicted and measured cost, then the prediction error."""
    err = prediction_error(rows_p)
    return [
        "Resize cost, predicted when the resize began vs measured (pause to first step):",
        markdown_table(["#", "from -> to", "predicted, s", "measured, s", "rel. error"],
                       [[str(i + 1), f"{r['from']} -> {r['to']}", f"{r['predicted_s']:.2f}",
                         f"{r['measured_s']:.2f}",
                         f"{abs(r['predicted_s'] - r['measured_s']) / r['measured_s']:.0%}"]
                        for i, r in enumerate(rows_p)]),
        f"prediction error (n={err['n']}): median {err['median_rel_error']:.0%}, max "
        f"{err['max_rel_error']:.0%}; median measured/predicted "
        f"{err['median_measured_over_predicted']:.2f}x"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--resizes", type=int, default=6, help="resizes to measure (default 6)")
    p.add_argument("--floor", type=int, default=3,
                   help="floor samples before and after the trial each (default 3)")
    p.add_argument("--epochs", type=int, default=400,
                   help="epochs of the trial at most (enough to outlast the resizes; it is "
                        "stopped after the last one; default 400)")
    p.add_argument("--interval", type=float, default=2.0,
                   help="AdaptDLScheduler allocation interval (default 2 s)")
    p.add_argument("--cpus", type=int, default=None, help="Ray CPUs (default 2: 2 replicas)")
    p.add_argument("--tune-floor", type=int, default=4,
                   help="pause-relaunch cycles of a trivial trainable to time after the "
                        "trial (Tune's own floor; 0 skips; default 4)")
    p.add_argument("--job", action=argparse.BooleanOptionalAction, default=True,
                   help="also time the resizes of a submitted job (ElasticJob), as many as "
                        "--resizes (default on)")
    p.add_argument("--from-state", default=None, metavar="FILE",
                   help="print the predicted vs measured resize costs recorded in an "
                        "experiment's adaptdl_scheduler_state.json (of any run, also of "
                        "an older tree) and their error, instead of running")
    tc.add_output_arguments(p, "resize_cost.json")
    args = p.parse_args(argv)
    if args.from_state:
        rows = predictions_from_file(args.from_state)
        if not rows:
            print(f"{args.from_state}: no resize with a measured cost")
            return 1
        print("\n".join(prediction_report(rows)))
        return 0
    if tc.start_cli(args, report):
        return 0
    data = run(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "resize_cost.json", "w") as f:
        json.dump(data, f)
    print(report(data))
    print(f"raw data: {out / 'resize_cost.json'}")
    return 0 if data["status"] == "TERMINATED" and data["resizes"] else 1


if __name__ == "__main__":
    sys.exit(main())
