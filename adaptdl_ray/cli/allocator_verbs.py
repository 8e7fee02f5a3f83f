"""The verbs of the cluster allocator: ``start`` (and its autoscaling) and ``status``."""

from __future__ import annotations

import argparse
import datetime
import json
from typing import Any

from adaptdl_ray.cli.cluster import Cluster
from adaptdl_ray.cli.errors import PROG, CliError

__all__ = ["cmd_start", "cmd_status", "autoscale_options", "policy_option", "status_lines"]


def _client() -> Any:
    """The allocator's client module (imported when first needed: it imports Ray)."""
    from adaptdl_ray.cluster import client
    return client


def autoscale_options(opts: argparse.Namespace) -> dict[str, Any] | None:
    """``start``'s autoscaling options as the allocator takes them: a dict for
    ``--autoscale``, ``{}`` for ``--no-autoscale``, ``None`` when neither is given
    (leave the allocator's as they are).

    Raises:
        CliError: a missing or malformed option, naming it and the fix."""
    scale_args = ("min_nodes", "max_nodes", "node_template", "baseline_nodes")
    given = [a for a in scale_args if getattr(opts, a) is not None]
    if opts.no_autoscale:
        if opts.autoscale or given:
            raise CliError("--no-autoscale takes no other autoscaling option")
        return {}
    if not opts.autoscale:
        if given:
            raise CliError(f"--{given[0].replace('_', '-')} needs --autoscale")
        return None
    missing = [f"--{a.replace('_', '-')}" for a in scale_args[:3] if getattr(opts, a) is None]
    if missing:
        raise CliError(f"--autoscale needs {' '.join(missing)} (e.g. --min-nodes 1 "
                       "--max-nodes 8 --node-template '{\"CPU\": 8, \"GPU\": 1}')")
    try:
        template = json.loads(opts.node_template)
    except ValueError:
        raise CliError(f"--node-template must be JSON, e.g. '{{\"CPU\": 8}}', got "
                       f"{opts.node_template!r}") from None
    options = {"node_template": template, "min_nodes": opts.min_nodes,
               "max_nodes": opts.max_nodes}
    if opts.baseline_nodes is not None:
        options["baseline_nodes"] = opts.baseline_nodes
    try:
        _client().check_autoscale(options)
    except ValueError as exc:
        raise CliError(f"--autoscale: {exc}") from None
    return options


def policy_option(opts: argparse.Namespace) -> str | None:
    """``start``'s ``--policy`` (``None`` when not given: the allocator's default).

    Raises:
        CliError: a name that is no policy, naming the flag and the valid names."""
    from adaptdl_core.policy import POLICY_NAMES
    name = getattr(opts, "policy", None)
    if name is not None and name not in POLICY_NAMES:
        raise CliError(f"--policy {name!r}: must be one of {', '.join(POLICY_NAMES)} "
                       "(adaptdl weighs each job's remaining work and, on a cluster of "
                       "several accelerator types, places each job on one type)")
    return name


def cmd_start(opts: argparse.Namespace) -> int:
    """Start the cluster allocator (if it is not running) with ``--policy``'s policy; with
    ``--autoscale`` or ``--no-autoscale``, turn its autoscaling on or off."""
    import ray
    autoscale = autoscale_options(opts)
    policy = policy_option(opts)
    client = _client()
    Cluster.from_options(opts).connect()
    try:
        handle = client.start_allocator(opts.namespace, autoscale=autoscale,
                                        policy=policy or "pollux")
    except ValueError as exc:
        raise CliError(str(exc)) from None
    running = ray.get(handle.status.remote(), timeout=30).get("policy")
    if policy is not None and running != policy:
        raise CliError(f"the cluster allocator already runs with policy {running}: "
                       f"--policy {policy} applies when it starts (on a new Ray cluster)")
    print(f"the cluster allocator runs (namespace {client.namespace(opts.namespace)}), "
          f"policy {running}")
    if autoscale:
        print(f"autoscaling: {autoscale['min_nodes']} to {autoscale['max_nodes']} nodes of "
              f"{json.dumps(autoscale['node_template'])}")
    elif autoscale is not None:
        print("autoscaling: off (its request to Ray's autoscaler is withdrawn)")
    return 0


def status_lines(status: dict[str, Any]) -> list[str]:
    """The allocator's :meth:`status <adaptdl_ray.cluster.allocator.ClusterAllocator.status>`
    as a few lines for people."""
    started = datetime.datetime.fromtimestamp(float(status.get("started") or 0))
    nodes = status.get("nodes") or {}
    totals: dict[str, float] = {}
    for resources in nodes.values():
        for name, amount in resources.items():
            totals[name] = totals.get(name, 0.0) + float(amount)
    shared = ", ".join(f"{v:g} {k}" for k, v in sorted(totals.items())) or "nothing"
    last = status.get("last_solve_s")
    lines = [f"cluster allocator: running since {started:%Y-%m-%d %H:%M:%S} (pid "
             f"{status.get('pid')}), policy {status.get('policy', 'pollux')}",
             f"divides: {shared} on {len(nodes)} node(s), less what other work holds",
             f"front-ends: {status.get('members', 0)} (sweeps and jobs), "
             f"{status.get('jobs', 0)} job(s) and trial(s); {status.get('solves', 0)} "
             "re-divisions" + (f", the last in {1e3 * last:.0f} ms" if last is not None
                               else "")]
    scale = status.get("autoscale")
    if scale:
        options = scale.get("options") or {}
        decided = scale.get("last") or {}
        lines.append(f"autoscaling: {options.get('min_nodes')} to {options.get('max_nodes')} "
                     f"nodes of {json.dumps(options.get('node_template'))}; asking for "
                     f"{scale.get('standing_nodes') or 0} node(s)"
                     + (f" ({decided.get('reason')})" if decided.get("reason") else ""))
    else:
        lines.append(f"autoscaling: off (`{PROG} start --autoscale ...` turns it on)")
    lines.append(f"state kept in {status.get('state_dir')}")
    return lines


def cmd_status(opts: argparse.Namespace) -> int:
    """Show the cluster allocator's state (``--json``: all of it, for programs)."""
    import ray
    client = _client()
    Cluster.from_options(opts).connect()
    handle = client.get_allocator(opts.namespace, create=False)
    if handle is None:
        raise CliError(f"no cluster allocator runs (namespace "
                       f"{client.namespace(opts.namespace)}): start it with `{PROG} start`")
    status = ray.get(handle.status.remote(), timeout=30)
    if opts.json:
        print(json.dumps(status, indent=1, default=str))
    else:
        print("\n".join(status_lines(status)))
    return 0
