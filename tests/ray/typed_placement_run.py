"""A submitted job, then a Tune trial, on a two-node cluster of their own whose nodes carry
two accelerator types (fake ones on CPU nodes, named both ways Ray names a type: typeA by
the ``accelerator_type:typeA`` resource, typeB only by the ``ray.io/accelerator-type``
label, so replicas placed on typeB ask for it by a label selector), each placed and
moved by a scripted policy (:class:`~tests.ray.typed_policy.TypeSwitchPolicy`); both share
the cluster's start.

* The job (an ``ElasticJob``, 2 replicas) starts on the typeA node (the head) and, once
  launch 0 has trained a few batches, is moved to the typeB node: checkpoint, relaunch on
  typeB, finish.
* The trial (``AdaptDLScheduler`` with the scripted policy, 2 replicas) starts on the typeB
  node (its first placement-group request names the type its first solve chose; the head,
  of typeA, has room too) and, once launch 0 has trained a few batches, is moved to typeA:
  paused at its next result, relaunched with a typeA request, finished.

Each trains every sample exactly once. Batches are slow until the policy has seen the
job or trial run on its second type (a file it touches), so the move lands inside
training however loaded the machine, and the rest then goes at once.

Run as ``python -m tests.ray.typed_placement_run STORAGE RECORD_DIR TRIAL_RECORD_DIR``
(its own process: a test process already connected to the session's Ray cannot join
another cluster). Prints one JSON line: the node id of each type, and for the job and
the trial, each launch's replicas' nodes (from the replicas' own start records), whether
the policy saw the move done and the resizes.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Callable

from adaptdl_core.decision import JobSpec
from tests.core.harness import read_events
from tests.exactly_once import launch_of
from tests.ray.cluster_resize_job import JOB_SCRIPT
from tests.ray.drain_job_run import batches
from tests.ray.interrupt_scenario import records
from tests.ray.typed_policy import TypeSwitchPolicy, file_switch

EPOCHS, SIZE, BATCH, SLEEP_S = 4, 192, 8, 0.2
TRIAL_EPOCHS, TRIAL_SIZE = 3, 96
# Batches launch 0 trains on its first type before the policy is told to move it.
BATCHES_BEFORE_MOVE = 3
_STORE = 100 * 2**20


def _switch_after(count_batches: Callable[[], int], switch: str, running: Callable[[], bool],
                  until: float) -> None:
    """Touch ``switch`` once launch 0 trained :data:`BATCHES_BEFORE_MOVE` batches (or it
    ended, or ``until`` passed)."""
    while count_batches() < BATCHES_BEFORE_MOVE and running() and time.time() < until:
        time.sleep(0.05)
    open(switch, "w").close()


def launch_nodes(events: list[dict]) -> dict[str, list]:
    """launch (restart number, as a string) -> the node id of each of its replicas, from
    their start records (a job's or a trial's: see :func:`tests.exactly_once.launch_of`)."""
    launches: dict[str, list] = {}
    for e in events:
        if e["event"] == "start":
            launches.setdefault(str(launch_of(e)), []).append(e.get("node"))
    return launches


def run_job(storage: str, record_dir: str) -> dict:
    """The submitted job, typeA then typeB; what its records and its core saw."""
    from adaptdl_ray.cluster.elastic_job import ElasticJob
    from adaptdl_ray.cluster.job_files import JobFiles
    from adaptdl_ray.cluster.sizing import CoreSizer

    record = Path(record_dir)
    os.makedirs(storage, exist_ok=True)
    switch, done = os.path.join(storage, "switch"), os.path.join(storage, "moved")
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
    _switch_after(lambda: batches(record, 0), switch, runner.is_alive, until)
    runner.join(timeout=max(until + 120 - time.time(), 1.0))
    return {"status": status[0] if status else None,
            "launches": launch_nodes(read_events(record)),
            "moved": os.path.exists(done),
            "resizes": [{k: r.get(k) for k in ("from", "to", "reason")}
                        for r in sizer.core.record("typed").resize_log]}


def run_trial(storage: str, record_dir: str) -> dict:
    """The Tune trial, typeB then typeA; what its records and the scheduler saw."""
    from ray import tune

    from adaptdl_ray.tune import AdaptDLScheduler, AdaptDLTrainableCreator
    from tests.ray.trial_jobs import counting_job

    switch, done = os.path.join(storage, "switch"), os.path.join(storage, "moved")
    os.makedirs(storage, exist_ok=True)
    scheduler = AdaptDLScheduler(
        allocation_interval_s=1.0, cluster_allocator=False, resize_cost_prior_s=1.0,
        policy=TypeSwitchPolicy("typeB", "typeA", 2, file_switch(switch), done_file=done))
    finished = threading.Event()
    watcher = threading.Thread(target=_switch_after, daemon=True, args=(
        lambda: sum(1 for e in records(record_dir)
                    if e["event"] == "batch" and e["restarts"] == 0),
        switch, lambda: not finished.is_set(), time.time() + 240))
    watcher.start()
    try:
        analysis = tune.run(
            AdaptDLTrainableCreator(counting_job, min_replicas=2, max_replicas=2,
                                    stop_timeout_s=60),
            scheduler=scheduler, storage_path=storage, verbose=0,
            config={"record_dir": record_dir, "epochs": TRIAL_EPOCHS, "size": TRIAL_SIZE,
                    "batch_size": BATCH, "sleep": SLEEP_S, "report_every": 2,
                    "slow_until": done, "record_node": True})
    finally:
        finished.set()
    trial = analysis.trials[0]
    return {"status": trial.status, "failures": trial.num_failures,
            "launches": launch_nodes(records(record_dir)),
            "moved": os.path.exists(done),
            "resizes": [{k: r.get(k) for k in ("from", "to", "reason")}
                        for r in scheduler.state.jobs[trial.trial_id].resize_log]}


def main(storage: str, record_dir: str, trial_record_dir: str) -> int:
    import ray
    from ray.cluster_utils import Cluster

    from adaptdl_ray.replicas.nodes import ACCELERATOR_LABEL, node_accelerator_type

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    os.makedirs(storage, exist_ok=True)
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "include_dashboard": False, "object_store_memory": _STORE,
        "resources": {"accelerator_type:typeA": 1}})
    try:
        cluster.add_node(num_cpus=2, object_store_memory=_STORE,
                         labels={ACCELERATOR_LABEL: "typeB"})
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=True)
        types = {node_accelerator_type(node): node["NodeID"] for node in ray.nodes()}
        seen = {"types": types, "job": run_job(os.path.join(storage, "job"), record_dir)}
        seen["trial"] = run_trial(os.path.join(storage, "trial"), trial_record_dir)
        print(json.dumps(seen, default=str), flush=True)
        return 0
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], sys.argv[3]))
