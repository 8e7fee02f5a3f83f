"""A Tune driver for the interrupt test: ``run`` starts a 2-trial sweep (to be interrupted
with SIGINT), ``restore`` resumes it with ``Tuner.restore(..., resume_unfinished=True)``
and prints a JSON summary as its last line.

    python -m tests.ray.interrupt_run run|restore STORAGE RECORDS [JOB]

JOB: ``contract`` (default; :func:`~tests.ray.trial_jobs.contract_job`), or ``validating``
/ ``validating-nopause`` (:func:`~tests.ray.trial_jobs.validating_job`: autoscaled
training, a validation loader, a ``model.pt`` checkpoint per epoch, with or without a
0.5 s pause after each report).
"""

from __future__ import annotations

import glob
import json
import os
import sys
import time

import ray
from ray import tune

from adaptdl_ray.tune import AdaptDLScheduler, AdaptDLTrainableCreator
from tests.ray.trial_jobs import contract_job, validating_job

NAME = "interrupted"
JOBS = {
    # 12 epochs: the interrupt comes after epoch 1, and on a loaded machine (2 cores, load
    # 8) a trial finished 4 more epochs of 0.6 s before it saved; nothing was then left to
    # resume and the test failed, on the base commit too.
    "contract": (contract_job, {"epochs": 12, "size": 96, "batch_size": 8, "sleep": 0.05}),
    # The trials start together, so that both are training when the first interrupt
    # comes (under load one trial's start can lag behind the other's whole run).
    "validating": (validating_job, {"epochs": 12, "size": 48, "val_size": 40,
                                    "batch_size": 8, "sleep": 0.02, "pause": 0.5,
                                    "start_together": True}),
    "validating-nopause": (validating_job, {"epochs": 12, "size": 48, "val_size": 40,
                                            "batch_size": 8, "sleep": 0.02, "pause": 0.0,
                                            "start_together": True}),
}


def main(mode: str, storage: str, records: str, job: str = "contract") -> None:
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": os.environ.get("PYTHONPATH", "")}})
    fn, config = JOBS[job]
    trainable = AdaptDLTrainableCreator(fn, stop_timeout_s=60)
    if mode == "run":
        dirs = []
        for i in range(2):
            os.makedirs(os.path.join(records, str(i)), exist_ok=True)
            dirs.append(os.path.join(records, str(i)))
        tuner = tune.Tuner(
            trainable, param_space={**config, "record_dir": tune.grid_search(dirs)},
            tune_config=tune.TuneConfig(scheduler=AdaptDLScheduler()),
            run_config=tune.RunConfig(name=NAME, storage_path=storage, verbose=0))
    else:
        tuner = tune.Tuner.restore(os.path.join(storage, NAME), trainable,
                                   resume_unfinished=True)
    started = time.time()
    grid = tuner.fit()
    # The first report of a resumed launch, from the trials' own records.
    firsts = []
    for r in grid if mode == "restore" else ():
        for path in glob.glob(os.path.join(r.config["record_dir"], "restart*-rank0.jsonl")):
            with open(path) as f:
                events = [json.loads(line) for line in f]
            firsts += [e["time"] for e in events
                       if e["event"] == "report" and e["time"] >= started]
    # Printed by every launch: an interrupted one says which trials had finished.
    print(json.dumps({
        "statuses": sorted("TERMINATED" if r.error is None and r.metrics.get("done")
                           else "UNFINISHED" for r in grid),
        "trials": [{"record_dir": r.config["record_dir"], "path": r.path} for r in grid],
        "epochs": config["epochs"], "size": config["size"],
        "first_result_after_s": min(firsts) - started if firsts else None}), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:5])
