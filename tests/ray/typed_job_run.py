"""A submitted job's driver on a two-node cluster of its own whose nodes carry two
accelerator types (fake ones: the ``accelerator_type:typeA`` / ``typeB`` resources on
CPU nodes): a scripted policy places the job's 2 replicas on the typeA node, then, once
launch 0 has trained a few batches, on the typeB node. The job must move (checkpoint,
relaunch on typeB) and finish, every sample trained exactly once.

Batches are slow until the policy has seen the job run on typeB (a file it touches), so
the move lands inside training however loaded the machine, and the job then ends at once.

Run as ``python -m tests.ray.typed_job_run STORAGE RECORD_DIR`` (its own process: a test
process already connected to the session's Ray cannot join another cluster). Prints one
JSON line: the job's exit status, the node id of each type, and each launch's replicas'
nodes (from the replicas' own start records).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from pathlib import Path

from adaptdl_core.decision import JobSpec
from tests.core.harness import read_events
from tests.ray.cluster_resize_job import JOB_SCRIPT
from tests.ray.drain_job_run import batches
from tests.ray.typed_policy import TypeSwitchPolicy, file_switch

EPOCHS, SIZE, BATCH, SLEEP_S = 4, 192, 8, 0.2
# Batches launch 0 trains on typeA before the policy is told to move the job.
BATCHES_BEFORE_MOVE = 3
_STORE = 100 * 2**20


def main(storage: str, record_dir: str) -> int:
    import ray
    from ray.cluster_utils import Cluster

    from adaptdl_ray.cluster.elastic_job import ElasticJob
    from adaptdl_ray.cluster.job_files import JobFiles
    from adaptdl_ray.cluster.sizing import CoreSizer

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    record = Path(record_dir)
    switch, done = os.path.join(storage, "switch"), os.path.join(storage, "moved")
    os.makedirs(storage, exist_ok=True)
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "include_dashboard": False, "object_store_memory": _STORE,
        "resources": {"accelerator_type:typeA": 1}})
    try:
        cluster.add_node(num_cpus=2, object_store_memory=_STORE,
                         resources={"accelerator_type:typeB": 1})
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=True)
        types = {}
        for node in ray.nodes():
            for key in node["Resources"]:
                if key.startswith("accelerator_type:"):
                    types[key.split(":", 1)[1]] = node["NodeID"]
        spec = JobSpec({"CPU": 1}, 1, 2)
        sizer = CoreSizer("typed", spec, interval_s=1.0)
        sizer.core.policy = TypeSwitchPolicy("typeA", "typeB", 2, file_switch(switch),
                                             done_file=done)
        job = ElasticJob(JobFiles("typed", storage), JOB_SCRIPT,
                         ["--record", record_dir, "--epochs", str(EPOCHS), "--size",
                          str(SIZE), "--batch-size", str(BATCH), "--sleep", str(SLEEP_S),
                          "--slow-until", done, "--record-node"],
                         spec, sizer=sizer, status_every_s=0.5, checkpoint_interval_s=None)
        status: list[int] = []
        runner = threading.Thread(target=lambda: status.append(job.run()), daemon=True)
        runner.start()
        until = time.time() + 240
        while batches(record, 0) < BATCHES_BEFORE_MOVE and runner.is_alive() and \
                time.time() < until:
            time.sleep(0.05)
        open(switch, "w").close()
        runner.join(timeout=max(until + 120 - time.time(), 1.0))
        launches: dict[str, list] = {}
        for e in read_events(record):
            if e["event"] == "start":
                launches.setdefault(str(e["restart"]), []).append(e.get("node"))
        print(json.dumps({"status": status[0] if status else None, "types": types,
                          "launches": launches, "moved": os.path.exists(done),
                          "resizes": [{k: r.get(k) for k in ("from", "to", "reason")}
                                      for r in sizer.core.record("typed").resize_log]}),
              flush=True)
        return 0
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
