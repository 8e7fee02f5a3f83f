"""A head and one worker as a ``ray.cluster_utils.Cluster`` of this process, joined by it:
the set-up of the scenarios whose worker node is drained or lost (each runs in its own
process: a test process already connected to the session's Ray cannot join another
cluster)."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

_STORE = 100 * 2**20  # object store bytes per node: the scenarios move small checkpoints
# A node that vanishes is declared dead after this many failed health checks, one a second
# (Ray's defaults, 5 every 3 s, leave a lost-node scenario idle for about 15 s). A live
# raylet answers within the check's 10 s timeout even on a loaded machine, so three misses
# in a row mean a dead node, not a slow one.
HEALTH_CHECKS = {"health_check_period_ms": 1000, "health_check_failure_threshold": 3}


@contextlib.contextmanager
def two_nodes(head_cpus: int, worker_cpus: int,
              log_to_driver: bool = False) -> Iterator[tuple[Any, Any]]:
    """Start the cluster (no dashboard, :data:`HEALTH_CHECKS`), join it, yield ``(cluster,
    worker)``; leave and shut it down afterwards. ``log_to_driver``: the workers' output
    comes to this process's terminal."""
    import ray
    from ray.cluster_utils import Cluster
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": head_cpus, "include_dashboard": False, "object_store_memory": _STORE,
        "_system_config": HEALTH_CHECKS})
    try:
        worker = cluster.add_node(num_cpus=worker_cpus, object_store_memory=_STORE)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=log_to_driver)
        yield cluster, worker
    finally:
        ray.shutdown()
        cluster.shutdown()


def summary_of(stdout: str) -> dict:
    """The JSON summary a scenario prints: its last line that is a JSON object (Ray may
    print a removed node's last log lines after it).

    Raises:
        ValueError: no line of ``stdout`` is a JSON object."""
    import json
    for line in reversed(stdout.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise ValueError(f"no JSON summary in the scenario's output: {stdout[-500:]!r}")
