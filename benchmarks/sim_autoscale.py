"""Autoscaling and spot preemptions in the trace-driven simulator.

Two experiments, each a set of ``adaptdl_core.sim.cluster.simulate`` runs under Pollux (the
decision core), 4-GPU nodes, 60-s rounds, 30-s restarts, with the elastic cluster of
:mod:`adaptdl_core.sim.autoscale`:

(a) **ImageNet alone** (the Pollux paper's cloud autoscaling experiment, section 5.4): one
    ImageNet (ResNet-50) job submitted at 0, autoscaled between ``--min-nodes`` and
    ``--max-nodes`` by the goodput rule and by the throughput rule (statistical efficiency
    taken as 1); node-hours and completion time, and the ratios goodput / throughput
    (paper: 0.75x the node-hours at 1.06x the completion time). A fixed cluster of
    ``--max-nodes`` nodes is shown for reference.
(b) **The load-1.0 workloads** (160 jobs each, ``--workloads``): a fixed cluster of
    ``--fixed-nodes`` nodes against the goodput-autoscaled one (node-hours, average JCT,
    makespan), and the fixed cluster with spot preemptions (``--preemptions-per-node-hour``,
    default 0.1 = 1 per 10 node-hours, ``--preemption-notice-s`` 60) against none: the
    ratio of average JCTs (over ``--seeds`` seeds of the preemption times). With
    ``--preempt-autoscaled`` the autoscaled cluster is also run with preemptions.

Node-hours count every node from its request to its removal or the last job's end, from
time 0; a fixed cluster's are its nodes times the last completion. Prints markdown tables
and writes every result to ``--out`` (default ``benchmarks/results/sim_autoscale.json``;
each run, as it finishes, also to the same path with suffix ``.partial.jsonl``).

Usage (heavy: each 160-job run takes minutes; wrap in ``nice``)::

    python benchmarks/sim_autoscale.py --imagenet-only
    python benchmarks/sim_autoscale.py --workloads 1 2 --skip-imagenet
    python benchmarks/sim_autoscale.py --jobs 2              # everything, 2 processes
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from adaptdl_core.sim.autoscale import ElasticSettings  # noqa: E402
from adaptdl_core.sim.cluster import WorkloadJob, simulate  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
IMAGENET = [WorkloadJob("imagenet-0", 0.0, "imagenet", 16, 3200)]


def _run(task: dict) -> dict:
    """One simulation (a picklable task: its label and simulate's arguments)."""
    workload = IMAGENET if task["workload"] == "imagenet" else task["workload"]
    elastic = ElasticSettings(**task["elastic"])
    r = simulate(workload, "pollux", nodes=task["nodes"], seed=task.get("seed", 0),
                 max_time=task.get("max_time"), elastic=elastic)
    r["label"], r["task"] = task["label"], task
    return r


def _done(r: dict, partial: Path) -> dict:
    """Logs one finished run and appends it to ``partial`` (one JSON object a line), so
    that a long run's finished parts survive an interruption."""
    print(f"done: {r['label']} {r['workload']} seed {r['task'].get('seed', 0)}: avg JCT "
          f"{r['avg_jct']:.0f} s, makespan {r['makespan']:.0f} s, {r['node_hours']:.2f} "
          f"node-h, {r['preemptions']} preemptions, wall {r['wall_s']:.0f} s", flush=True)
    with open(partial, "a", encoding="utf-8") as f:
        f.write(json.dumps(r) + "\n")
    return r


def _map(tasks, jobs, partial: Path):
    if jobs == 1:
        return [_done(_run(t), partial) for t in tasks]
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(_run, t) for t in tasks]
        for future in as_completed(futures):
            _done(future.result(), partial)
        return [f.result() for f in futures]


def imagenet_tasks(args) -> list:
    """The ImageNet runs: each rule, and the fixed cluster."""
    common = dict(node_startup_s=args.node_startup_s, upper=args.upper, lower=args.lower)
    out = [{"label": rule, "workload": "imagenet", "nodes": args.max_nodes,
            "elastic": dict(autoscale=True, min_nodes=args.min_nodes,
                            max_nodes=args.max_nodes, rule=rule,
                            autoscale_every=args.autoscale_every, **common)}
           for rule in ("goodput", "throughput")]
    out.append({"label": f"fixed-{args.max_nodes}", "workload": "imagenet",
                "nodes": args.max_nodes, "elastic": {}})
    return out


def workload_tasks(args) -> list:
    """The load-1.0 runs: fixed, autoscaled, and with preemptions (per seed)."""
    out = []
    spot = dict(preemptions_per_node_hour=args.preemptions_per_node_hour,
                preemption_notice_s=args.preemption_notice_s,
                node_startup_s=args.node_startup_s)
    auto = dict(autoscale=True, min_nodes=args.min_nodes, max_nodes=args.max_nodes,
                rule="goodput", autoscale_every=args.autoscale_every,
                node_startup_s=args.node_startup_s, upper=args.upper, lower=args.lower)
    for w in args.workloads:
        name = f"load-1.0/workload-{w}"
        base = {"workload": name, "nodes": args.fixed_nodes, "max_time": args.max_time}
        out.append({**base, "label": "fixed", "elastic": {}})
        out.append({**base, "label": "autoscaled", "elastic": auto})
        for seed in args.seeds:
            out.append({**base, "label": "fixed+spot", "seed": seed, "elastic": spot})
            if args.preempt_autoscaled:
                out.append({**base, "label": "autoscaled+spot", "seed": seed,
                            "elastic": {**auto, **spot}})
    return out


def print_imagenet(results) -> dict:
    """The ImageNet table; returns the goodput / throughput ratios."""
    by = {r["label"]: r for r in results}
    print("\n(a) ImageNet alone, autoscaled "
          f"{by['goodput']['elastic']['settings']['min_nodes']}-"
          f"{by['goodput']['elastic']['settings']['max_nodes']} nodes\n")
    print("| rule | completion (s) | node-hours | mean nodes | peak nodes | size changes |")
    print("|------|---------------:|-----------:|-----------:|-----------:|-------------:|")
    for label, r in by.items():
        print(f"| {label} | {r['makespan']:.0f} | {r['node_hours']:.2f} | "
              f"{r['elastic']['mean_nodes']:.2f} | {r['elastic']['peak_nodes']} | "
              f"{len(r['elastic']['autoscale_decisions'])} |")
    ratios = {"node_hours": by["goodput"]["node_hours"] / by["throughput"]["node_hours"],
              "completion": by["goodput"]["makespan"] / by["throughput"]["makespan"]}
    print(f"\ngoodput / throughput: node-hours {ratios['node_hours']:.3f}x, completion time "
          f"{ratios['completion']:.3f}x (targets <= 0.80x and <= 1.10x; paper 0.75x, 1.06x)")
    return ratios


def print_workloads(results) -> dict:
    """The workload tables; returns the summary ratios."""
    rows: dict = {}
    for r in results:
        rows.setdefault(r["workload"], {}).setdefault(r["label"], []).append(r)
    print("\n(b) load-1.0 workloads: fixed vs autoscaled (goodput rule)\n")
    print("| workload | fixed node-h | auto node-h | ratio | fixed avg JCT | auto avg JCT | "
          "ratio | fixed makespan | auto makespan | auto mean nodes |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    sums = {"fixed_nh": 0.0, "auto_nh": 0.0, "fixed_jct": [], "auto_jct": [],
            "spot_ratio": [], "auto_spot_ratio": []}
    for w, by in rows.items():
        f, a = by["fixed"][0], by["autoscaled"][0]
        sums["fixed_nh"] += f["node_hours"]
        sums["auto_nh"] += a["node_hours"]
        sums["fixed_jct"].append(f["avg_jct"])
        sums["auto_jct"].append(a["avg_jct"])
        print(f"| {w.split('/')[-1]} | {f['node_hours']:.1f} | {a['node_hours']:.1f} | "
              f"{a['node_hours'] / f['node_hours']:.3f} | {f['avg_jct']:.0f} | "
              f"{a['avg_jct']:.0f} | {a['avg_jct'] / f['avg_jct']:.3f} | {f['makespan']:.0f} | "
              f"{a['makespan']:.0f} | {a['elastic']['mean_nodes']:.2f} |")
    print("\nspot preemptions vs none (average JCT ratio; per seed)\n")
    print("| workload | cluster | preemptions | rollbacks | avg JCT | no-preemption avg JCT | "
          "ratio |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for w, by in rows.items():
        for label, base in (("fixed+spot", "fixed"), ("autoscaled+spot", "autoscaled")):
            for r in by.get(label, []):
                ratio = r["avg_jct"] / by[base][0]["avg_jct"]
                sums["spot_ratio" if base == "fixed" else "auto_spot_ratio"].append(ratio)
                print(f"| {w.split('/')[-1]} | {base} (seed {r['task'].get('seed', 0)}) | "
                      f"{r['preemptions']} | {r['elastic']['rollbacks']} | "
                      f"{r['avg_jct']:.0f} | {by[base][0]['avg_jct']:.0f} | {ratio:.3f} |")
    out = {"node_hours_ratio": sums["auto_nh"] / sums["fixed_nh"],
           "avg_jct_ratio": statistics.mean(sums["auto_jct"]) / statistics.mean(
               sums["fixed_jct"])}
    if sums["spot_ratio"]:
        out["spot_avg_jct_ratio_mean"] = statistics.mean(sums["spot_ratio"])
        out["spot_avg_jct_ratio_max"] = max(sums["spot_ratio"])
    if sums["auto_spot_ratio"]:
        out["auto_spot_avg_jct_ratio_mean"] = statistics.mean(sums["auto_spot_ratio"])
        out["auto_spot_avg_jct_ratio_max"] = max(sums["auto_spot_ratio"])
    print(f"\nover the workloads: autoscaled / fixed node-hours {out['node_hours_ratio']:.3f}x, "
          f"mean avg JCT {out['avg_jct_ratio']:.3f}x")
    if "spot_avg_jct_ratio_mean" in out:
        print(f"preemptions (fixed cluster): avg JCT ratio mean "
              f"{out['spot_avg_jct_ratio_mean']:.3f}x, max {out['spot_avg_jct_ratio_max']:.3f}x "
              "(target <= 1.05x)")
    if "auto_spot_avg_jct_ratio_mean" in out:
        print(f"preemptions (autoscaled): avg JCT ratio mean "
              f"{out['auto_spot_avg_jct_ratio_mean']:.3f}x, max "
              f"{out['auto_spot_avg_jct_ratio_max']:.3f}x")
    return out


def main(argv=None) -> int:
    """Run the experiments, print the tables, write the JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", type=int, nargs="+", default=list(range(1, 9)),
                    help="load-1.0 workload numbers (default 1..8)")
    ap.add_argument("--imagenet-only", action="store_true", help="only experiment (a)")
    ap.add_argument("--skip-imagenet", action="store_true", help="only experiment (b)")
    ap.add_argument("--min-nodes", type=int, default=1)
    ap.add_argument("--max-nodes", type=int, default=16)
    ap.add_argument("--fixed-nodes", type=int, default=16)
    ap.add_argument("--autoscale-every", type=int, default=1, help="rounds between decisions")
    ap.add_argument("--node-startup-s", type=float, default=180.0)
    ap.add_argument("--upper", type=float, default=2 / 3, help="the rules' U")
    ap.add_argument("--lower", type=float, default=0.5, help="the rules' L")
    ap.add_argument("--preemptions-per-node-hour", type=float, default=0.1)
    ap.add_argument("--preemption-notice-s", type=float, default=60.0)
    ap.add_argument("--preempt-autoscaled", action="store_true",
                    help="also run the autoscaled cluster with preemptions")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0],
                    help="seeds of the preemption times")
    ap.add_argument("--max-time", type=float, help="cut each workload run (seconds)")
    ap.add_argument("--jobs", type=int, default=1, help="processes")
    ap.add_argument("--out", default=str(RESULTS / "sim_autoscale.json"))
    args = ap.parse_args(argv)
    bad = [w for w in args.workloads if not 1 <= w <= 8]
    if bad:
        ap.error(f"--workloads: {bad} not in 1..8 (the vendored load-1.0 workloads)")
    if args.jobs < 1:
        ap.error(f"--jobs must be >= 1, got {args.jobs}")
    out: dict = {"args": vars(args)}
    tasks = [] if args.skip_imagenet else imagenet_tasks(args)
    if not args.imagenet_only:
        tasks += workload_tasks(args)
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial.jsonl")
    partial.unlink(missing_ok=True)
    results = _map(tasks, args.jobs, partial)
    out["results"] = results
    image = [r for r in results if r["task"]["workload"] == "imagenet"]
    if image:
        out["imagenet"] = print_imagenet(image)
    work = [r for r in results if r["task"]["workload"] != "imagenet"]
    if work:
        out["workloads"] = print_workloads(work)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as f:
        json.dump(out, f, indent=1)
    Path(f.name).replace(path)
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
