"""Run one AdaptDL trial on a 2-node ``ray.cluster_utils.Cluster`` (a separate Ray
instance, hence a separate process from the test session) and print a JSON summary.

Each node has 2 CPUs; the trial starts on 1 replica and is scripted to grow to 3 in place,
so that it spans both nodes: its checkpoint moves between nodes through the object store.
Batches are slow until the policy has run its script (a file the policy touches), so the
grow lands inside training however loaded the machine, and the trial then ends at once.

Usage: python -m tests.ray.two_node_run RECORD_DIR STORAGE_DIR
"""

from __future__ import annotations

import json
import os
import sys

import ray
from ray import tune
from ray.cluster_utils import Cluster

from adaptdl_ray.tune import AdaptDLScheduler, AdaptDLTrainableCreator
from tests.ray.test_tune_trials import ScriptedPolicy, always_resize
from tests.ray.trial_jobs import counting_job


EPOCHS = 20


def main(record_dir: str, storage_dir: str) -> None:
    done = os.path.join(storage_dir, "script-done")
    os.makedirs(storage_dir, exist_ok=True)
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "include_dashboard": False, "object_store_memory": 100 * 2**20})
    cluster.add_node(num_cpus=2, object_store_memory=100 * 2**20)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        scheduler = AdaptDLScheduler(allocation_interval_s=1.0,
                                     policy=ScriptedPolicy(1, [3], done_file=done),
                                     resize_rule=always_resize)
        analysis = tune.run(
            AdaptDLTrainableCreator(counting_job, max_replicas=3), scheduler=scheduler,
            storage_path=storage_dir, verbose=0,
            config={"record_dir": record_dir, "epochs": EPOCHS, "size": 240, "batch_size": 12,
                    "sleep": 0.1, "report_every": 5, "slow_until": done})
        trial = analysis.trials[0]
        print(json.dumps({"status": trial.status, "trial_id": trial.trial_id,
                          "num_nodes": len(ray.nodes()),
                          "script_done": os.path.exists(done),
                          "history": scheduler.state.jobs[trial.trial_id].history}))
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
