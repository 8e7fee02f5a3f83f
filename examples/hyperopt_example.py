"""A HyperOpt sweep on Ray Tune whose trials are elastic AdaptDL jobs, resized by goodput.

Each trial trains a small set classifier (``mlp_data.py``) on data-parallel replicas with an
autoscaled batch size and reports its accuracy per epoch, the model as its checkpoint.
``AdaptDLScheduler`` grows a trial when its measured speedup saves more than the resize costs.

    python examples/hyperopt_example.py            # 5 trials of 12 epochs (a few minutes)
    python examples/hyperopt_example.py --quick    # 3 trials of 2 epochs (what the test runs)
Options: examples/README.md; the same sweep under other schedulers: benchmarks/sweep.py.
"""

import argparse
import itertools
import logging
import os
import shutil
import sys
import tempfile
import time

import torch

import adaptdl_core.torch as adl
from adaptdl_core.decision.resize_cost import describe_resize

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # however it is started
from digits_data import evaluate, train_epoch  # noqa: E402  (generic classification loops)
from mlp_data import SetMLP, load_mlp_datasets  # noqa: E402

METRIC = "mean_accuracy"


def train_mlp(config: dict) -> None:
    """One trial, run by every replica (rank 0's reports reach Tune): ``lr``, ``momentum``,
    ``batch_size`` (the initial global batch), ``epochs`` and ``samples`` (data set size)."""
    from ray import tune

    torch.manual_seed(0)
    adl.init_process_group("gloo")
    train_set, test_set = load_mlp_datasets(config["samples"])
    model = SetMLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=config["momentum"])
    lr_scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=config["epochs"])
    model = adl.AdaptiveDataParallel(model, optimizer, lr_scheduler)  # restored after a restart
    train_loader = adl.AdaptiveDataLoader(train_set, batch_size=config["batch_size"],
                                          shuffle=True, drop_last=True)
    train_loader.autoscale_batch_size(1024)  # from batch_size up to 1024, by goodput
    test_loader = adl.AdaptiveDataLoader(test_set, batch_size=1000)
    accum = adl.Accumulator()  # sums over the replicas (and across restarts)
    for epoch in adl.remaining_epochs_until(config["epochs"]):  # resumes at the same sample
        train_epoch(model, optimizer, train_loader, accum)
        evaluate(model, test_loader, accum)
        with accum.synchronized():
            metrics = {METRIC: accum["correct"] / accum["test_n"], "epoch": epoch,
                       "train_loss": accum["train_loss"] / max(accum["train_n"], 1)}
            accum.clear()
        with tempfile.TemporaryDirectory() as d:  # read at once: the folder may go after
            torch.save(model.module.state_dict(), os.path.join(d, "model.pt"))
            tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(d))
        lr_scheduler.step()  # at the end of the body: code before the loop reruns on restart


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (``--quick``: the test-sized run)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--num-samples", type=int, default=5, help="trials (default 5)")
    p.add_argument("--epochs", type=int, default=12, help="epochs per trial (default 12)")
    p.add_argument("--cpus", type=int, default=os.cpu_count() or 1,
                   help="CPUs of the local Ray (default: this machine's); one per replica")
    p.add_argument("--quick", action="store_true", help="3 trials of 2 epochs on 4000 samples")
    p.add_argument("--storage-path", help="keep Tune's results there (default: a temporary "
                                          "folder, removed at the end)")
    p.add_argument("--verbose", type=int, default=1, choices=(0, 1, 2),
                   help="0: summary only; 1: progress table; 2: also every result")
    args = p.parse_args(argv)
    if args.quick:
        args.num_samples, args.epochs = 3, 2
    for name in ("num_samples", "epochs", "cpus"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, not {getattr(args, name)}")
    return args


def run_sweep(args: argparse.Namespace, storage_path: str):
    """HyperOpt proposes the trials, AdaptDLScheduler sizes them: ``(ResultGrid, scheduler)``."""
    from ray import tune
    from ray.tune.search import ConcurrencyLimiter
    from ray.tune.search.hyperopt import HyperOptSearch

    from adaptdl_ray.tune import PROGRESS_COLUMNS, AdaptDLScheduler, AdaptDLTrainableCreator

    space = {"lr": tune.loguniform(0.01, 0.3), "momentum": tune.uniform(0.5, 0.95),
             "batch_size": tune.choice([64, 128, 256]),  # the initial batch; autoscaled
             "epochs": args.epochs, "samples": 4000 if args.quick else 20_000}
    # A known-good first trial, then random points for half the trials, then TPE.
    searcher = HyperOptSearch(metric=METRIC, mode="max", random_state_seed=0,
                              n_initial_points=max(1, args.num_samples // 2),
                              points_to_evaluate=[{"lr": 0.05, "momentum": 0.9,
                                                   "batch_size": 128}])
    # FIFO decides which trials stop (AdaptDLScheduler(ASHAScheduler(...)) stops early);
    # AdaptDLScheduler decides their replicas, re-deciding every 10 s.
    scheduler = AdaptDLScheduler(allocation_interval_s=10)
    # One report per epoch: Tune's iteration count is the epochs trained, the summary's
    # count too (adaptdl/epochs_done, the epochs finished before a report, lags by one).
    columns = {"training_iteration": "epochs", METRIC: "acc",
               **{k: v for k, v in PROGRESS_COLUMNS.items() if v != "epochs"}}
    reporter = tune.CLIReporter(metric_columns=columns, max_report_frequency=15,
                                parameter_columns=["lr", "momentum", "batch_size"])
    tuner = tune.Tuner(
        AdaptDLTrainableCreator(train_mlp), param_space=space,
        tune_config=tune.TuneConfig(search_alg=ConcurrencyLimiter(searcher, args.cpus),
                                    scheduler=scheduler, num_samples=args.num_samples),
        run_config=tune.RunConfig(
            name="adaptdl_hyperopt", storage_path=storage_path, verbose=args.verbose,
            progress_reporter=reporter if args.verbose else None,
            checkpoint_config=tune.CheckpointConfig(  # each trial's best epoch, and its latest
                num_to_keep=1, checkpoint_score_attribute=METRIC, checkpoint_score_order="max")))
    return tuner.fit(), scheduler


def print_summary(results, scheduler, wall_s: float):
    """A line per trial, per resize, unmade resize and failure; the best ``Result`` or None."""
    import pandas

    best = max((r for r in results if METRIC in (r.metrics or {})),
               key=lambda r: r.metrics[METRIC], default=None)
    rows, notes = [], []
    for r in sorted(results, key=lambda r: r.path):
        m, reports = r.metrics or {}, r.metrics_dataframe  # the last report; every report
        trial_id = m.get("trial_id", os.path.basename(r.path))
        replicas = [] if reports is None else list(reports["adaptdl/replicas"])
        stretches = [f"{n}x{len(list(run))}" for n, run in itertools.groupby(replicas)]
        rows.append({"trial": trial_id + (" *" if r is best else ""),
                     **{k: r.config[k] for k in ("lr", "momentum", "batch_size")},
                     "accuracy": m.get(METRIC), "epochs": m.get("training_iteration", 0),
                     "replicas x epochs": " ".join(stretches) or "-",
                     "final batch": m.get("adaptdl/batch_size"),
                     "restarts": m.get("adaptdl/restarts", 0)})
        record = scheduler.state.jobs.get(trial_id)  # what the scheduler did, and why
        notes += [describe_resize(trial_id, e, "trial") for e in getattr(record, "resize_log", [])]
        if record and record.last_veto:
            notes.append(f"trial {trial_id}: last proposed resize not made: {record.last_veto}")
        if r.error is not None:
            notes.append(f"trial {trial_id} failed: {str(r.error).splitlines()[0]}")
    print(f"\n{len(rows)} trials in {wall_s:.0f} s (* = best; replicas x epochs: how many "
          "replicas ran each stretch of epochs)")
    print(pandas.DataFrame(rows).to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    for note in notes:
        print(note)
    return best


def load_best(result) -> tuple[float, float]:
    """A trial's best checkpoint loaded into a fresh model and scored on the test set:
    ``(accuracy now, accuracy the trial reported with it)``."""
    checkpoint = result.get_best_checkpoint(METRIC, "max")
    reported = next(m[METRIC] for c, m in result.best_checkpoints if c.path == checkpoint.path)
    model = SetMLP().eval()
    with checkpoint.as_directory() as d:
        model.load_state_dict(torch.load(os.path.join(d, "model.pt"), weights_only=True))
    test_set = load_mlp_datasets(result.config["samples"])[1]
    torch.set_num_threads(1)  # batches of 1000 on one thread, as the trial scored them
    with torch.no_grad():
        correct = sum((model(x).argmax(dim=1) == y).sum().item()
                      for x, y in torch.utils.data.DataLoader(test_set, batch_size=1000))
    return correct / len(test_set), reported


def main(argv: list[str] | None = None) -> int:
    """Run the sweep on a private local Ray and print its summary; 0 when no trial failed."""
    args = parse_args(argv)
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # the classic table shows our columns
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    import ray

    start = time.perf_counter()
    storage = os.path.abspath(args.storage_path or tempfile.mkdtemp(prefix="adaptdl-hyperopt-"))
    # address="local": a private instance, never a running cluster; checkpoints are ~1 MB.
    ray.init(address="local", num_cpus=args.cpus, include_dashboard=False,
             object_store_memory=200 * 2**20, logging_level=logging.WARNING,
             logging_config=ray.LoggingConfig(log_level="WARNING"))
    try:
        results, scheduler = run_sweep(args, storage)
        best = print_summary(results, scheduler, time.perf_counter() - start)
        loaded = load_best(best) if best else None
    finally:
        ray.shutdown()
        if args.storage_path is None:
            shutil.rmtree(storage, ignore_errors=True)
    if best:
        print(f"best trial: {best.metrics['trial_id']} {METRIC}={best.metrics[METRIC]:.4f} "
              f"lr={best.config['lr']:.4f} momentum={best.config['momentum']:.3f} "
              f"batch_size={best.config['batch_size']}")
        print(f"best trial's best checkpoint loaded back: test accuracy {loaded[0]:.4f} "
              f"(reported with it: {loaded[1]:.4f})")
    return 0 if best and not results.errors else 1


if __name__ == "__main__":
    sys.exit(main())
