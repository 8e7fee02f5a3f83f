"""One AdaptDL trial under AdaptDLScheduler on a two-node cluster of its own whose worker
node is drained (a spot node's preemption notice) while the trial trains there with 2
replicas: the scheduler must pause it at a batch boundary and relaunch it on the head
(which holds 1 replica) before the deadline, then the worker is removed; every sample is
trained exactly once and no failure is counted.

Run as ``python -m tests.ray.drain_trial_run STORAGE RECORD_DIR [DEADLINE_S]`` (its own
process: a test process already connected to the session's Ray cannot join another
cluster). Prints one JSON line: the trial's status and failures, the replicas of each
launch, the seconds from the drain (``ray drain-node`` returned) to the first step of the
next launch, and the deadline.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
import time

from tests.ray.interrupt_scenario import records
from tests.ray.two_nodes import two_nodes

# Enough epochs that the trial is still training when the drain lands: starting the
# `ray drain-node` command takes seconds on a busy 2-core machine, a grow in place starts its
# new replica (torch imported) while the trial trains, and with fewer epochs a
# CI run once saw the trial finish on its 2 replicas before the move. (The epochs after the
# move cost little: the batches stop sleeping once the trial left the drained node.)
EPOCHS, SIZE = 12, 240


class GrowToTwo:
    """Every job gets as many replicas as the cluster's CPUs hold, at most 2, placed on
    the first node (the placement is Ray's; only the count matters here)."""

    def allocate(self, jobs, nodes, base_allocations=None, *, now=None):
        from adaptdl_core.policy import AllocationResult
        node = next(iter(nodes))
        cpus = int(sum(n.resources.get("CPU", 0) for n in nodes.values()))
        allocations = {key: [node] * min(2, cpus) for key in jobs}
        return AllocationResult(allocations, {k: float(len(v)) for k, v in allocations.items()},
                                1.0, 0, True, 0.0)


def grow_only(**kwargs):
    """Resizes that grow go ahead; a shrink never pays (only the drain moves the trial)."""
    from adaptdl_core.policy import ResizeVerdict
    return ResizeVerdict(kwargs["target"] > kwargs["current"], "grow only")


def launch_batches(record_dir: str, replicas: int) -> list[dict]:
    return [e for e in records(record_dir) if e["event"] == "batch" and e["replicas"] == replicas]


def main(storage: str, record_dir: str, deadline_s: float = 60.0) -> int:
    from ray import tune

    from adaptdl_ray.tune import AdaptDLScheduler, AdaptDLTrainableCreator
    from tests.ray.trial_jobs import counting_job

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    # The head holds one replica, the worker two: the 2-replica launch has one there.
    seen: dict = {}
    # Batches sleep until the trial trains off the drained node, then go as fast as they can.
    fast = f"{record_dir.rstrip('/')}-moved"
    with two_nodes(1, 2) as (cluster, worker):

        def drain_when_on_worker() -> None:
            until = time.time() + 180
            while len(launch_batches(record_dir, 2)) < 4 and time.time() < until:
                time.sleep(0.1)
            seen["two_replica_batches_before_drain"] = len(launch_batches(record_dir, 2))
            drain = subprocess.run(
                [sys.executable, "-m", "ray.scripts.scripts", "drain-node", "--address",
                 cluster.address, "--node-id", worker.node_id, "--reason",
                 "DRAIN_NODE_REASON_PREEMPTION", "--reason-message", "spot notice",
                 "--deadline-remaining-seconds", str(int(deadline_s))],
                capture_output=True, text=True, timeout=60)
            drained_at = time.time()
            seen.update(drain_rc=drain.returncode, drain_err=drain.stderr[-2000:])
            restarts = max(e["restarts"] for e in launch_batches(record_dir, 2))
            while time.time() < drained_at + 120:
                later = [e for e in records(record_dir)
                         if e["event"] == "batch" and e["restarts"] > restarts]
                if later:
                    seen["drain_to_first_step_s"] = time.time() - drained_at
                    break
                time.sleep(0.1)
            open(fast, "w").close()
            # The node is reclaimed once the trial left it.
            cluster.remove_node(worker)
            seen["removed"] = True

        watcher = threading.Thread(target=drain_when_on_worker, daemon=True)
        watcher.start()
        scheduler = AdaptDLScheduler(allocation_interval_s=1.0, policy=GrowToTwo(),
                                     resize_rule=grow_only, resize_cost_prior_s=1.0,
                                     cluster_allocator=False)
        analysis = tune.run(
            AdaptDLTrainableCreator(counting_job, max_replicas=2, stop_timeout_s=60),
            scheduler=scheduler, storage_path=storage, verbose=0,
            config={"record_dir": record_dir, "epochs": EPOCHS, "size": SIZE,
                    "batch_size": 12, "sleep": 0.15, "report_every": 100,
                    "slow_until": fast})
        watcher.join(timeout=130)
        trial = analysis.trials[0]
        seen.update(status=trial.status, failures=trial.num_failures,
                    sizes={str(e["restarts"]): e["replicas"] for e in records(record_dir)
                           if e["event"] == "start"},
                    resize_log=scheduler.state.jobs[trial.trial_id].resize_log,
                    deadline_s=deadline_s)
        print(json.dumps(seen, default=str), flush=True)
        return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], *(float(a) for a in sys.argv[3:4])))
