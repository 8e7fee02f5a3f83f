"""Sweep makespan: the same HyperOpt sweep under four ways of sharing the CPUs.

One fixed list of trial configurations (sampled once from a HyperOpt space with a fixed
seed) is trained on scikit-learn's digits (the DigitsCNN of ``examples/``) under

1. ``fifo``: FIFO, 1 replica per trial at the user's batch size (static);
2. ``rcs``: Ray's ``ResourceChangingScheduler(DistributeResources(add_bundles=True))``
   around FIFO (free CPUs become extra bundles = extra replicas of our trainable);
3. ``adaptdl``: ``AdaptDLScheduler``, fixed batch size (replica adaptation only);
4. ``adaptdl+bsz``: ``AdaptDLScheduler`` with batch-size autoscaling (the full system).

Every arm uses ``AdaptDLTrainableCreator`` and the same trial list, at most ``--cpus``
trials at once, on a local Ray instance with the machine's real CPUs (one torch thread
per replica). Each arm runs in its own child process (its own Ray instance), back to back,
in an order that alternates between repetitions; ratios are to arm 1 of the same
repetition.

    python benchmarks/sweep.py --quick     # < 10 min on 2 cores
    python benchmarks/sweep.py             # < 1 hour on 2 cores
    python benchmarks/sweep.py --from-json benchmarks/results/sweep.json   # tables again
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import ROOT, machine_description, markdown_table  # noqa: E402
import _tune_common as tc  # noqa: E402

LOG = logging.getLogger("sweep")

ARMS = {
    1: ("fifo", "FIFO, 1 replica per trial (static)"),
    2: ("rcs", "ResourceChangingScheduler + DistributeResources(add_bundles=True)"),
    3: ("adaptdl", "AdaptDLScheduler, fixed batch size"),
    4: ("adaptdl+bsz", "AdaptDLScheduler + batch-size autoscaling"),
}


# ---------------------------------------------------------------------------------------
# The trial list
# ---------------------------------------------------------------------------------------
def sample_configs(n: int, seed: int) -> list[dict[str, Any]]:
    """``n`` configurations drawn once from a HyperOpt space (the space of
    ``examples/hyperopt_example.py``) with a fixed seed: the same list for every arm.

    (TPE's later proposals depend on the results seen, which differ between arms, so the
    arms share HyperOpt's seeded samples rather than a live adaptive search.)
    """
    import numpy as np
    from hyperopt import hp
    from hyperopt.pyll import stochastic

    space = {"lr": hp.loguniform("lr", np.log(0.005), np.log(0.3)),
             "momentum": hp.uniform("momentum", 0.5, 0.99),
             "batch_size": hp.choice("batch_size", [32, 64, 128])}
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        c = stochastic.sample(space, rng=rng)
        out.append({"lr": round(float(c["lr"]), 5), "momentum": round(float(c["momentum"]), 4),
                    "batch_size": int(c["batch_size"])})
    return out


# ---------------------------------------------------------------------------------------
# One arm (child process)
# ---------------------------------------------------------------------------------------
def run_arm(arm: int, spec: dict[str, Any]) -> dict[str, Any]:
    """Run one arm's sweep in this process (its own Ray instance); returns its record."""
    subreaper = tc.become_subreaper()
    from ray import tune
    from ray.tune.schedulers import FIFOScheduler, ResourceChangingScheduler
    from ray.tune.schedulers.resource_changing_scheduler import DistributeResources
    from ray.tune.search import BasicVariantGenerator

    from adaptdl_ray.tune import AdaptDLScheduler, AdaptDLTrainableCreator

    cpus = spec["cpus"]
    tc.init_ray(cpus)
    configs = spec["configs"]
    base = {"epochs": spec["epochs"], "report_every": spec["report_every"], "seed": 0,
            "max_batch_size": spec["max_batch_size"] if arm == 4 else 0,
            # The fixed list, in the same order for every arm (a grid over the sampled
            # configurations: BasicVariantGenerator's points_to_evaluate needs the keys
            # in the space).
            "hp": tune.grid_search(configs)}
    if arm == 1:
        trainable = AdaptDLTrainableCreator(tc.train_digits, max_replicas=1)
        scheduler = FIFOScheduler()
    elif arm == 2:
        trainable = AdaptDLTrainableCreator(tc.train_digits)
        scheduler = ResourceChangingScheduler(
            base_scheduler=FIFOScheduler(),
            resources_allocation_function=DistributeResources(add_bundles=True))
    else:
        trainable = AdaptDLTrainableCreator(tc.train_digits)
        scheduler = AdaptDLScheduler(allocation_interval_s=spec["interval"])
    recorder = tc.make_recorder()
    storage = tempfile.mkdtemp(prefix=f"sweep-arm{arm}-")
    t0 = time.time()
    recorder.t0 = t0
    analysis = tune.run(
        trainable, name=f"arm{arm}", config=base,
        search_alg=BasicVariantGenerator(max_concurrent=cpus), scheduler=scheduler, metric=tc.METRIC, mode="max",
        storage_path=storage, verbose=0, reuse_actors=False, raise_on_failed_trial=False,
        callbacks=[recorder])
    makespan = time.time() - t0
    statuses = [t.status for t in analysis.trials]
    # The whole process tree of this arm (driver, Ray daemons, all trial and replica
    # actors, finished ones included), from Ray's start to the end of the sweep.
    recorder.cpu.sample(force=True)
    cpu_s = recorder.cpu.cpu_s
    import ray
    ray.shutdown()
    reaped = tc.reap_children() if subreaper else 0
    import shutil
    shutil.rmtree(storage, ignore_errors=True)
    return {"arm": arm, "makespan_s": makespan, "statuses": statuses, "cpu_s": cpu_s,
            "trials": recorder.trials, "subreaper": subreaper, "reaped": reaped}


# ---------------------------------------------------------------------------------------
# Summaries
# ---------------------------------------------------------------------------------------
def summarize_arm(rec: dict[str, Any]) -> dict[str, Any]:
    trials = list(rec["trials"].values())
    finals = sorted((t["results"][-1][tc.METRIC] for t in trials
                     if t["results"] and t["results"][-1][tc.METRIC] is not None),
                    reverse=True)
    ends = [t["end"] for t in trials if t["end"] is not None]
    runs = [t["end"] - t["start"] for t in trials if t["end"] is not None and t["start"]]
    resize_total = [sum(r[k] for k in tc.RESIZE_PHASES) for t in trials for r in t["resizes"]]
    restarts = sum(max([r["restarts"] or 0 for r in t["results"]] or [0]) for t in trials)
    # Replica-seconds held (integral of the replicas a RUNNING trial held over time).
    held = 0.0
    for t in trials:
        tl = t["timeline"]
        held += sum(n * (tl[i + 1][0] - tl[i][0]) for i, (_, n) in enumerate(tl[:-1]))
    return {
        "makespan_s": rec["makespan_s"],
        "mean_completion_s": statistics.mean(ends) if ends else float("nan"),
        "mean_trial_run_s": statistics.mean(runs) if runs else float("nan"),
        "best": finals[0] if finals else float("nan"),
        "top3": statistics.mean(finals[:3]) if finals else float("nan"),
        "resizes": restarts,
        "resizes_measured": len(resize_total),
        "resize_s": sum(resize_total),
        "resize_share": sum(resize_total) / sum(runs) if runs else float("nan"),
        "cpu_s": rec.get("cpu_s", float("nan")),
        "replica_s": held,
        "errors": sum(s != "TERMINATED" for s in rec["statuses"]),
        "max_replicas": max((n for t in trials for _, n in t["timeline"]), default=0),
        "batch_sizes": sorted({r["batch_size"] for t in trials for r in t["results"]
                               if r["batch_size"]}),
    }


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "-"


def report(data: dict[str, Any]) -> str:
    reps = data["repetitions"]
    out = [f"Machine: {data['machine']}",
           f"{len(data['configs'])} trials x {data['epochs']} epochs (report every "
           f"{data['report_every']}), {data['cpus']} CPUs, at most {data['cpus']} trials at "
           f"once, AdaptDL interval {data['interval']} s, autoscale cap "
           f"{data['max_batch_size']}; {len(reps)} repetition(s); total "
           f"{data['total_s']:.0f} s", ""]
    header = ["rep", "arm", "makespan s", "vs arm 1", "mean completion s", "vs arm 1",
              "mean trial run s", "best acc", "top-3 acc", "resizes", "resize s",
              "resize / trial time", "CPU-s (measured)", "vs arm 1", "replica-s held",
              "errors"]
    rows = []
    for i, rep in enumerate(reps):
        s1 = rep["arms"].get("1", next(iter(rep["arms"].values())))["summary"]
        for arm in sorted(rep["arms"], key=int):
            s = rep["arms"][arm]["summary"]
            rows.append([i + 1, f"{arm} {ARMS[int(arm)][0]}", f"{s['makespan_s']:.0f}",
                         _ratio(s["makespan_s"], s1["makespan_s"]),
                         f"{s['mean_completion_s']:.0f}",
                         _ratio(s["mean_completion_s"], s1["mean_completion_s"]),
                         f"{s['mean_trial_run_s']:.1f}", f"{s['best']:.4f}",
                         f"{s['top3']:.4f}", s["resizes"], f"{s['resize_s']:.1f}",
                         f"{100 * s['resize_share']:.1f}%", f"{s['cpu_s']:.0f}",
                         _ratio(s["cpu_s"], s1["cpu_s"]), f"{s['replica_s']:.0f}",
                         s["errors"]])
    out.append(markdown_table(header, rows))
    if not all(str(a) in reps[0]["arms"] for a in (1, 2, 4)):
        return "\n".join(out)
    # Targets, on the median ratios over repetitions.
    def med(arm: int, key: str, base: int = 1) -> float:
        return statistics.median(r["arms"][str(arm)]["summary"][key] /
                                 r["arms"][str(base)]["summary"][key] for r in reps)
    acc_gap = statistics.median(r["arms"]["1"]["summary"]["best"] -
                                r["arms"]["4"]["summary"]["best"] for r in reps)
    share = statistics.median(r["arms"]["4"]["summary"]["resize_share"] for r in reps)
    m41, m42 = med(4, "makespan_s"), med(4, "makespan_s", 2)
    out += ["", markdown_table(["target", "measured (median over repetitions)", "met?"], [
        ["arm 4 makespan <= 0.75x arm 1", f"{m41:.2f}x", "yes" if m41 <= 0.75 else
         f"no (+{100 * (m41 - 0.75):.0f} pts)"],
        ["arm 4 makespan <= 0.9x arm 2", f"{m42:.2f}x", "yes" if m42 <= 0.9 else
         f"no (+{100 * (m42 - 0.9):.0f} pts)"],
        ["arm 4 best accuracy within 1 point of arm 1", f"{-100 * acc_gap:+.2f} pts",
         "yes" if acc_gap <= 0.01 else "no"],
        ["arm 4 resize time <= 10% of trial time", f"{100 * share:.1f}%",
         "yes" if share <= 0.10 else "no"]])]
    out.append("")
    out.append("Per arm (last repetition): largest replica count a trial held; batch sizes "
               "reported:")
    for arm, a in sorted(reps[-1]["arms"].items(), key=lambda kv: int(kv[0])):
        s = a["summary"]
        out.append(f"- arm {arm} {ARMS[int(arm)][0]}: max replicas {s['max_replicas']}, "
                   f"batch sizes {s['batch_sizes'][:12]}")
    return "\n".join(out)


def plot(data: dict[str, Any], path: Path) -> str | None:
    """Replicas held by each trial over time, arms 2-4 of the last repetition."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        LOG.warning("matplotlib not installed: no plot")
        return None
    rep = data["repetitions"][-1]
    fig, axes = plt.subplots(3, 1, figsize=(10, 8), sharex=True)
    for ax, arm in zip(axes, (2, 3, 4)):
        a = rep["arms"][str(arm)]
        trials = sorted(a["trials"].values(), key=lambda t: t["start"] or 0)
        for i, t in enumerate(trials):
            tl = t["timeline"]
            xs, ys = [], []
            for (x0, n), (x1, _) in zip(tl, tl[1:] + [[tl[-1][0], 0]]):
                xs += [x0, x1]
                ys += [n, n]
            ax.plot(xs, [y + 0.04 * i for y in ys], lw=1.5, label=f"trial {i}")
        ax.set_ylabel("replicas")
        ax.set_title(f"arm {arm}: {ARMS[arm][1]} (makespan "
                     f"{a['summary']['makespan_s']:.0f} s)", fontsize=9)
        ax.set_yticks(range(0, data["cpus"] + 1))
    axes[-1].set_xlabel("seconds since the sweep started")
    axes[0].legend(fontsize=6, ncol=6, loc="upper right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return str(path)


# ---------------------------------------------------------------------------------------
# Orchestration
# ---------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="4 trials x 45 epochs, 1 repetition (< 10 min on 2 cores)")
    p.add_argument("--trials", type=int, default=None, help="trials (default 9; quick 4)")
    p.add_argument("--epochs", type=int, default=None,
                   help="epochs per trial (default 200; quick 45)")
    p.add_argument("--report-every", type=int, default=None,
                   help="epochs between reports (default 5; quick 3)")
    p.add_argument("--repeats", type=int, default=1,
                   help="repetitions of all arms (order alternates; default 1)")
    p.add_argument("--arms", default="1,2,3,4", help="arms to run (default 1,2,3,4)")
    p.add_argument("--cpus", type=int, default=os.cpu_count() or 1,
                   help="CPUs of the Ray instance = trials at once (default: this machine's)")
    p.add_argument("--interval", type=float, default=10.0,
                   help="AdaptDLScheduler allocation_interval_s (default 10)")
    p.add_argument("--max-batch-size", type=int, default=512,
                   help="autoscale cap in arm 4 (default 512, as in the example)")
    p.add_argument("--seed", type=int, default=0, help="seed of the configurations")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results"),
                   help="directory for sweep.json and sweep_replicas.png")
    p.add_argument("--from-json", default=None, help="print the tables of a saved run")
    p.add_argument("--run-arm", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--spec", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    quick = args.quick
    args.trials = args.trials or (4 if quick else 9)
    args.epochs = args.epochs or (45 if quick else 200)
    args.report_every = args.report_every or (3 if quick else 5)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    if args.run_arm is not None:  # child: one arm
        logging.getLogger("adaptdl_ray").setLevel(logging.WARNING)
        with open(args.spec) as f:
            spec = json.load(f)
        rec = run_arm(args.run_arm, spec)
        with open(spec["result_path"], "w") as f:
            json.dump(rec, f)
        return 0
    out = Path(args.out)
    if args.from_json:
        with open(args.from_json) as f:
            data = json.load(f)
        print(report(data))
        return 0

    arms = [int(a) for a in args.arms.split(",")]
    configs = sample_configs(args.trials, args.seed)
    data = {"machine": machine_description(), "configs": configs, "epochs": args.epochs,
            "report_every": args.report_every, "cpus": args.cpus, "interval": args.interval,
            "max_batch_size": args.max_batch_size, "repetitions": []}
    LOG.info("configurations: %s", configs)
    start = time.time()
    tmp = tempfile.mkdtemp(prefix="sweep-")
    for rep in range(args.repeats):
        order = list(arms)
        if rep % 2 == 1:
            order.reverse()
        if rep >= 2:
            random.Random(rep).shuffle(order)
        record: dict[str, Any] = {"order": order, "arms": {}}
        for arm in order:
            spec_path = os.path.join(tmp, f"spec-{rep}-{arm}.json")
            result_path = os.path.join(tmp, f"result-{rep}-{arm}.json")
            with open(spec_path, "w") as f:
                json.dump({"configs": configs, "epochs": args.epochs, "cpus": args.cpus,
                           "report_every": args.report_every, "interval": args.interval,
                           "max_batch_size": args.max_batch_size,
                           "result_path": result_path}, f)
            LOG.info("repetition %d, arm %d (%s)", rep + 1, arm, ARMS[arm][1])
            cpu0, t0 = tc.children_cpu_s(), time.time()
            proc = subprocess.run([sys.executable, os.path.abspath(__file__),
                                   "--run-arm", str(arm), "--spec", spec_path],
                                  cwd=str(ROOT), stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)
            cpu_rusage, wall = tc.children_cpu_s() - cpu0, time.time() - t0
            if proc.returncode != 0 or not os.path.exists(result_path):
                raise RuntimeError(f"arm {arm} failed (status {proc.returncode}):\n"
                                   + proc.stdout[-5000:])
            with open(result_path) as f:
                rec = json.load(f)
            # rec["cpu_s"]: the arm's process tree sampled from /proc during the sweep;
            # cpu_rusage: what getrusage sees of the arm's child process (misses the
            # processes Ray's daemons did not wait for), kept for comparison.
            rec["cpu_rusage_s"], rec["wall_s"] = cpu_rusage, wall
            rec["summary"] = summarize_arm(rec)
            record["arms"][str(arm)] = rec
            LOG.info("arm %d: makespan %.0f s, CPU %.0f s, best %.4f, %d resizes",
                     arm, rec["makespan_s"], rec["cpu_s"], rec["summary"]["best"],
                     rec["summary"]["resizes"])
        data["repetitions"].append(record)
    data["total_s"] = time.time() - start
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "sweep.json", "w") as f:
        json.dump(data, f)
    print(report(data))
    if all(str(a) in data["repetitions"][-1]["arms"] for a in (2, 3, 4)):
        path = plot(data, out / "sweep_replicas.png")
        if path:
            print(f"\nplot: {path}")
    print(f"raw data: {out / 'sweep.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
