"""Two sweeps on one cluster: with the cluster allocator, and each experiment dividing alone.

Two Tune experiments (each ``--trials`` AdaptDL trials of a tiny regression whose step time
shrinks with more replicas, less than in proportion: each step sleeps ``--sleep-per-step``
seconds plus ``--sleep-per-sample`` per sample of the replica's batch, so the fake CPUs of
a small machine behave as a cluster's would; each experiment's first trial runs
``--long-epochs``, the others ``--epochs``) are started
at the same time by two driver processes on one local Ray cluster of ``--cpus`` logical
CPUs (``ray start --head``, its own for each run). Arms:

* ``shared``: ``AdaptDLScheduler()`` (the default): both experiments' trials are sized by
  the cluster allocator, one solve over every trial on the cluster;
* ``alone``: ``AdaptDLScheduler(cluster_allocator=False)``: each experiment divides the
  whole cluster among its own trials (their plans overlap).

Reported per run: the makespan (first driver's start to the last one's end), each
experiment's wall time, resizes, every trial's exactly-once check (every sample of every
epoch trained once across its resizes), and for ``shared`` the largest total of replicas
the allocator ever gave at once against the CPUs. Arms alternate in order across
repetitions; ratios are taken within a repetition.

    python benchmarks/shared_cluster.py                 # 1 repetition, about 6 min on 2 cores
    python benchmarks/shared_cluster.py --reps 3
    python benchmarks/shared_cluster.py --from-json benchmarks/results/shared_cluster.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import machine_description, markdown_table  # noqa: E402
from tests.ray.local_cluster import LocalCluster, cluster_env  # noqa: E402
from tests.ray.shared_run import (ARMS, exactly_once, peak_replicas,  # noqa: E402
                                  shape_arguments, shape_argv)

DRIVER = os.path.join(ROOT, "tests", "ray", "shared_run.py")


# -- one run of both experiments ------------------------------------------------------------
def run_arm(arm: str, args: argparse.Namespace, work: str) -> dict[str, Any]:
    """Both experiments at once on a fresh cluster; returns the run's record."""
    with LocalCluster(num_cpus=args.cpus, env=cluster_env()) as cluster:
        procs, outs = [], []
        for name in ("sweep-a", "sweep-b"):
            out = os.path.join(work, f"{arm}-{name}.json")
            records = os.path.join(work, f"{arm}-{name}-records")
            os.makedirs(records, exist_ok=True)
            cmd = [sys.executable, DRIVER, "--arm", arm, "--address", cluster.gcs_address,
                   "--name", name, "--out", out, "--record-dir", records,
                   "--storage", os.path.join(work, "storage"), *shape_argv(args)]
            procs.append(subprocess.Popen(cmd, env=cluster_env(),
                                          stdout=subprocess.DEVNULL,
                                          stderr=open(out + ".log", "w")))
            outs.append((out, records))
        codes = [p.wait(timeout=args.timeout) for p in procs]
        drivers = []
        for (out, records), code in zip(outs, codes):
            rec = json.load(open(out)) if code == 0 and os.path.exists(out) else \
                {"error": f"driver exited {code}; see {out}.log"}
            rec["exactly_once"] = exactly_once(records, args)
            drivers.append(rec)
        peak = _peak_shared_target(cluster.gcs_address) if arm == "shared" else None
    ok = all("error" not in d for d in drivers)
    return {"arm": arm, "drivers": drivers, "peak_target": peak,
            "makespan_s": (max(d["end"] for d in drivers) - min(d["start"] for d in drivers))
            if ok else None}


def _peak_shared_target(address: str) -> int | None:
    """The largest total of replicas the allocator gave at one time (from its history)."""
    code = ("import json, ray; from adaptdl_ray.cluster import client; "
            f"ray.init(address={address!r}, log_to_driver=False); "
            "h = client.get_allocator(); "
            "print(json.dumps(ray.get(h.history.remote()) if h else None))")
    out = subprocess.run([sys.executable, "-c", code], env=cluster_env(),
                         capture_output=True, text=True, timeout=120)
    try:
        history = json.loads(out.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return None
    return peak_replicas(history) if history else None


# -- the report ---------------------------------------------------------------------------
def report(data: dict[str, Any]) -> str:
    """Markdown tables of every run and the ratio shared / alone per repetition."""
    rows, ratios = [], []
    for rep in data["reps"]:
        by_arm = {run["arm"]: run for run in rep}
        for run in rep:
            walls = ", ".join(f"{d.get('name')}: {d['wall_s']:.0f} s" if "wall_s" in d
                              else d.get("error", "?") for d in run["drivers"])
            rows.append([run["arm"], f"{run['makespan_s']:.1f}" if run["makespan_s"] else "-",
                         walls, sum(d.get("resizes", 0) for d in run["drivers"]),
                         " / ".join(str(d["exactly_once"]) for d in run["drivers"]),
                         run["peak_target"] if run["peak_target"] is not None else "-"])
        if all(by_arm.get(a, {}).get("makespan_s") for a in ARMS):
            ratios.append(by_arm["shared"]["makespan_s"] / by_arm["alone"]["makespan_s"])
    text = markdown_table(["arm", "makespan (s)", "experiments", "resizes",
                           "exactly once (a / b)", "peak replicas given"], rows)
    if ratios:
        text += "\n\nshared / alone makespan per repetition: " + \
            ", ".join(f"{r:.3f}" for r in ratios)
    return f"{data['machine']}\n{data['shape']}\n\n{text}\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    shape_arguments(p)
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--arms", default=",".join(ARMS))
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per driver")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results",
                                                  "shared_cluster.json"))
    p.add_argument("--from-json", help="print the tables of an earlier run")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.from_json:
        print(report(json.load(open(args.from_json))))
        return 0
    arms = [a for a in args.arms.split(",") if a]
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        raise SystemExit(f"--arms: unknown {unknown}; choose from {list(ARMS)}")
    data = {"machine": machine_description(),
            "shape": (f"{args.cpus} CPUs; 2 experiments x {args.trials} trials (the first "
                      f"{args.long_epochs} epochs, the others {args.epochs}) of {args.size} "
                      f"samples, batch {args.batch_size}, {args.sleep_per_step} s per step + "
                      f"{args.sleep_per_sample} s per sample per replica; allocation "
                      f"interval {args.interval} s"), "reps": []}
    for rep in range(args.reps):
        order = arms if rep % 2 == 0 else arms[::-1]
        with tempfile.TemporaryDirectory(prefix="shared-cluster-") as work:
            data["reps"].append([run_arm(arm, args, work) for arm in order])
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(data, f, indent=1)
    print(report(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
