"""One AdaptDL trial of 3 replicas on a two-node cluster of its own whose worker node,
holding one replica, vanishes without notice: the trial must continue from its newest
in-place checkpoint in the same placement group (Ray places the lost bundle on the head),
repeating only the work since that checkpoint, with no failure counted.

The head has 3 CPUs, one held by a placeholder actor until the replicas run, and the
worker 1: the trial's placement group (PACK) puts bundles 0 and 1 on the head (the trial
actor runs in bundle 0) and bundle 2 on the worker. The placeholder then goes, so that
the head has room for the lost bundle.

With ``actor`` the trial has one replica, run in the trial actor, and the head's CPU is
held by the placeholder, so the trial actor itself runs on the worker: its loss is a Tune
failure, retried (``max_failures=1``) on the head once the placeholder goes, from the
in-place checkpoint the trial kept on the run's storage.

Run as ``python -m tests.ray.lost_node_trial_run STORAGE RECORD_DIR [INTERVAL_S [MODE]]``
(MODE ``actor``)
(its own process: a test process already connected to the session's Ray cannot join
another cluster). Prints one JSON line: the trial's status and failures, the replicas of
each launch, where the replicas of the first launch ran, the seconds from the node's
removal to the first step of the next launch, and the checkpoint interval.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time

from tests.ray.interrupt_scenario import records
from tests.ray.two_nodes import two_nodes

EPOCHS, SIZE, BATCH, SLEEP_S, REPLICAS = 3, 240, 12, 0.2, 3
# Steps before the loss: longer than three checkpoint intervals, so that without in-place
# checkpoints the repeated work would exceed one interval's.
STEPS_BEFORE_LOSS = 30


class Placeholder:
    """Holds CPUs of the head until killed."""

    def ready(self) -> bool:
        return True


def _wait_for_batches(record_dir: str, restarts: int, count: int, until: float) -> bool:
    """Whether ``count`` batches of launches with at least ``restarts`` restarts were
    trained before ``until``."""
    while time.time() < until:
        if len([e for e in records(record_dir)
                if e["event"] == "batch" and e["restarts"] >= restarts]) >= count:
            return True
        time.sleep(0.1)
    return False


def main(storage: str, record_dir: str, interval_s: float = 2.0, mode: str = "room") -> int:
    import ray
    from ray import tune
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from adaptdl_ray.tune import AdaptDLScheduler, AdaptDLTrainableCreator
    from tests.ray.trial_jobs import counting_job

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    seen: dict = {}
    replicas = 1 if mode == "actor" else REPLICAS
    # Batches sleep until the next launch has trained one, then go as fast as they can.
    fast = f"{record_dir.rstrip('/')}-continued"
    with two_nodes(1 if mode == "actor" else 3, 1) as (cluster, worker):
        placeholder = ray.remote(num_cpus=1)(Placeholder).options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(cluster.head_node.node_id,
                                                               soft=False)).remote()
        ray.get(placeholder.ready.remote())

        def lose_the_worker() -> None:
            until = time.time() + 180
            first: list = []  # every replica records each of its batches
            while len(first) < STEPS_BEFORE_LOSS * replicas and time.time() < until:
                time.sleep(0.1)
                first = [e for e in records(record_dir)
                         if e["event"] == "batch" and e["restarts"] == 0]
            seen["nodes_before"] = sorted({e.get("nodes") for e in records(record_dir)
                                           if e["event"] == "start"} - {None})
            ray.kill(placeholder)
            cluster.remove_node(worker, allow_graceful=False)
            lost_at = time.time()
            seen["steps_before_loss"] = len(first) // replicas
            if _wait_for_batches(record_dir, 1, 1, lost_at + 150):
                seen["loss_to_first_step_s"] = time.time() - lost_at
            open(fast, "w").close()

        watcher = threading.Thread(target=lose_the_worker, daemon=True)
        watcher.start()
        if mode == "actor":
            trainable = AdaptDLTrainableCreator(counting_job, min_replicas=1, max_replicas=1,
                                                stop_timeout_s=60,
                                                checkpoint_interval_s=interval_s)
            scheduler = AdaptDLScheduler(allocation_interval_s=1.0, cluster_allocator=False)
        else:
            trainable = AdaptDLTrainableCreator(counting_job, min_replicas=REPLICAS,
                                                max_replicas=REPLICAS, stop_timeout_s=60,
                                                checkpoint_interval_s=interval_s)
            scheduler = AdaptDLScheduler(allocation_interval_s=1.0, cluster_allocator=False)
        analysis = tune.run(
            trainable, scheduler=scheduler,
            storage_path=storage, verbose=0, raise_on_failed_trial=False,
            max_failures=1 if mode == "actor" else 0,
            config={"record_dir": record_dir, "size": SIZE,
                    "epochs": EPOCHS,
                    "batch_size": BATCH, "sleep": SLEEP_S, "report_every": 100,
                    "slow_until": fast})
        watcher.join(timeout=300)
        trial = analysis.trials[0]
        seen.update(status=trial.status, failures=trial.num_failures,
                    error=str(trial.error_file) if trial.error_file else None,
                    sizes={str(e["restarts"]): e["replicas"] for e in records(record_dir)
                           if e["event"] == "start"},
                    interval_s=interval_s)
        print(json.dumps(seen, default=str), flush=True)
        return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], *(float(a) for a in sys.argv[3:4]),
                  *sys.argv[4:5]))
