"""Command line of the simulator: ``python -m adaptdl_core.sim cluster ...``.

Prints a one-line summary and, with ``--out``, writes the full result (see
:func:`adaptdl_core.sim.cluster.simulate`) as JSON.

``cluster --autoscale --min-nodes N --max-nodes M [--autoscale-rule goodput|throughput]``
sizes the cluster by a cluster-size rule; ``--node-startup-s``, ``--node-hour-cost``,
``--preemptions-per-node-hour`` and ``--preemption-notice-s`` (with or without
``--autoscale``) model cloud nodes and spot preemptions (:mod:`adaptdl_core.sim.autoscale`).
Without any of these options the cluster is fixed and the result is as before.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import List, Optional

from .autoscale import (DEFAULT_CHECKPOINT_S, DEFAULT_NODE_STARTUP_S,
                        DEFAULT_PREEMPTION_NOTICE_S, RULES, ElasticSettings)
from .cluster import POLICIES, simulate, synthetic_workload
from .output import check_out_path, save_result
from .sweep import add_sweep_parser, run_sweep_cli


def _cluster_parser(sub) -> None:
    p = sub.add_parser("cluster", help="simulate a workload of jobs on a GPU cluster")
    p.add_argument("--workload", help="workload CSV, or a vendored name such as "
                   "load-1.0/workload-3 (required unless --synthetic)")
    p.add_argument("--synthetic", type=int, metavar="JOBS",
                   help="instead of --workload: JOBS jobs with load-1.0/workload-1's "
                   "application mix and arrival pattern scaled to --nodes")
    p.add_argument("--policy", choices=POLICIES, required=True)
    p.add_argument("--traces", help="traces folder (default: the vendored traces)")
    p.add_argument("--out", help="write the result JSON here")
    p.add_argument("--interval", type=float, default=60.0, help="seconds per round")
    p.add_argument("--restart-s", type=float,
                   help="seconds without progress per start or change of allocation "
                   "(default 30; on a --cluster each model's own delay)")
    p.add_argument("--nodes", type=int, help="nodes of the default cluster (default 16)")
    p.add_argument("--gpus-per-node", type=int,
                   help="GPUs per node of the default cluster (default 4)")
    p.add_argument("--cluster", metavar="NAME_OR_FILE",
                   help="a cluster of several GPU types instead: sia-heterogeneous (6 t4 + "
                   "3 rtx + 2 a100 nodes), sia-homogeneous (16 t4 nodes), or a .json/.toml "
                   "file listing node groups (docs/mixed_clusters.md)")
    p.add_argument("--no-calibration", action="store_true",
                   help="--cluster: train at the traced speed (default: slowed by each "
                   "model's calibration factor, as the Sia simulator)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--interference", type=float, default=0.0,
                   help="slowdown of multi-node jobs sharing a node (0..1)")
    p.add_argument("--max-time", type=float, help="stop after this many simulated seconds")
    p.add_argument("--no-core", action="store_true",
                   help="pollux: call PolluxPolicy directly instead of the decision core")
    p.add_argument("--policy-option", action="append", default=[], metavar="KEY=VALUE",
                   help="adaptdl: an option of RemainingWorkPolicy, e.g. alpha=1 (repeatable)")
    e = p.add_argument_group("elastic cluster (any of these: the result adds node_hours, "
                             "cost, preemptions and elastic)")
    e.add_argument("--autoscale", action="store_true",
                   help="size the cluster by a cluster-size rule, starting at --min-nodes")
    e.add_argument("--min-nodes", type=int, help="autoscale: fewest nodes (default 1)")
    e.add_argument("--max-nodes", type=int, help="autoscale: most nodes (default --nodes)")
    e.add_argument("--autoscale-rule", metavar="RULE",
                   help=f"autoscale: {' or '.join(RULES)} (default goodput)")
    e.add_argument("--autoscale-every", type=int, metavar="ROUNDS",
                   help="autoscale: rounds between decisions (default 1)")
    e.add_argument("--node-startup-s", type=float,
                   help=f"seconds from asking for a node to its use (default "
                   f"{DEFAULT_NODE_STARTUP_S:g})")
    e.add_argument("--node-hour-cost", type=float,
                   help="cost of a node for an hour (default 1: cost = node-hours)")
    e.add_argument("--preemptions-per-node-hour", type=float,
                   help="spot preemptions per node-hour (default 0)")
    e.add_argument("--preemption-notice-s", type=float,
                   help=f"seconds of notice before a preemption (default "
                   f"{DEFAULT_PREEMPTION_NOTICE_S:g})")
    e.add_argument("--checkpoint-s", type=float,
                   help=f"seconds between a job's checkpoints, for preemptions without "
                   f"enough notice (default {DEFAULT_CHECKPOINT_S:g})")


_ELASTIC_FLAGS = {"autoscale_rule": "rule", "node_startup_s": "node_startup_s",
                  "node_hour_cost": "node_hour_cost", "min_nodes": "min_nodes",
                  "max_nodes": "max_nodes", "autoscale_every": "autoscale_every",
                  "preemptions_per_node_hour": "preemptions_per_node_hour",
                  "preemption_notice_s": "preemption_notice_s",
                  "checkpoint_s": "checkpoint_s"}


def elastic_settings(args: argparse.Namespace) -> Optional[ElasticSettings]:
    """The :class:`ElasticSettings` of the ``cluster`` options, ``None`` when none is given
    (a fixed cluster).

    Raises:
        ValueError: a malformed value (named, with the fix).
    """
    given = {field: getattr(args, flag) for flag, field in _ELASTIC_FLAGS.items()
             if getattr(args, flag) is not None}
    if not args.autoscale and not given:
        return None
    return ElasticSettings(autoscale=bool(args.autoscale), **given)


def main(argv: Optional[List[str]] = None) -> int:
    """Run the command line; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m adaptdl_core.sim",
                                     description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    _cluster_parser(sub)
    add_sweep_parser(sub)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.command == "sweep":
        return run_sweep_cli(args)
    if args.command == "cluster":
        if (args.workload is None) == (args.synthetic is None):
            parser.error("cluster: give exactly one of --workload FILE and --synthetic JOBS")
        options = {}
        for item in args.policy_option:
            key, sep, value = item.partition("=")
            try:
                options[key] = float(value) if sep else None
            except ValueError:
                options[key] = None
            if options[key] is None:
                parser.error(f"--policy-option {item!r}: give KEY=NUMBER, e.g. alpha=1")
        if args.cluster is not None and (args.nodes is not None
                                         or args.gpus_per_node is not None):
            parser.error("cluster: --cluster gives the nodes; drop --nodes/--gpus-per-node")
        if args.cluster is None and args.no_calibration:
            parser.error("cluster: --no-calibration applies to a --cluster only")
        nodes = 16 if args.nodes is None else args.nodes
        gpus_per_node = 4 if args.gpus_per_node is None else args.gpus_per_node
        try:
            if args.out:
                check_out_path(args.out)
            elastic = elastic_settings(args)
            workload = (args.workload if args.workload is not None
                        else synthetic_workload(args.synthetic, nodes, seed=args.seed))
            result = simulate(workload, args.policy, traces=args.traces,
                              interval=args.interval, restart_s=args.restart_s,
                              nodes=nodes, gpus_per_node=gpus_per_node,
                              seed=args.seed, interference=args.interference,
                              max_time=args.max_time,
                              use_core=False if args.no_core else None,
                              policy_options=options or None, elastic=elastic,
                              cluster=args.cluster, calibrate=not args.no_calibration)
        except (ValueError, FileNotFoundError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        if args.synthetic is not None:
            result["workload"] = f"synthetic-{args.synthetic}x{nodes}n-seed{args.seed}"
        print(f"{result['policy']} {result['workload']}: avg JCT {result['avg_jct']:.0f} s, "
              f"p99 {result['p99_jct']:.0f} s, makespan {result['makespan']:.0f} s, "
              f"{result['completed']}/{result['num_jobs']} jobs, {result['gpu_hours']:.1f} "
              f"GPU-h, decision median {result['decision_s']['median'] * 1e3:.1f} ms "
              f"max {result['decision_s']['max'] * 1e3:.1f} ms, wall {result['wall_s']:.1f} s")
        if "gpu_hours_by_type" in result:
            print(f"cluster {result['cluster']}: GPU-h by type " + ", ".join(
                f"{t} {h:.1f}" for t, h in sorted(result["gpu_hours_by_type"].items())))
        if "node_hours" in result:
            print(f"cluster: {result['node_hours']:.2f} node-h, cost {result['cost']:.2f}, "
                  f"{result['preemptions']} preemptions, peak "
                  f"{result['elastic']['peak_nodes']} nodes, mean "
                  f"{result['elastic']['mean_nodes']:.2f}")
        if args.out:
            return save_result(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
