"""The simulated HPO sweep: static vs adaptive vs adaptive+ASHA, and why the ratio is what it is.

Runs :func:`adaptdl_core.sim.sweep.run_sweep` (100 cifar10 trials, 4 at once, 4 nodes x 4
GPUs, 30 s per start or change of allocation, 60-s rounds; arms a, b, c on the same seeded
draws), then diagnostic variants of the static arm (the same fixed 4 GPUs with each trial's
agent choosing its batch, and other fixed batches) and of the adaptive arm (no restart
cost, no shared profiles), a breakdown of the adaptive arm's trials (time at each GPU
count, restarts, batches chosen, idle GPUs, how many trials end together), and the
makespan no schedule can beat in this job model (:func:`makespan_bounds`). Writes
``benchmarks/results/sim_sweep.md`` and prints it.

    flock /tmp/heavy.lock python benchmarks/sim_sweep.py [--trials 100] [--seed 0]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from adaptdl_core.sim.sweep import (QualityModel, makespan_bounds, run_sweep,  # noqa: E402
                                    simulate_arm)
from adaptdl_core.sim.job_model import TRACES_DIR, Application  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "sim_sweep.md"


def _pct(x):
    return "-" if x is None else f"{100 * x:.2f}"


def _row(label, r, base):
    ratio = r["makespan"] / base["makespan"] if base["makespan"] else float("nan")
    jct = "-" if r["mean_jct"] is None else f"{r['mean_jct']:.0f}"
    return (f"| {label} | {r['makespan']:.0f} | {ratio:.3f} | {jct} | {r['gpu_hours']:.1f} | "
            f"{r['completed']} | {r['stopped_early']} | {_pct(r['top1'])} | {_pct(r['top5'])} | "
            f"{1e3 * r['decision_s']['median']:.1f} / {1e3 * r['decision_s']['max']:.1f} | "
            f"{r['restarts']} |")


def _time_at_gpus(r):
    """Trial-seconds spent at each GPU count (summed over trials)."""
    out = {}
    for t in r["trials"]:
        tl = t["timeline"] + [[t["ended"], 0, 0]]
        for (t0, g, _), (t1, _, _) in zip(tl, tl[1:]):
            out[g] = out.get(g, 0.0) + (t1 - t0)
    return dict(sorted(out.items()))


def _breakdown(r, gpus):
    trials = r["trials"]
    at = _time_at_gpus(r)
    total = sum(at.values())
    idle = 1.0 - r["gpu_hours"] * 3600.0 / (gpus * r["makespan"])
    first = [t["timeline"][0][2] for t in trials]
    last = [t["timeline"][-1][2] for t in trials]
    ramp = [next((p[0] - t["admitted"] for p in t["timeline"] if p[1] >= 4), None)
            for t in trials]
    ramp = [x for x in ramp if x is not None]
    ends = {round(t["ended"]) for t in trials if t["ended"] is not None}
    lines = [
        "- trial-time at each GPU count: " + ", ".join(
            f"{g} GPU: {100 * s / total:.1f}%" for g, s in at.items()),
        f"- restarts per trial (changes after the first start): mean "
        f"{statistics.fmean(t['restarts'] for t in trials):.2f}, max "
        f"{max(t['restarts'] for t in trials)}",
        f"- seconds from admission until a trial first holds 4 GPUs: median "
        f"{statistics.median(ramp):.0f}" if ramp else "- no trial reached 4 GPUs",
        f"- total batch chosen: first {min(first)}-{max(first)}, last {min(last)}-"
        f"{max(last)}, median over all changes {r['batch']['median']:.0f}",
        f"- GPU-time idle over the makespan: {100 * idle:.1f}% "
        f"(most GPUs held at once: {r['max_gpus_held']})",
        f"- distinct trial end times: {len(ends)} for {len(trials)} trials",
    ]
    return lines


def _runs(values):
    """``[1, 1, 4, 4, 6]`` as ``1 (epochs 1-2), 4 (3-4), 6 (5)``."""
    out, start = [], 0
    for i in range(1, len(values) + 1):
        if i == len(values) or values[i] != values[start]:
            span = f"{start + 1}" if i - 1 == start else f"{start + 1}-{i}"
            out.append(f"{values[start]} ({span})")
            start = i
    return ", ".join(out)


def main(argv=None) -> int:
    """Run the sweep and its diagnostics; write and print the markdown report."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--diag-trials", type=int, default=20,
                    help="trials in the diagnostic variants (default 20)")
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    gpus = 16
    app = Application(TRACES_DIR / "cifar10")
    quality = QualityModel.from_traces(app, args.trials, args.seed)
    main_run = run_sweep(trials=args.trials, seed=args.seed, quality=quality)
    bounds = makespan_bounds(trials=args.trials)
    arms = main_run["arms"]
    a = arms["a"]
    # Diagnostics: variants of (a) and (b) on fewer trials (the trials run in lockstep
    # waves of `concurrent`, so a ratio per wave carries over), against (a) at the same
    # count.
    n = args.diag_trials
    dq = QualityModel.from_traces(app, n, args.seed)
    kw = dict(trials=n, seed=args.seed, quality=dq)
    diag = {"a": simulate_arm("a", **kw), "b": simulate_arm("b", **kw)}
    diag["a, agent's batch on the fixed 4 GPUs"] = simulate_arm("a", static_batch=None, **kw)
    for bsz in (512, 1024, 4096):
        diag[f"a, fixed batch {bsz}"] = simulate_arm("a", static_batch=bsz, **kw)
    diag["a, no restart cost (restart_s=0)"] = simulate_arm("a", restart_s=0.0, **kw)
    diag["b, no restart cost (restart_s=0)"] = simulate_arm("b", restart_s=0.0, **kw)
    diag["b, no shared profiles (each trial explores from 1 GPU)"] = simulate_arm(
        "b", share_profiles=False, **kw)
    diag["b, no shared profiles, no restart cost"] = simulate_arm(
        "b", share_profiles=False, restart_s=0.0, **kw)
    head = ("| arm | makespan (s) | / (a) | mean trial JCT (s) | GPU-h | completed | "
            "stopped early | top-1 (%) | top-5 mean (%) | decision median / max (ms) | "
            "restarts |")
    sep = "|" + "---|" * 11
    lines = [
        "# Simulated HPO sweep (`python benchmarks/sim_sweep.py`)",
        "",
        f"{args.trials} cifar10 (ResNet-18) trials from the Pollux traces, 4 at once, 4 nodes x"
        " 4 GPUs, 100 epochs per complete trial, 30 s per start or change of allocation, "
        f"60-s policy rounds, 5-s ticks, seed {args.seed}. (a) static: 4 GPUs, total batch "
        "2048; (b) adaptive: decision core + PolluxPolicy, each trial's agent picks its batch "
        "by goodput; (c) = (b) + ASHA (reduction factor 4, grace period 1 epoch, rungs "
        f"{arms['c']['settings']['asha']['rungs']}). Quality: the trace's validation curve at "
        "batch 128 + a per-trial offset + evaluation noise (same draws in every arm). Top-1 "
        "and top-5 over completed trials.",
        "",
        head, sep,
        _row("(a) static", a, a),
        _row("(b) adaptive", arms["b"], a),
        _row("(c) adaptive + ASHA", arms["c"], a),
        "",
        f"**Makespan (b)/(a) = {main_run['ratio_b_a']:.3f}** at {arms['b']['completed']} "
        f"completed trials in both (target <= 0.70; the paper measured 0.71 on real GPUs).",
        "",
        "## What any schedule could reach in this job model (`makespan_bounds`)",
        "",
        "| | makespan (s) | / static estimate | / simulated (a) |",
        "|---|---|---|---|",
        f"| static estimate (arm a without its ticks) | {bounds['static']:.0f} | 1.000 | "
        f"{bounds['static'] / a['makespan']:.3f} |",
        f"| adaptive batch, GPUs split evenly (4 each) | {bounds['fair_share']:.0f} | "
        f"{bounds['fair_share_ratio']:.3f} | {bounds['fair_share'] / a['makespan']:.3f} |",
        f"| lower bound: any GPUs per epoch, free resizes, perfect foresight | "
        f"{bounds['lower_bound']:.0f} | {bounds['lower_bound_ratio']:.3f} | "
        f"{bounds['lower_bound'] / a['makespan']:.3f} |",
        "",
        "GPUs per epoch (epoch numbers in brackets) at the bound: "
        + _runs(bounds["gpus_by_epoch"]) + ". Early epochs gain little from more GPUs "
        "(their best batch is small), late ones scale: the bound needs trials in different "
        "phases at every moment, which identical trials admitted together never are.",
        "",
        f"## Diagnostics on {n} trials (ratios against (a) on {n} trials)",
        "",
        head, sep,
    ]
    for label, r in diag.items():
        lines.append(_row(label, r, diag["a"]))
    lines += ["", "## Where the adaptive arm's time goes (b)", ""]
    lines += _breakdown(arms["b"], gpus)
    lines += ["", f"## (b) without shared profiles ({n} trials)", ""]
    lines += _breakdown(diag["b, no shared profiles (each trial explores from 1 GPU)"], gpus)
    lines += ["", "## The static arm (a)", ""]
    lines += _breakdown(a, gpus)
    lines += ["", f"Wall time of this benchmark: {time.perf_counter() - t0:.0f} s.", ""]
    text = "\n".join(lines)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
