"""A HyperOpt sweep on Ray Tune with elastic AdaptDL trials, resized by their goodput.

Every trial trains a small set classifier (``mlp_data.py``) on one or more data-parallel
replicas (``AdaptDLTrainableCreator``), lets the loader pick its batch size
(``loader.autoscale_batch_size``), and reports its test accuracy to Tune once per epoch,
with the model as a Tune checkpoint. ``AdaptDLScheduler`` re-divides the CPUs among the
running trials with the Pollux policy: when the searcher has no more trials to start and
a trial's measured speedup would save more time than a resize costs, it grows that trial
by checkpointing it at a batch boundary and relaunching it on more replicas, where it
continues at the same epoch and sample.

    python examples/hyperopt_example.py            # the default sweep (a few minutes)
    python examples/hyperopt_example.py --quick    # 3 short trials (for tests)
    python examples/hyperopt_example.py --tuner    # the same through tune.Tuner

It starts its own local Ray instance and ends with a per-trial summary (configuration,
final accuracy, replicas over the epochs), one line per resize saying why it happened
(predicted speedup and time saved, resize cost assumed and measured), and the best
trial's checkpoint loaded back and evaluated. See examples/README.md for every option.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from typing import Any

import torch

import adaptdl_core.torch as adl
from adaptdl_core import env
from adaptdl_ray.tune.results import PROGRESS_COLUMNS as ADAPTDL_COLUMNS

# Make `import mlp_data` work however the script is started.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from digits_data import evaluate, train_epoch  # noqa: E402  (generic classification loops)
from mlp_data import SetMLP, load_mlp_datasets  # noqa: E402

log = logging.getLogger("hyperopt_example")

METRIC = "mean_accuracy"
BATCH_SIZES = [64, 128, 256]  # the initial global batch sizes searched
# Columns of Tune's progress table (metric name -> column title): the accuracy, then
# AdaptDL's (epochs with the samples and passes over the data they consumed, replicas,
# restarts, batch size).
PROGRESS_COLUMNS = {METRIC: "acc", **ADAPTDL_COLUMNS}


# ---------------------------------------------------------------------------------------
# The training function: an ordinary adaptdl_core loop plus one tune.report per epoch.
# Every replica of a trial runs it; only rank 0's reports (and checkpoints) reach Tune.
# ---------------------------------------------------------------------------------------
def train_mlp(config: dict) -> None:
    """One trial: ``lr``, ``momentum``, ``batch_size`` (initial global batch), ``epochs``,
    ``seed``, ``max_batch_size`` (autoscaling cap; 0 or missing: fixed batch) and
    ``samples`` (size of the generated data set, default 20,000)."""
    from ray import tune

    torch.manual_seed(config["seed"])
    adl.init_process_group("gloo")

    train_dataset, test_dataset = load_mlp_datasets(config.get("samples", 20_000))
    model = SetMLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"],
                                momentum=config["momentum"])
    lr_scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer,
                                                              T_max=config["epochs"])
    model = adl.AdaptiveDataParallel(model, optimizer, lr_scheduler)

    # batch_size is the initial global batch: the loader moves it (up to max_batch_size)
    # to wherever the measured throughput and gradient noise predict the best goodput.
    train_loader = adl.AdaptiveDataLoader(train_dataset, batch_size=config["batch_size"],
                                          shuffle=True, drop_last=True)
    if config.get("max_batch_size"):
        train_loader.autoscale_batch_size(config["max_batch_size"])
    test_loader = adl.AdaptiveDataLoader(test_dataset, batch_size=1000)
    accum = adl.Accumulator()

    if env.num_restarts():
        log.info("resuming at epoch %d on %d replica(s) (restart %d)",
                 adl.finished_epochs(), env.num_replicas(), env.num_restarts())
    for epoch in adl.remaining_epochs_until(config["epochs"]):
        train_epoch(model, optimizer, train_loader, accum)
        evaluate(model, test_loader, accum)
        with accum.synchronized():
            train_loss = accum["train_loss"] / max(accum["train_n"], 1)
            accuracy = accum["correct"] / accum["test_n"]
            accum.clear()
        # The model goes to Tune with the report: it becomes this trial's checkpoint
        # (the files are read right away, so the directory may go).
        with tempfile.TemporaryDirectory() as d:
            torch.save(model.module.state_dict(), os.path.join(d, "model.pt"))
            tune.report({METRIC: accuracy, "train_loss": train_loss, "epoch": epoch},
                        checkpoint=tune.Checkpoint.from_directory(d))
        # Step the scheduler at the END of the epoch body (see the README's idempotency
        # rule: code before the loop may run again after a restart).
        lr_scheduler.step()


# ---------------------------------------------------------------------------------------
# The sweep
# ---------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked (``--quick`` sets the test-sized run)."""
    cpus = os.cpu_count() or 1
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--num-samples", type=int, default=5,
                   help="trials HyperOpt proposes (default 5)")
    p.add_argument("--epochs", type=int, default=12, help="epochs per trial (default 12)")
    p.add_argument("--cpus", type=int, default=cpus,
                   help=f"CPUs of the local Ray instance (default: this machine's, {cpus})")
    p.add_argument("--cpus-per-replica", type=int, default=1,
                   help="CPUs (and torch threads) of each replica (default 1)")
    p.add_argument("--max-concurrent", type=int, default=None,
                   help="trials running at once (default: as many as the CPUs hold at one "
                        "replica each)")
    p.add_argument("--interval", type=float, default=10.0,
                   help="seconds between re-allocations of the CPUs (default 10)")
    p.add_argument("--max-batch-size", type=int, default=1024,
                   help="upper bound of the autoscaled global batch size (default 1024)")
    p.add_argument("--samples", type=int, default=20_000,
                   help="size of the generated data set, 80%% for training (default 20000)")
    p.add_argument("--asha", action="store_true",
                   help="stop poor trials early (ASHAScheduler as the base scheduler)")
    p.add_argument("--seed", type=int, default=0, help="seed of HyperOpt (default 0)")
    p.add_argument("--quick", action="store_true",
                   help="a short run for tests: 3 trials of 2 epochs on 4000 samples")
    p.add_argument("--tuner", action="store_true",
                   help="run through tune.Tuner(...).fit() instead of tune.run(...)")
    p.add_argument("--storage-path", default=None,
                   help="where Tune keeps the results (default: a temporary directory, "
                        "removed at the end)")
    p.add_argument("--summary-json", default=None, metavar="PATH",
                   help="also write the summary (best trial, every trial) as JSON")
    p.add_argument("--verbose", type=int, default=1, choices=(0, 1, 2),
                   help="0: summary only; 1: Tune's progress table (default); "
                        "2: also every result and the scheduler's decisions")
    args = p.parse_args(argv)
    if args.quick:
        args.num_samples, args.epochs, args.samples = 3, 2, 4000
    for name in ("num_samples", "epochs", "cpus", "cpus_per_replica"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.cpus < args.cpus_per_replica:
        p.error("--cpus must be >= --cpus-per-replica (a trial needs one replica)")
    if args.max_concurrent is None:
        args.max_concurrent = max(1, args.cpus // args.cpus_per_replica)
    if args.max_concurrent < 1:
        p.error("--max-concurrent must be >= 1")
    if args.interval <= 0:
        p.error("--interval must be > 0")
    if args.max_batch_size < max(BATCH_SIZES):
        p.error(f"--max-batch-size must be >= {max(BATCH_SIZES)}, the largest initial "
                "batch size searched")
    return args


def search_space(args: argparse.Namespace) -> dict[str, Any]:
    """What HyperOpt searches (lr, momentum, initial batch) and the fixed settings."""
    from ray import tune
    return {
        "lr": tune.loguniform(0.01, 0.3),
        "momentum": tune.uniform(0.5, 0.95),
        # The *initial* global batch size: autoscaling starts from it.
        "batch_size": tune.choice(BATCH_SIZES),
        # Fixed for every trial.
        "epochs": args.epochs,
        "max_batch_size": args.max_batch_size,
        "samples": args.samples,
        "seed": 0,
    }


def make_searcher(args: argparse.Namespace) -> Any:
    """HyperOptSearch behind a ConcurrencyLimiter."""
    from ray.tune.search import ConcurrencyLimiter
    from ray.tune.search.hyperopt import HyperOptSearch

    # The first trial is a known-good baseline. Half the trials are random starting
    # points, then TPE proposes the rest from the results so far; the limiter keeps as
    # many trials running as the CPUs hold at one replica each.
    searcher = HyperOptSearch(metric=METRIC, mode="max", random_state_seed=args.seed,
                              n_initial_points=max(1, args.num_samples // 2),
                              points_to_evaluate=[{"lr": 0.05, "momentum": 0.9,
                                                   "batch_size": 128}])
    return ConcurrencyLimiter(searcher, max_concurrent=args.max_concurrent)


def make_scheduler(args: argparse.Namespace) -> Any:
    """AdaptDLScheduler, over ASHA with ``--asha``."""
    from adaptdl_ray.tune import AdaptDLScheduler

    base = None
    if args.asha:
        from ray.tune.schedulers import ASHAScheduler
        base = ASHAScheduler(metric=METRIC, mode="max", time_attr="training_iteration",
                             max_t=args.epochs, grace_period=max(1, args.epochs // 8))
    return AdaptDLScheduler(base, allocation_interval_s=args.interval)


def make_reporter(args: argparse.Namespace) -> Any:
    """Tune's classic progress table with the replica, restart and batch columns."""
    from ray.tune import CLIReporter
    return CLIReporter(metric_columns=PROGRESS_COLUMNS,
                       parameter_columns={"lr": "lr", "momentum": "momentum",
                                          "batch_size": "batch0"},
                       max_report_frequency=15, print_intermediate_tables=True)


def run_sweep(args: argparse.Namespace, storage_path: str) -> tuple[Any, Any]:
    """Run the sweep; returns ``(ResultGrid, scheduler)``."""
    from ray import tune
    from ray.tune import ResultGrid

    from adaptdl_ray.tune import AdaptDLTrainableCreator

    trainable = AdaptDLTrainableCreator(train_mlp, num_cpus_per_worker=args.cpus_per_replica)
    scheduler = make_scheduler(args)
    searcher = make_searcher(args)
    # Keep each trial's best epoch (by test accuracy) and its latest.
    checkpoints = tune.CheckpointConfig(num_to_keep=1, checkpoint_score_attribute=METRIC,
                                        checkpoint_score_order="max")
    # Ray 2.60's default output engine ignores a custom reporter; the classic one shows
    # the replica and restart columns.
    reporter = make_reporter(args) if args.verbose else None
    name = "adaptdl_hyperopt"
    if args.tuner:
        tuner = tune.Tuner(
            trainable, param_space=search_space(args),
            tune_config=tune.TuneConfig(search_alg=searcher, scheduler=scheduler,
                                        num_samples=args.num_samples),
            run_config=tune.RunConfig(name=name, storage_path=storage_path,
                                      verbose=args.verbose, progress_reporter=reporter,
                                      checkpoint_config=checkpoints))
        return tuner.fit(), scheduler
    analysis = tune.run(trainable, name=name, config=search_space(args),
                        search_alg=searcher, scheduler=scheduler,
                        num_samples=args.num_samples, storage_path=storage_path,
                        verbose=args.verbose, progress_reporter=reporter,
                        checkpoint_config=checkpoints, raise_on_failed_trial=False)
    return ResultGrid(analysis), scheduler


# ---------------------------------------------------------------------------------------
# The summary
# ---------------------------------------------------------------------------------------
def read_progress(trial_dir: str) -> list[dict[str, str]]:
    """All rows of a trial's progress.csv."""
    path = os.path.join(trial_dir, "progress.csv")
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _num(value: str | None, kind: type = float) -> Any:
    try:
        return kind(float(value))
    except (TypeError, ValueError):
        return None


def trial_summary(result: Any, record: Any) -> dict[str, Any]:
    """One trial's row of the summary: its final metrics, its progress.csv and what the
    scheduler recorded about its resizes (``record``: an ``adaptdl_core.decision.JobRecord`` or ``None``)."""
    metrics = result.metrics or {}
    rows = read_progress(result.path) if result.path else []
    epochs = [_num(r.get("epoch"), int) for r in rows]
    config = {k: (result.config or {}).get(k) for k in ("lr", "momentum", "batch_size")}
    return {
        "trial_id": metrics.get("trial_id") or os.path.basename(result.path or "?"),
        "config": config,
        "final_accuracy": metrics.get(METRIC),
        "epochs": epochs,
        "replicas": [_num(r.get("adaptdl/replicas"), int) for r in rows],
        "final_batch_size": metrics.get("adaptdl/batch_size"),
        "restarts": max((_num(r.get("adaptdl/restarts"), int) or 0 for r in rows),
                        default=0),
        "resizes": list(record.resize_log) if record is not None else [],
        "not_resized": record.last_veto if record is not None else None,
        "error": None if result.error is None else str(result.error).splitlines()[0],
    }


def replicas_over_time(replicas: list[int | None]) -> str:
    """``[2, 2, 1, 1, 1]`` -> ``"2x2 1x3"`` (replicas x epochs, in order)."""
    runs: list[list] = []
    for r in replicas:
        if runs and runs[-1][0] == r:
            runs[-1][1] += 1
        else:
            runs.append([r, 1])
    return " ".join(f"{r}x{n}" for r, n in runs) or "-"


def format_table(trials: list[dict[str, Any]], best_id: str | None) -> str:
    """The per-trial summary table (``*`` marks the best trial)."""
    header = ("trial", "lr", "momentum", "batch0", "accuracy", "epochs",
              "replicas x epochs", "final batch", "restarts")
    lines = []
    for t in trials:
        c = t["config"]
        acc = t["final_accuracy"]
        lines.append((
            t["trial_id"] + (" *" if t["trial_id"] == best_id else ""),
            f"{c['lr']:.4f}" if c["lr"] is not None else "-",
            f"{c['momentum']:.3f}" if c["momentum"] is not None else "-",
            str(c["batch_size"]),
            f"{acc:.4f}" if acc is not None else "-",
            str(len(t["epochs"])), replicas_over_time(t["replicas"]),
            str(t["final_batch_size"]), str(t["restarts"])))
    widths = [max(len(h), *(len(row[i]) for row in lines)) for i, h in enumerate(header)]
    out = ["  ".join(h.ljust(w) for h, w in zip(header, widths))]
    out += ["  ".join(v.ljust(w) for v, w in zip(row, widths)) for row in lines]
    return "\n".join(out)


def resize_lines(trials: list[dict[str, Any]]) -> list[str]:
    """One line per resize: which trial, from and to how many replicas, and why; and one
    per trial whose last proposed resize did not pay, saying why."""
    lines = []
    for t in trials:
        if t["not_resized"]:
            lines.append(f"trial {t['trial_id']}: last proposed resize not made: "
                         f"{t['not_resized']}")
        for r in t["resizes"]:
            measured = r.get("measured_s")
            lines.append(f"trial {t['trial_id']}: {r['from']} -> {r['to']} replicas: "
                         f"{r['reason']}; measured cost "
                         + (f"{measured:.1f} s" if measured is not None else "not seen"))
    return lines


def load_best_model(best: Any, samples: int) -> tuple[float, float] | None:
    """Load the best trial's best checkpoint back and evaluate it on the test set.

    Returns:
        ``(accuracy measured now, accuracy the trial reported with that checkpoint)``, or
        ``None`` if the trial left no checkpoint.
    """
    checkpoint = best.get_best_checkpoint(METRIC, "max") or best.checkpoint
    if checkpoint is None:
        return None
    reported = next(m for c, m in best.best_checkpoints if c.path == checkpoint.path)[METRIC] \
        if best.best_checkpoints else best.metrics[METRIC]
    model = SetMLP()
    with checkpoint.as_directory() as d:
        model.load_state_dict(torch.load(os.path.join(d, "model.pt"), weights_only=True))
    _, test = load_mlp_datasets(samples)
    # As the trial evaluated it (one thread, batches of 1000), so that float rounding
    # cannot flip a borderline sample.
    torch.set_num_threads(1)
    model.eval()
    correct = 0
    with torch.no_grad():
        for x, y in torch.utils.data.DataLoader(test, batch_size=1000):
            correct += (model(x).argmax(dim=1) == y).sum().item()
    return correct / len(test), reported


def summarize(results: Any, scheduler: Any, wall_s: float, args: argparse.Namespace) -> dict:
    """The run's summary: every trial, its resizes, the best one and its reloaded model."""
    records = scheduler.state.jobs
    trials = sorted((trial_summary(r, records.get((r.metrics or {}).get("trial_id")))
                     for r in results), key=lambda t: t["trial_id"] or "")
    best, loaded = None, None
    if any(t["final_accuracy"] is not None for t in trials):
        best_result = results.get_best_result(metric=METRIC, mode="max")
        best = next(t for t in trials if t["trial_id"] == best_result.metrics["trial_id"])
        loaded = load_best_model(best_result, args.samples)
    return {"wall_s": round(wall_s, 1), "num_trials": len(trials), "epochs": args.epochs,
            "resizes": sum(len(t["resizes"]) for t in trials),
            "restarts": sum(t["restarts"] for t in trials),
            "errors": sum(t["error"] is not None for t in trials),
            "best": best, "best_checkpoint": None if loaded is None else
            {"accuracy_now": loaded[0], "accuracy_reported": loaded[1]},
            "trials": trials}


def main(argv: list[str] | None = None) -> int:
    """Run the sweep on a private local Ray; 0 when every trial ended well."""
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    logging.getLogger("adaptdl_ray").setLevel(
        logging.INFO if args.verbose >= 2 else logging.WARNING)
    logging.getLogger("hyperopt").setLevel(logging.WARNING)
    if args.verbose:
        # Must be set before the run starts; see run_sweep.
        os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")

    import ray

    start = time.perf_counter()
    storage_path = os.path.abspath(args.storage_path or
                                   tempfile.mkdtemp(prefix="adaptdl-hyperopt-"))
    # A private local instance (address="local": never an already running cluster), with
    # no dashboard and a small object store: checkpoints are about a megabyte.
    # Tune warns when checkpoints come faster than it snapshots the experiment; one per
    # epoch of a short trial is what this example wants.
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    ray.init(address="local", num_cpus=args.cpus, include_dashboard=False,
             object_store_memory=200 * 2**20, logging_level=logging.WARNING,
             logging_config=ray.LoggingConfig(log_level="WARNING"))
    log.info("Ray started with %d CPUs; %d trials of %d epochs, up to %d at once, "
             "re-allocation every %.0f s; results in %s", args.cpus, args.num_samples,
             args.epochs, args.max_concurrent, args.interval, storage_path)
    try:
        results, scheduler = run_sweep(args, storage_path)
        summary = summarize(results, scheduler, time.perf_counter() - start, args)
    finally:
        ray.shutdown()
        if args.storage_path is None:
            shutil.rmtree(storage_path, ignore_errors=True)

    print(f"\n{summary['num_trials']} trials in {summary['wall_s']:.0f} s, "
          f"{summary['resizes']} resizes, {summary['restarts']} restarts "
          "(* = best; replicas x epochs: how many replicas ran each stretch of epochs)")
    print(format_table(summary["trials"], summary["best"] and summary["best"]["trial_id"]))
    for line in resize_lines(summary["trials"]):
        print(line)
    for t in summary["trials"]:
        if t["error"]:
            print(f"trial {t['trial_id']} failed: {t['error']}")
    if summary["best"] is not None:
        best = summary["best"]
        print(f"best trial: {best['trial_id']} mean_accuracy={best['final_accuracy']:.4f} "
              f"config={json.dumps(best['config'])}", flush=True)
    if summary["best_checkpoint"] is not None:
        b = summary["best_checkpoint"]
        print(f"best trial's best checkpoint loaded back: test accuracy "
              f"{b['accuracy_now']:.4f} (reported with it: {b['accuracy_reported']:.4f})")
    if args.summary_json:
        with open(args.summary_json, "w") as f:
            json.dump(summary, f, indent=1)
    return 1 if summary["errors"] or summary["best"] is None else 0


if __name__ == "__main__":
    sys.exit(main())
