"""The Pollux paper's cluster experiment in the trace-driven simulator: ours vs published.

Runs ``adaptdl_core.sim.cluster.simulate`` for each policy x load x workload, compares the
average JCT, p99 JCT and makespan with the paper's published runs (AdaptDL's own policy,
``adaptdl``, with the published Pollux), prints per policy and load the ratios pooled over
the workloads' jobs and the finish-time fairness (the largest ratio over the jobs of a
job's JCT to its JCT alone on an equal share of the cluster, :mod:`adaptdl_core.sim.fairness`),
and writes

* ``benchmarks/results/sim_cluster.md``: one row per run (ours, published, ratio), the
  per-load means, decision time and wall time;
* ``benchmarks/results/sim_cluster.json``: every result (per-job JCTs included);
* with matplotlib (``pip install adaptdl-ray[plot]``): ``sim_cluster_cdf.png`` (JCT CDF per
  policy at each load) and ``sim_cluster_gpus.png`` (GPUs per job over time, pollux, one
  workload).

Usage (heavy: wrap in ``flock /tmp/heavy.lock`` on a shared machine)::

    python benchmarks/sim_cluster.py            # the full grid (48 runs; pollux dominates)
    python benchmarks/sim_cluster.py --quick    # baselines everywhere, pollux on 2 workloads
    python benchmarks/sim_cluster.py --policies pollux --loads 1.0 --workloads 1 6
    python benchmarks/sim_cluster.py --policies pollux adaptdl --jobs 16   # the targets
    python benchmarks/sim_cluster.py --policies adaptdl --adaptdl-options alpha=0.5 \
        --adaptdl-options alpha=1,max_weight=8 --jobs 16     # compare settings
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from adaptdl_core.sim.cluster import POLICIES, load_workload, published, simulate  # noqa: E402
from adaptdl_core.sim.fairness import of_run  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def _published_makespan(load: str, workload: str, jcts: dict) -> float:
    sub = {r.name: r.time for r in load_workload(f"load-{load}/{workload}")}
    return max(sub[k] + v for k, v in jcts.items()) - min(sub.values())


def parse_options(text: str, flag: str = "--adaptdl-options") -> dict:
    """``"alpha=1,max_weight=4"`` -> ``{"alpha": 1.0, "max_weight": 4.0}``; a malformed
    item exits with a message naming ``flag``."""
    out = {}
    for item in filter(None, text.split(",")):
        key, sep, value = item.partition("=")
        try:
            if not sep:
                raise ValueError
            out[key.strip()] = float(value)
        except ValueError:
            raise SystemExit(f"{flag}: {item!r} is not KEY=NUMBER "
                             "(e.g. alpha=1,max_weight=4)") from None
    return out


def _label(policy: str, options: dict) -> str:
    if not options:
        return policy
    return policy + "[" + ",".join(f"{k}={v:g}" for k, v in sorted(options.items())) + "]"


def _run(task):
    policy, options, load, wl, timeline = task
    name = f"load-{load}/{wl}"
    r = simulate(name, policy, timeline=timeline, policy_options=options or None)
    # Our own policies are judged against the published Pollux.
    pub = published(policy if policy in ("tiresias", "optimus") else "pollux", load)
    r["published_avg_jct"] = pub["avgs"][wl]
    r["published_makespan"] = _published_makespan(load, wl, pub["jcts"][wl])
    r["load"] = load
    r["label"] = _label(policy, options)
    r["ftf"] = _fairness(r)
    return r


def _fairness(r) -> dict:
    """The run's finish-time fairness: largest and mean ratio, and the worst job."""
    out = of_run(r, load_workload(r["workload"]))
    return {k: out[k] for k in ("max", "worst", "mean")}


def _published_fairness(r, pub) -> float:
    """Largest finish-time fairness ratio of the published run of ``r``'s workload, on
    ``r``'s cluster and settings."""
    wl = r["workload"].split("/")[-1]
    jcts = pub["jcts"][wl]
    return of_run({"jcts": jcts, "settings": r["settings"]}, load_workload(r["workload"]))["max"]


def load_runs(folder) -> list:
    """Results saved with ``--runs-dir`` (or by ``python -m adaptdl_core.sim cluster --out``
    into ``folder``), completed with the published figures ``summary`` needs."""
    out = []
    for path in sorted(Path(folder).glob("*.json")):
        r = json.loads(path.read_text())
        wl = r["workload"].split("/")[-1]
        load = r.get("load") or r["workload"].split("/")[0].replace("load-", "")
        r["load"] = load
        r.setdefault("label", _label(r["policy"], r.get("settings", {}).get("policy_options")
                                     or {}))
        ref = r["policy"] if r["policy"] in ("tiresias", "optimus") else "pollux"
        pub = published(ref, load)
        r.setdefault("published_avg_jct", pub["avgs"][wl])
        r.setdefault("published_makespan", _published_makespan(load, wl, pub["jcts"][wl]))
        if "ftf" not in r:
            r["ftf"] = _fairness(r)
        out.append(r)
    return out


def summary(results, loads) -> list:
    """Per policy label and load: pooled average and p99 JCT over all jobs of the runs, each
    over the published runs of the same workloads (published Pollux for ``pollux`` and
    ``adaptdl``), makespan ratio (mean and worst over workloads), finish-time fairness
    (largest ratio over the runs' jobs, the mean of the runs' mean ratios, and the largest
    ratio of the published runs on the same settings) and decision
    time (median of the runs' medians, largest of their p99s, in ms). One dict per row."""
    import numpy as np
    rows = []
    labels = list(dict.fromkeys(r["label"] for r in results))
    for label in labels:
        for load in loads:
            sel = [r for r in results if r["label"] == label and r["load"] == load]
            if not sel:
                continue
            ours = np.concatenate([list(r["jcts"].values()) for r in sel])
            ref = "pollux" if sel[0]["policy"] in ("pollux", "adaptdl") else sel[0]["policy"]
            pub = published(ref, load)
            theirs = np.concatenate([list(pub["jcts"][r["workload"].split("/")[-1]].values())
                                     for r in sel])
            spans = [r["makespan"] / r["published_makespan"] for r in sel]
            rows.append({
                "label": label, "load": load, "workloads": len(sel),
                "completed": int(sum(r["completed"] for r in sel)),
                "num_jobs": int(sum(r["num_jobs"] for r in sel)),
                "avg_ratio": float(ours.mean() / theirs.mean()),
                "p99_ratio": float(np.percentile(ours, 99) / np.percentile(theirs, 99)),
                "makespan_ratio_mean": float(np.mean(spans)),
                "makespan_ratio_max": float(np.max(spans)),
                "ftf_max": float(max(r["ftf"]["max"] for r in sel)),
                "ftf_mean": float(np.mean([r["ftf"]["mean"] for r in sel])),
                "ftf_max_published": float(max(_published_fairness(r, pub) for r in sel)),
                "decision_median_ms": float(1e3 * np.median([r["decision_s"]["median"]
                                                             for r in sel])),
                # Runs saved before p99 was recorded give their maximum instead.
                "decision_p99_ms": float(1e3 * max(r["decision_s"].get(
                    "p99", r["decision_s"]["max"]) for r in sel)),
                "avg_jct": float(ours.mean()), "p99_jct": float(np.percentile(ours, 99)),
                "by_application": _by_application(sel, pub),
                "restarts": int(sum(r["restarts"] for r in sel)),
                "gpu_hours": float(sum(r["gpu_hours"] for r in sel)),
            })
    return rows


def _by_application(runs, pub) -> dict:
    """Application -> its jobs' summed JCT in ``runs`` over the same jobs' in the published
    runs ``pub`` (a job is named ``<application>-<index>``): where a policy gains or loses."""
    ours: dict = {}
    theirs: dict = {}
    for r in runs:
        published_jcts = pub["jcts"][r["workload"].split("/")[-1]]
        for name, jct in r["jcts"].items():
            app = name.rsplit("-", 1)[0]
            ours[app] = ours.get(app, 0.0) + jct
            theirs[app] = theirs.get(app, 0.0) + published_jcts[name]
    return {app: ours[app] / theirs[app] for app in sorted(ours)}


def _print_summary(rows) -> None:
    print("\npolicy / load: ratios to the published runs (pooled over the workloads' jobs)")
    for row in rows:
        print(f"{row['label']:40s} load {row['load']}: avg x{row['avg_ratio']:.3f}, p99 "
              f"x{row['p99_ratio']:.3f}, makespan x{row['makespan_ratio_mean']:.3f} (worst "
              f"x{row['makespan_ratio_max']:.3f}), fairness max {row['ftf_max']:.2f} (mean "
              f"{row['ftf_mean']:.2f}; published max {row['ftf_max_published']:.2f}), decision "
              f"median "
              f"{row['decision_median_ms']:.1f} ms p99 {row['decision_p99_ms']:.0f} ms, "
              f"{row['completed']}/{row['num_jobs']} jobs")
        print(" " * 41 + "by application: " + ", ".join(
            f"{app} x{ratio:.3f}" for app, ratio in row["by_application"].items())
            + f"; {row['restarts']} restarts, {row['gpu_hours']:.0f} GPU-h")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="pollux and adaptdl only on load-0.5 workload-1 and load-1.0 "
                    "workload-1")
    ap.add_argument("--policies", nargs="+", choices=POLICIES, default=list(POLICIES))
    ap.add_argument("--adaptdl-options", action="append", default=None, metavar="K=V,...",
                    help="options of the adaptdl policy (RemainingWorkPolicy), e.g. "
                    "alpha=1,max_weight=4; repeat to compare several settings")
    ap.add_argument("--loads", nargs="+", choices=["0.5", "1.0"], default=["0.5", "1.0"])
    ap.add_argument("--workloads", nargs="+", type=int, default=list(range(1, 9)))
    ap.add_argument("--jobs", type=int, default=1,
                    help="simulations run in parallel (processes)")
    ap.add_argument("--runs-dir", help="also write each run's result JSON here as it ends")
    ap.add_argument("--out", default=str(RESULTS / "sim_cluster.md"))
    ap.add_argument("--timeline-workload", default="load-1.0/workload-1",
                    help="workload whose pollux run is plotted as GPUs per job over time")
    ap.add_argument("--from-runs", nargs="+", metavar="DIR",
                    help="simulate nothing: print the per-policy summary of the run JSONs "
                    "in these folders (from --runs-dir)")
    args = ap.parse_args(argv)
    if args.from_runs:
        results = [r for d in args.from_runs for r in load_runs(d)]
        _print_summary(summary(results, args.loads))
        return 0
    if args.jobs < 1:
        ap.error(f"--jobs must be >= 1, got {args.jobs}")
    variants = [parse_options(t) for t in (args.adaptdl_options or [""])]

    runs = []
    for policy in args.policies:
        for options in (variants if policy == "adaptdl" else [{}]):
            for load in args.loads:
                wls = args.workloads
                if args.quick and policy in ("pollux", "adaptdl"):
                    wls = [1]
                for w in wls:
                    name = f"load-{load}/workload-{w}"
                    runs.append((policy, options, load, f"workload-{w}",
                                 policy == "pollux" and name == args.timeline_workload))
    results = []
    keep = Path(args.runs_dir) if args.runs_dir else None
    if keep:
        keep.mkdir(parents=True, exist_ok=True)

    def done(r):
        results.append(r)
        if keep:  # each run as it ends: a grid cut short still leaves its finished runs
            name = f"{r['label']}_{r['load']}_{r['workload'].split('/')[-1]}.json"
            slim = {k: v for k, v in r.items() if k != "timeline"}
            (keep / name).write_text(json.dumps(slim, sort_keys=True))

    if args.jobs > 1:
        from concurrent.futures import ProcessPoolExecutor, as_completed
        with ProcessPoolExecutor(args.jobs) as pool:
            for fut in as_completed([pool.submit(_run, t) for t in runs]):
                done(fut.result())
        order = {(_label(t[0], t[1]), t[2], t[3]): i for i, t in enumerate(runs)}
        results.sort(key=lambda r: order[(r["label"], r["load"],
                                          r["workload"].split("/")[-1])])
    else:
        for t in runs:
            done(_run(t))
    for r in results:
        print(f"{r['label']:8s} {r['workload']:20s} avg JCT {r['avg_jct']:7.0f} s (published "
              f"{r['published_avg_jct']:7.0f}, x{r['avg_jct'] / r['published_avg_jct']:.3f}) "
              f"makespan {r['makespan']:6.0f} (published {r['published_makespan']:6.0f}) "
              f"decision median {1e3 * r['decision_s']['median']:.1f} ms p99 "
              f"{1e3 * r['decision_s']['p99']:.0f} ms, wall {r['wall_s']:.0f} s", flush=True)
    rows = summary(results, args.loads)
    _print_summary(rows)

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    lines = ["# Cluster simulation vs the Pollux paper (avg JCT, seconds)", "",
             "Generated by `python benchmarks/sim_cluster.py" + (" --quick" if args.quick else "")
             + "` (16 nodes x 4 GPUs, 60 s rounds, 30 s per start or change of allocation). "
             "`ratio` = ours / published; makespan from first submission to last completion.",
             "",
             "| policy | load | workload | ours | published | ratio | makespan ours | "
             "makespan published | fairness max | decision median ms | decision p99 ms | "
             "wall s |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        lines.append(
            f"| {r['label']} | {r['load']} | {r['workload'].split('/')[-1]} | "
            f"{r['avg_jct']:.0f} | {r['published_avg_jct']:.0f} | "
            f"{r['avg_jct'] / r['published_avg_jct']:.3f} | {r['makespan']:.0f} | "
            f"{r['published_makespan']:.0f} | {r['ftf']['max']:.2f} | "
            f"{1e3 * r['decision_s']['median']:.1f} | "
            f"{1e3 * r['decision_s']['p99']:.0f} | {r['wall_s']:.0f} |")
    lines += ["", "Per policy and load, pooled over the workloads' jobs, ratios to the published "
              "runs (Pollux's for pollux and adaptdl):", "",
              "| policy | load | workloads | avg JCT ratio | p99 JCT ratio | makespan ratio "
              "(mean / worst) | fairness max (mean) | published fairness max | decision median ms | "
              "decision p99 ms |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        lines.append(f"| {row['label']} | {row['load']} | {row['workloads']} | "
                     f"{row['avg_ratio']:.3f} | {row['p99_ratio']:.3f} | "
                     f"{row['makespan_ratio_mean']:.3f} / {row['makespan_ratio_max']:.3f} | "
                     f"{row['ftf_max']:.2f} ({row['ftf_mean']:.2f}) | "
                     f"{row['ftf_max_published']:.2f} | "
                     f"{row['decision_median_ms']:.1f} | {row['decision_p99_ms']:.0f} |")
    out.write_text("\n".join(lines) + "\n")
    slim = [{k: v for k, v in r.items() if k != "timeline"} for r in results]
    out.with_suffix(".json").write_text(json.dumps({"runs": slim, "summary": rows}, indent=1,
                                                   sort_keys=True))
    print(f"wrote {out} and {out.with_suffix('.json')}")
    _plots(results, out.parent)
    return 0


def _plots(results, folder: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed (pip install adaptdl-ray[plot]): no plots")
        return
    import numpy as np

    loads = sorted({r["load"] for r in results})
    fig, axes = plt.subplots(1, len(loads), figsize=(6 * len(loads), 4), squeeze=False)
    for ax, load in zip(axes[0], loads):
        for label in dict.fromkeys(r["label"] for r in results):
            vals = sorted(v for r in results if r["label"] == label and r["load"] == load
                          for v in r["jcts"].values())
            if vals:
                ax.plot(np.array(vals) / 3600, np.arange(1, len(vals) + 1) / len(vals),
                        label=label)
        ax.set_xscale("log")
        ax.set_xlabel("JCT (hours)")
        ax.set_ylabel("fraction of jobs")
        ax.set_title(f"load {load}")
        ax.legend()
    fig.tight_layout()
    fig.savefig(folder / "sim_cluster_cdf.png", dpi=100)
    tl = next((r for r in results if r.get("timeline")), None)
    if tl:
        fig, ax = plt.subplots(figsize=(10, 4))
        names = sorted({k for row in tl["timeline"] for k in row["gpus"]})
        ts = np.array([row["t"] for row in tl["timeline"]]) / 3600
        stack = np.array([[row["gpus"].get(n, 0) for row in tl["timeline"]] for n in names])
        ax.stackplot(ts, stack, linewidth=0)
        ax.set_xlabel("time (hours)")
        ax.set_ylabel("GPUs held (one band per job)")
        ax.set_title(f"pollux, {tl['workload']}")
        fig.tight_layout()
        fig.savefig(folder / "sim_cluster_gpus.png", dpi=100)
    print(f"wrote plots to {folder}")


if __name__ == "__main__":
    sys.exit(main())
