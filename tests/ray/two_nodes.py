"""A head and one worker as a ``ray.cluster_utils.Cluster`` of this process, joined by it:
the set-up of the scenarios whose worker node is drained or lost (each runs in its own
process: a test process already connected to the session's Ray cannot join another
cluster)."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

_STORE = 100 * 2**20  # object store bytes per node: the scenarios move small checkpoints


@contextlib.contextmanager
def two_nodes(head_cpus: int, worker_cpus: int) -> Iterator[tuple[Any, Any]]:
    """Start the cluster, join it (``log_to_driver=False``), yield ``(cluster, worker)``;
    leave and shut it down afterwards."""
    import ray
    from ray.cluster_utils import Cluster
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": head_cpus, "include_dashboard": False, "object_store_memory": _STORE})
    try:
        worker = cluster.add_node(num_cpus=worker_cpus, object_store_memory=_STORE)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False)
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
