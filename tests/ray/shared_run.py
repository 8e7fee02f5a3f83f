"""A driver process of the shared-cluster test and benchmark: one Tune experiment of
``counting_job`` trials on the cluster at ``--address``, writing its record as JSON.

    python tests/ray/shared_run.py --address A --name N --arm shared|alone --out F \\
        --record-dir D --storage S [--cpus --trials --epochs --size --batch-size
        --sleep-per-sample --interval] [--slow-until PATH]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))))

from tests.exactly_once import assert_exactly_once  # noqa: E402

ARMS = ("shared", "alone")


def shape_arguments(parser: argparse.ArgumentParser) -> None:
    """The experiment's shape, shared by the driver, the benchmark and the test."""
    parser.add_argument("--cpus", type=int, default=4, help="logical CPUs of the cluster")
    parser.add_argument("--trials", type=int, default=4, help="trials per experiment")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--size", type=int, default=2048, help="samples per epoch")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--sleep-per-sample", type=float, default=0.003,
                        help="seconds per sample of a replica's batch")
    parser.add_argument("--sleep-per-step", type=float, default=0.05,
                        help="seconds per step whatever the replicas (so more replicas "
                             "speed a step up less than in proportion, as with a real model)")
    parser.add_argument("--interval", type=float, default=5.0,
                        help="the schedulers' allocation_interval_s")
    parser.add_argument("--long-epochs", type=int, default=30,
                        help="epochs of each experiment's first trial (0: --epochs)")
    parser.add_argument("--resize-prior", type=float, default=30.0,
                        help="the schedulers' resize_cost_prior_s")
    parser.add_argument("--always-resize", action="store_true",
                        help="carry out every resize the allocator's shares call for (the "
                             "trials are too short for the resize rule to find one that pays)")


def shape_argv(args: argparse.Namespace) -> list[str]:
    """``args``' shape as command-line arguments for a driver."""
    return ["--cpus", str(args.cpus), "--trials", str(args.trials), "--epochs",
            str(args.epochs), "--size", str(args.size), "--batch-size", str(args.batch_size),
            "--sleep-per-sample", str(args.sleep_per_sample),
            "--sleep-per-step", str(args.sleep_per_step), "--interval", str(args.interval),
            "--long-epochs", str(args.long_epochs), "--resize-prior", str(args.resize_prior)] + \
        (["--always-resize"] if args.always_resize else [])


def epochs_per_trial(args: argparse.Namespace) -> list[int]:
    """Each trial's epochs: the first ``--long-epochs`` (if set), the others ``--epochs``."""
    first = args.long_epochs or args.epochs
    return [first] + [args.epochs] * (args.trials - 1)


def run_driver(args: argparse.Namespace) -> dict[str, Any]:
    """One experiment on the cluster at ``args.address``; returns its record."""
    import ray
    from ray import tune

    from adaptdl_core.policy import ResizeVerdict
    from adaptdl_ray.tune import AdaptDLScheduler, AdaptDLTrainableCreator
    from tests.ray.trial_jobs import counting_job

    def always(**_: Any) -> ResizeVerdict:
        return ResizeVerdict(True, "resized by the test's rule")

    start = time.time()
    ray.init(address=args.address, log_to_driver=False)
    scheduler = AdaptDLScheduler(allocation_interval_s=args.interval,
                                 cluster_allocator=args.arm == "shared",
                                 resize_rule=always if args.always_resize else None,
                                 resize_cost_prior_s=args.resize_prior)
    trainable = AdaptDLTrainableCreator(counting_job, max_replicas=args.cpus)
    config = {"record_dir": args.record_dir, "per_trial_records": True,
              "size": args.size, "batch_size": args.batch_size,
              "sleep_per_sample": args.sleep_per_sample, "sleep": args.sleep_per_step,
              "report_every": 4, "slow_until": getattr(args, "slow_until", None),
              "epochs": tune.grid_search(epochs_per_trial(args))}
    tuner = tune.Tuner(trainable, param_space=config,
                       run_config=tune.RunConfig(name=args.name, storage_path=args.storage,
                                                 verbose=0),
                       tune_config=tune.TuneConfig(scheduler=scheduler))
    results = tuner.fit()
    end = time.time()
    trials = [{"error": str(r.error) if r.error else None,
               "restarts": r.metrics.get("adaptdl/restarts"),
               "replicas": r.metrics.get("adaptdl/replicas"),
               "time_total_s": r.metrics.get("time_total_s")} for r in results]
    jobs = {job_id: {"history": rec.history, "last_veto": rec.last_veto,
                     "resizes": [(e["from"], e["to"], e["reason"]) for e in rec.resize_log]}
            for job_id, rec in scheduler.state.jobs.items()}
    return {"name": args.name, "arm": args.arm, "start": start, "end": end,
            "wall_s": end - start, "trials": trials, "jobs": jobs,
            "resizes": sum(rec.resizes for rec in scheduler.state.jobs.values())}


def exactly_once(record_dir: str, args: argparse.Namespace) -> bool | str:
    """``True`` if the trials of one driver of shape ``args`` recorded under ``record_dir``
    each trained every sample of each of its epochs exactly once, else what went wrong."""
    dirs = [d for d in glob.glob(os.path.join(record_dir, "*")) if os.path.isdir(d)]
    if len(dirs) != args.trials:
        return f"{len(dirs)} trials recorded of {args.trials}"
    expected = sorted(epochs_per_trial(args))
    found = []
    for trial in dirs:
        events = [json.loads(line) for path in glob.glob(os.path.join(trial, "*.jsonl"))
                  for line in open(path) if line.strip()]
        epochs = 1 + max((e["epoch"] for e in events if e["event"] == "batch"), default=-1)
        found.append(epochs)
        try:
            assert_exactly_once(events, args.size, epochs)
        except AssertionError as exc:
            return f"{os.path.basename(trial)}: {exc}"
    if sorted(found) != expected:
        return f"epochs trained {sorted(found)}, expected {expected}"
    return True


def peak_replicas(history: dict) -> int:
    """The largest total of replicas given at one time, from the allocator's history (job
    key -> ``[time, replicas]`` per change; changes at the same time count together)."""
    current: dict[str, int] = {}
    peak = 0
    events = sorted((t, key, n) for key, changes in history.items() for t, n in changes)
    for i, (t, key, n) in enumerate(events):
        current[key] = n
        if i + 1 == len(events) or events[i + 1][0] != t:
            peak = max(peak, sum(current.values()))
    return peak


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    shape_arguments(parser)
    for name in ("--address", "--name", "--out", "--record-dir", "--storage"):
        parser.add_argument(name, required=True)
    parser.add_argument("--arm", choices=ARMS, required=True)
    parser.add_argument("--slow-until", default=None,
                        help="a path: once it exists, the trials' batches no longer sleep")
    args = parser.parse_args()
    record = run_driver(args)
    with open(args.out, "w") as f:
        json.dump(record, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
