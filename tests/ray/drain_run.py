"""Run by ``test_draining_nodes.py`` in its own process (a two-node Ray cluster of its
own, which a test process already connected to the session's Ray cannot join): drains the
worker node as a spot node's notice would, and prints what adaptdl_ray saw as JSON."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from adaptdl_ray.replicas._ray_private import draining_nodes
from adaptdl_ray.replicas.nodes import cluster_nodes
from tests.ray.two_nodes import two_nodes


@ray.remote(num_cpus=1)
class Busy:
    """Work on the node (an idle node that is drained exits at once)."""

    def node(self):
        return ray.get_runtime_context().get_node_id()


def main() -> None:
    with two_nodes(1, 2) as (cluster, worker):
        busy = Busy.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
            worker.node_id, soft=False)).remote()
        on_worker = ray.get(busy.node.remote(), timeout=60) == worker.node_id
        before = {"draining": draining_nodes(), "nodes": sorted(cluster_nodes())}
        asked = time.time()
        drain = subprocess.run(
            [sys.executable, "-m", "ray.scripts.scripts", "drain-node", "--address",
             cluster.address, "--node-id", worker.node_id, "--reason",
             "DRAIN_NODE_REASON_PREEMPTION", "--reason-message", "spot notice",
             "--deadline-remaining-seconds", "120"], capture_output=True, text=True,
            timeout=60)
        listed = ray.nodes()
        drained = draining_nodes()
        print(json.dumps({
            "worker": worker.node_id, "head": cluster.head_node.node_id,
            "on_worker": on_worker, "before": before, "asked": asked,
            "drain_rc": drain.returncode, "drain_err": drain.stderr[-2000:],
            "draining": drained, "nodes": sorted(cluster_nodes()),
            "given_list": sorted(cluster_nodes(listed)),
            "given_list_and_drains": sorted(cluster_nodes(listed, draining=drained))}))


if __name__ == "__main__":
    main()
