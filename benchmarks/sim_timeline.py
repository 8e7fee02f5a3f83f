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

On a cluster of several GPU types (``--cluster sia-heterogeneous``, policies pollux, sia
and adaptdl) a shown job's GPUs carry the type they are on (``16a100``), and the line
adds the GPUs in use per type; a job runs on one type at a time, so when few jobs are
left, whole types may stand idle::

    python benchmarks/sim_timeline.py --workload philly/workload-5 \
        --cluster sia-heterogeneous --policy adaptdl --show imagenet-148 --start 36000
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
    ``[start, end]`` where one of them differs from the entry before (pure). On a typed
    cluster (entries with ``types``), the cluster's GPUs are a dict type -> GPUs in use
    and each shown job's are ``(GPUs, type)`` (type ``None`` when it holds none)."""
    out, last = [], None
    for entry in timeline:
        if not start <= entry["t"] <= end:
            continue
        gpus, types = entry["gpus"], entry.get("types")
        if types is None:
            row = (sum(gpus.values()), tuple(gpus.get(name, 0) for name in show))
        else:
            used: dict = {}
            for name, count in gpus.items():
                if count:
                    used[types[name]] = used.get(types[name], 0) + count
            row = (tuple(sorted(used.items())),
                   tuple((gpus.get(name, 0), types.get(name)) for name in show))
        if row != last:
            total = row[0] if types is None else dict(row[0])
            out.append((entry["t"], total, list(row[1])))
            last = row
    return out


def _held(g) -> str:
    return f"{g:3d}" if isinstance(g, int) else (f"{g[0]:3d}{g[1] or '':4s}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", required=True, help="e.g. load-0.5/workload-1")
    ap.add_argument("--policy", default="pollux", choices=POLICIES)
    ap.add_argument("--cluster", default=None,
                    help="a typed cluster, e.g. sia-heterogeneous (default: the one-type "
                         "cluster of 16 x 4 GPUs)")
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
    result = simulate(args.workload, args.policy, timeline=True, cluster=args.cluster,
                      policy_options=parse_options(",".join(args.policy_option),
                                                   "--policy-option") or None)
    print(f"{args.policy} {args.workload}: t (s), cluster GPUs, " + ", ".join(args.show))
    for t, total, held in changes(result["timeline"], args.show, args.start, args.end):
        used = f"{total:4d}" if isinstance(total, int) else \
            " ".join(f"{n:2d}{kind}" for kind, n in sorted(total.items()))
        print(f"{t:8.0f} {used}  " + "  ".join(_held(g) for g in held))
    for name in args.show:
        print(f"{name}: submitted at {rows[name].time:.0f} s, JCT {result['jcts'][name]:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
