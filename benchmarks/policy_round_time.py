"""Decision time per round at scale, pollux vs adaptdl, and what the adaptdl policy adds.

Simulates a synthetic workload (``synthetic_workload(JOBS, NODES)``, 4 GPUs per node) for
``--max-time`` simulated seconds under each policy, one after the other in this process,
and prints per policy the decision time per round (the simulator's: the whole decision
core, median / p99 / max) and the time inside ``PolluxPolicy.allocate`` (the solver). For
``adaptdl`` also the time inside ``RemainingWorkPolicy.allocate``, which wraps the solver:
the difference is what the remaining-work weights and the admission cost.

    nice -n 5 python benchmarks/policy_round_time.py --jobs 2000 --nodes 256 --max-time 7200
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from adaptdl_core.policy import PolluxPolicy, RemainingWorkPolicy  # noqa: E402
from adaptdl_core.sim.cluster import simulate, synthetic_workload  # noqa: E402


def _timed(cls, log):
    """Wrap ``cls.allocate`` so that each call's wall time is appended to ``log``."""
    inner = cls.allocate

    def allocate(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return inner(self, *args, **kwargs)
        finally:
            log.append(time.perf_counter() - t0)

    cls.allocate = allocate
    return inner


def _ms(values) -> str:
    if not values:
        return "-"
    v = 1e3 * np.asarray(values)
    return f"{np.median(v):.0f} / {np.percentile(v, 99):.0f} / {v.max():.0f}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=2000)
    ap.add_argument("--nodes", type=int, default=256)
    ap.add_argument("--max-time", type=float, default=7200.0,
                    help="simulated seconds per policy")
    ap.add_argument("--policies", nargs="+", choices=["pollux", "adaptdl"],
                    default=["adaptdl", "pollux"])
    args = ap.parse_args(argv)
    if args.jobs < 1 or args.nodes < 1 or not args.max_time > 0:
        ap.error("--jobs and --nodes must be >= 1 and --max-time > 0")
    workload = synthetic_workload(args.jobs, args.nodes)
    print(f"{args.jobs} jobs on {args.nodes} x 4 GPUs, {args.max_time:.0f} simulated s; "
          "ms per round, median / p99 / max")
    for policy in args.policies:
        solver, wrapper = [], []
        originals = (_timed(PolluxPolicy, solver), _timed(RemainingWorkPolicy, wrapper))
        try:
            r = simulate(workload, policy, nodes=args.nodes, max_time=args.max_time)
        finally:
            PolluxPolicy.allocate, RemainingWorkPolicy.allocate = originals
        d = r["decision_s"]
        print(f"{policy:8s} round {1e3 * d['median']:.0f} / {1e3 * d['p99']:.0f} / "
              f"{1e3 * d['max']:.0f}; solver {_ms(solver)}; adaptdl policy {_ms(wrapper)}; "
              f"{r['completed']} jobs done, wall {r['wall_s']:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
