"""Decision time per round on a large cluster of four GPU types, the adaptdl policy.

Simulates a synthetic workload (``synthetic_workload(JOBS, GPUS / 4)``: the Pollux
workload's mix and arrival pattern at the same load per GPU) on a typed cluster of four
types with a quarter of the GPUs each (t4 and quad nodes of 4 GPUs, rtx and a100 nodes of
8), for ``--max-time`` simulated seconds, and prints the decision time per round (the
simulator's: the whole decision core, median / p99 / max), the time inside
``RemainingWorkPolicy.allocate`` and inside the type-aware ``TypedAllocator.allocate``.

    nice -n 5 python benchmarks/policy_round_time_mixed.py --jobs 2000 --gpus 1024
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from policy_round_time import _ms, _timed  # noqa: E402

from adaptdl_core.policy import RemainingWorkPolicy, TypedAllocator  # noqa: E402
from adaptdl_core.sim.cluster import simulate, synthetic_workload  # noqa: E402
from adaptdl_core.sim.gpu_types import ClusterSpec, NodeGroup  # noqa: E402


def mixed_cluster(gpus: int) -> ClusterSpec:
    """Four types, a quarter of ``gpus`` each."""
    quarter = gpus // 4
    return ClusterSpec(f"mixed-{gpus}", (NodeGroup("t4", quarter // 4, 4),
                                         NodeGroup("rtx", quarter // 8, 8),
                                         NodeGroup("a100", quarter // 8, 8),
                                         NodeGroup("quad", quarter // 4, 4)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=2000)
    ap.add_argument("--gpus", type=int, default=1024, help="a multiple of 32")
    ap.add_argument("--max-time", type=float, default=7200.0, help="simulated seconds")
    args = ap.parse_args(argv)
    if args.jobs < 1 or args.gpus < 32 or args.gpus % 32 or not args.max_time > 0:
        ap.error("--jobs >= 1, --gpus a multiple of 32 and --max-time > 0")
    spec = mixed_cluster(args.gpus)
    workload = synthetic_workload(args.jobs, args.gpus // 4)
    print(f"{args.jobs} jobs on {spec.describe()} ({spec.total_gpus} GPUs), "
          f"{args.max_time:.0f} simulated s; ms per round, median / p99 / max")
    wrapper, typed = [], []
    originals = (_timed(RemainingWorkPolicy, wrapper), _timed(TypedAllocator, typed))
    try:
        r = simulate(workload, "adaptdl", cluster=spec, max_time=args.max_time)
    finally:
        RemainingWorkPolicy.allocate, TypedAllocator.allocate = originals
    d = r["decision_s"]
    print(f"adaptdl  round {1e3 * d['median']:.0f} / {1e3 * d['p99']:.0f} / "
          f"{1e3 * d['max']:.0f}; policy {_ms(wrapper)}; typed allocator {_ms(typed)}; "
          f"{len(wrapper)} solves, {r['completed']} jobs done, wall {r['wall_s']:.0f} s",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
