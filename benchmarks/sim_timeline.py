"""GPUs held by chosen jobs over time in one cluster simulation, at every change.

Shows how a policy treats a few jobs against the rest of the cluster, e.g. how fast a job
climbs to its size, or which job holds the GPUs a long job would grow into::

    python benchmarks/sim_timeline.py --workload load-0.5/workload-1 --policy pollux \\
        --show cifar10-11
    python benchmarks/sim_timeline.py --workload load-0.5/workload-1 --policy adaptdl \\
        --show deepspeech2-78 imagenet-79 --start 26900 --end 29800

One line per round at which the cluster's total or a shown job's GPUs change: the time
(seconds), the GPUs in use in the whole cluster, and each shown job's GPUs; then each
shown job's submission time and JCT.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from adaptdl_core.sim.cluster import POLICIES, load_workload, simulate  # noqa: E402
from benchmarks.sim_cluster import parse_options  # noqa: E402


def changes(timeline, show, start=0.0, end=math.inf) -> list:
    """``(t, cluster GPUs, [GPUs of each shown job])`` at each timeline entry in
    ``[start, end]`` where one of them differs from the entry before (pure)."""
    out, last = [], None
    for entry in timeline:
        if not start <= entry["t"] <= end:
            continue
        gpus = entry["gpus"]
        row = (sum(gpus.values()), tuple(gpus.get(name, 0) for name in show))
        if row != last:
            out.append((entry["t"], row[0], list(row[1])))
            last = row
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", required=True, help="e.g. load-0.5/workload-1")
    ap.add_argument("--policy", default="pollux", choices=POLICIES)
    ap.add_argument("--policy-option", action="append", default=[], metavar="KEY=VALUE",
                    help="an option of the adaptdl policy, e.g. exploration_factor=2")
    ap.add_argument("--show", nargs="+", required=True, metavar="JOB",
                    help="job names of the workload, e.g. imagenet-79")
    ap.add_argument("--start", type=float, default=0.0, help="first time shown (s)")
    ap.add_argument("--end", type=float, default=math.inf, help="last time shown (s)")
    args = ap.parse_args(argv)
    rows = {r.name: r for r in load_workload(args.workload)}
    unknown = [name for name in args.show if name not in rows]
    if unknown:
        ap.error(f"--show: no job {', '.join(unknown)} in {args.workload} (e.g. "
                 f"{', '.join(list(rows)[:3])})")
    result = simulate(args.workload, args.policy, timeline=True,
                      policy_options=parse_options(",".join(args.policy_option),
                                                   "--policy-option") or None)
    print(f"{args.policy} {args.workload}: t (s), cluster GPUs, " + ", ".join(args.show))
    for t, total, held in changes(result["timeline"], args.show, args.start, args.end):
        print(f"{t:8.0f} {total:4d}  " + "  ".join(f"{g:3d}" for g in held))
    for name in args.show:
        print(f"{name}: submitted at {rows[name].time:.0f} s, JCT {result['jcts'][name]:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
