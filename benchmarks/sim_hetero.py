"""The Sia paper's mixed-GPU experiment in the trace-driven simulator: ours vs its Table 3.

Runs ``adaptdl_core.sim.cluster.simulate`` on a typed cluster (default ``sia-heterogeneous``:
6 t4 + 3 rtx + 2 a100 nodes) for each trace (the Sia paper's Philly and Helios workloads)
x policy (``pollux`` type-unaware as the paper ran it, its allocations applied as they
are; ``sia``; AdaptDL's ``adaptdl``) x workload, and prints per trace and policy: the mean
over workloads of the average JCT (with its standard deviation), the p99 JCT over all the
trace's jobs, the mean makespan and the GPU-hours per job, beside the published Table 3;
the GPU-hours per job on each GPU type; and the ratios the targets are stated in (adaptdl /
sia, adaptdl / pollux against the published sia / pollux). Writes
``benchmarks/results/sim_hetero.md`` and ``.json``.

Usage (heavy: each simulation takes minutes; on a shared machine run under ``nice``)::

    python benchmarks/sim_hetero.py                      # everything (54 simulations)
    python benchmarks/sim_hetero.py --traces philly --policies sia pollux --workloads 1 2
    python benchmarks/sim_hetero.py --jobs 2 --runs-dir R  # keep each run's JSON in R
    python benchmarks/sim_hetero.py --from-runs R          # summarise saved runs only
    python benchmarks/sim_hetero.py --cluster sia-homogeneous --traces philly
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from adaptdl_core.sim.cluster import PUBLISHED_DIR, simulate  # noqa: E402
from sim_cluster import parse_options  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
TRACES = {"philly": 8, "helios": 10}
POLICIES = ("pollux", "sia", "adaptdl")


def published(cluster: str) -> dict:
    """Table 3 (and 4) of the Sia paper: ``{trace: {policy: {metric: hours}}}``."""
    table = json.loads((PUBLISHED_DIR / "sia-table3.json").read_text())
    return table.get(cluster, {})


def _run(task) -> dict:
    policy, trace, w, cluster, options = task
    # Pollux as the Sia paper ran it: each round's allocation applied as it is (the Sia
    # artifact's simulator does no more), not through the decision core's resize rules.
    r = simulate(f"{trace}/workload-{w}", policy, cluster=cluster,
                 use_core=False if policy == "pollux" else None,
                 policy_options=options or None)
    r["trace"] = trace
    r.pop("timeline", None)
    return r


def summary(results, cluster: str) -> list:
    """One row per (trace, policy): our figures (hours) beside the published ones."""
    pub = published(cluster)
    rows = []
    for trace in TRACES:
        for policy in dict.fromkeys(r["policy"] for r in results):
            sel = [r for r in results if r["trace"] == trace and r["policy"] == policy]
            if not sel:
                continue
            avgs = np.array([r["avg_jct"] for r in sel]) / 3600
            jcts = np.concatenate([list(r["jcts"].values()) for r in sel]) / 3600
            spans = np.array([r["makespan"] for r in sel]) / 3600
            per_job = np.array([r["gpu_hours"] / r["num_jobs"] for r in sel])
            by_type: dict = {}
            for r in sel:
                for t, h in r.get("gpu_hours_by_type", {}).items():
                    by_type[t] = by_type.get(t, 0.0) + h / r["num_jobs"] / len(sel)
            apps: dict = {}
            for r in sel:
                for name, jct in r["jcts"].items():
                    apps.setdefault(name.rsplit("-", 1)[0], []).append(jct / 3600)
            rows.append({
                "trace": trace, "policy": policy, "workloads": len(sel),
                "avg_jct_by_application_h": {a: float(np.mean(v)) for a, v in
                                             sorted(apps.items())},
                "completed": int(sum(r["completed"] for r in sel)),
                "num_jobs": int(sum(r["num_jobs"] for r in sel)),
                "avg_jct_h": float(avgs.mean()), "avg_jct_std_h": float(avgs.std()),
                "p99_jct_h": float(np.percentile(jcts, 99)),
                "makespan_h": float(spans.mean()), "makespan_std_h": float(spans.std()),
                "gpu_hours_per_job": float(per_job.mean()),
                "gpu_hours_per_job_std": float(per_job.std()),
                "gpu_hours_per_job_by_type": by_type,
                "restarts_per_job": float(np.mean([r["restarts"] / r["num_jobs"] for r in sel])),
                "decision_median_ms": float(1e3 * np.median([r["decision_s"]["median"]
                                                             for r in sel])),
                "decision_p99_ms": float(1e3 * max(r["decision_s"]["p99"] for r in sel)),
                "workload_names": [r["workload"] for r in sel],
                "published": pub.get(trace, {}).get(policy),
            })
    return rows


def _fmt(v, std=None) -> str:
    if v is None:
        return "-"
    return f"{v:.2f}" + (f" ± {std:.2f}" if std is not None else "")


def _by_column(rows: list, key: str, missing: float, title: str) -> list[str]:
    """A markdown table of each row's ``key`` mapping (a column per name), under ``title``."""
    names = sorted({name for row in rows for name in row[key]})
    lines = ["", title, "", "| trace | policy | " + " | ".join(names) + " |",
             "|---|---|" + "---:|" * len(names)]
    for row in rows:
        lines.append(f"| {row['trace']} | {row['policy']} | " + " | ".join(
            f"{row[key].get(name, missing):.2f}" for name in names) + " |")
    return lines


def report(rows, cluster: str) -> list:
    """Markdown lines: the table beside Table 3, GPU-hours by type, the target ratios."""
    lines = [f"Cluster `{cluster}`; hours; ours: mean ± std over the workloads (p99 over all "
             "the trace's jobs); published: the Sia paper's.", "",
             "| trace | policy | workloads | avg JCT | published | p99 JCT | published | "
             "makespan | published | GPU-h/job | published | restarts/job | decision median "
             "/ p99 ms |",
             "|---|---|---:|---|---|---:|---:|---|---|---|---|---:|---|"]
    for row in rows:
        p = row["published"] or {}
        lines.append(
            f"| {row['trace']} | {row['policy']} | {row['workloads']} | "
            f"{_fmt(row['avg_jct_h'], row['avg_jct_std_h'])} | "
            f"{_fmt(p.get('avg_jct'), p.get('avg_jct_std'))} | {row['p99_jct_h']:.1f} | "
            f"{_fmt(p.get('p99_jct'))} | {_fmt(row['makespan_h'], row['makespan_std_h'])} | "
            f"{_fmt(p.get('makespan'), p.get('makespan_std'))} | "
            f"{_fmt(row['gpu_hours_per_job'], row['gpu_hours_per_job_std'])} | "
            f"{_fmt(p.get('gpu_hours_per_job'), p.get('gpu_hours_per_job_std'))} | "
            f"{row['restarts_per_job']:.1f} | {row['decision_median_ms']:.0f} / "
            f"{row['decision_p99_ms']:.0f} |")
    lines += _by_column(rows, "gpu_hours_per_job_by_type", 0.0,
                        "GPU-hours per job on each type (mean over the workloads):")
    lines += _by_column(rows, "avg_jct_by_application_h", float("nan"),
                        "Average JCT by application (hours, all the trace's jobs):")
    lines += ["", "Ratios (ours; published in brackets where the paper gives them):", ""]
    for trace in TRACES:
        by = {row["policy"]: row for row in rows if row["trace"] == trace}
        if {"sia", "pollux"} <= set(by):
            pub = published(cluster).get(trace, {})
            ours = by["sia"]["avg_jct_h"] / by["pollux"]["avg_jct_h"]
            theirs = (pub["sia"]["avg_jct"] / pub["pollux"]["avg_jct"]
                      if "sia" in pub and "pollux" in pub else None)
            lines.append(f"- {trace}: sia / pollux avg JCT {ours:.3f}"
                         + (f" (published {theirs:.3f})" if theirs else ""))
        if {"adaptdl", "sia"} <= set(by):
            a, s = by["adaptdl"], by["sia"]
            lines.append(f"- {trace}: adaptdl / sia: avg JCT {a['avg_jct_h'] / s['avg_jct_h']:.3f}, "
                         f"p99 {a['p99_jct_h'] / s['p99_jct_h']:.3f}, makespan "
                         f"{a['makespan_h'] / s['makespan_h']:.3f}")
        if {"adaptdl", "pollux"} <= set(by):
            pub = published(cluster).get(trace, {})
            theirs = (pub["sia"]["avg_jct"] / pub["pollux"]["avg_jct"]
                      if "sia" in pub and "pollux" in pub else None)
            ratio = by["adaptdl"]["avg_jct_h"] / by["pollux"]["avg_jct_h"]
            lines.append(f"- {trace}: adaptdl / pollux avg JCT {ratio:.3f}"
                         + (f" (published sia / pollux {theirs:.3f}; target <= "
                            f"{0.95 * theirs:.3f})" if theirs else ""))
    return lines


def load_runs(folders) -> list:
    """Run JSONs saved with ``--runs-dir``."""
    out = []
    for folder in folders:
        for path in sorted(Path(folder).glob("*.json")):
            r = json.loads(path.read_text())
            r.setdefault("trace", r["workload"].split("/")[0])
            out.append(r)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", nargs="+", choices=list(TRACES), default=list(TRACES))
    ap.add_argument("--policies", nargs="+", choices=POLICIES, default=list(POLICIES))
    ap.add_argument("--workloads", nargs="+", type=int,
                    help="workload numbers (default: all of each trace)")
    ap.add_argument("--cluster", default="sia-heterogeneous")
    ap.add_argument("--adaptdl-options", default="", metavar="K=V,...",
                    help="options of the adaptdl policy (RemainingWorkPolicy)")
    ap.add_argument("--jobs", type=int, default=1, help="simulations run in parallel")
    ap.add_argument("--runs-dir", help="also write each run's JSON here as it ends")
    ap.add_argument("--from-runs", nargs="+", metavar="DIR",
                    help="simulate nothing: summarise the run JSONs in these folders")
    ap.add_argument("--out", default=str(RESULTS / "sim_hetero.md"))
    args = ap.parse_args(argv)
    if args.jobs < 1:
        ap.error(f"--jobs must be >= 1, got {args.jobs}")
    options = parse_options(args.adaptdl_options)
    if args.from_runs:
        results = load_runs(args.from_runs)
    else:
        tasks = [(policy, trace, w, args.cluster, options if policy == "adaptdl" else {})
                 for trace in args.traces for policy in args.policies
                 for w in (args.workloads or range(1, TRACES[trace] + 1))
                 if w <= TRACES[trace]]
        keep = Path(args.runs_dir) if args.runs_dir else None
        if keep:
            keep.mkdir(parents=True, exist_ok=True)
        results = []

        def done(r):
            results.append(r)
            print(f"{r['policy']:8s} {r['workload']:18s} avg {r['avg_jct'] / 3600:.2f} h, p99 "
                  f"{r['p99_jct'] / 3600:.1f} h, makespan {r['makespan'] / 3600:.1f} h, "
                  f"{r['gpu_hours'] / r['num_jobs']:.2f} GPU-h/job, wall {r['wall_s']:.0f} s",
                  flush=True)
            if keep:
                name = f"{r['policy']}_{r['workload'].replace('/', '_')}.json"
                (keep / name).write_text(json.dumps(r, sort_keys=True))

        if args.jobs > 1:
            from concurrent.futures import ProcessPoolExecutor, as_completed
            with ProcessPoolExecutor(args.jobs) as pool:
                for fut in as_completed([pool.submit(_run, t) for t in tasks]):
                    done(fut.result())
        else:
            for t in tasks:
                done(_run(t))
    rows = summary(results, args.cluster)
    lines = report(rows, args.cluster)
    print("\n".join(lines))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("# Mixed-GPU cluster simulation vs the Sia paper\n\n"
                   "Generated by `python benchmarks/sim_hetero.py`.\n\n" + "\n".join(lines)
                   + "\n")
    out.with_suffix(".json").write_text(json.dumps({"summary": rows, "runs": [
        {k: v for k, v in r.items() if k != "jcts"} for r in results]}, indent=1,
        sort_keys=True))
    print(f"wrote {out} and {out.with_suffix('.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
