"""A node Ray is draining (a spot node given its preemption notice) is seen at once and
left out of the cluster every decision places work on."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: E402

from adaptdl_ray.tune._ray_private import draining_nodes  # noqa: E402
from adaptdl_ray.tune.resources import cluster_nodes  # noqa: E402


@pytest.fixture
def two_nodes():
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    worker = cluster.add_node(num_cpus=2)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, logging_level="ERROR")
    try:
        yield cluster, worker
    finally:
        ray.shutdown()
        cluster.shutdown()


@ray.remote(num_cpus=1)
class Busy:
    """Work on the node (an idle node that is drained exits at once)."""

    def node(self):
        return ray.get_runtime_context().get_node_id()


def test_a_draining_node_is_left_out_with_its_deadline(two_nodes):
    cluster, worker = two_nodes
    busy = Busy.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
        worker.node_id, soft=False)).remote()
    assert ray.get(busy.node.remote(), timeout=60) == worker.node_id
    assert draining_nodes() == {}
    assert worker.node_id in cluster_nodes() and len(cluster_nodes()) == 2
    deadline = time.time() + 120
    drain = subprocess.run(
        [sys.executable, "-m", "ray.scripts.scripts", "drain-node", "--address",
         cluster.address, "--node-id", worker.node_id, "--reason",
         "DRAIN_NODE_REASON_PREEMPTION", "--reason-message", "spot notice",
         "--deadline-remaining-seconds", "120"], capture_output=True, text=True, timeout=60)
    assert drain.returncode == 0, drain.stderr[-2000:]
    drained = draining_nodes()
    assert set(drained) == {worker.node_id}
    assert abs(drained[worker.node_id] - deadline) < 10
    nodes = cluster_nodes()
    assert worker.node_id not in nodes and len(nodes) == 1
    # Given a node list, the drains are only those named.
    listed = ray.nodes()
    assert len(cluster_nodes(listed)) == 2
    assert len(cluster_nodes(listed, draining=drained)) == 1
