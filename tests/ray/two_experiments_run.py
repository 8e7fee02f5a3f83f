"""Two experiments in one process, with Ray restarted between them (a notebook that
restarts Ray, a script looping over experiments): ``run_job`` on one local Ray, then
``Tuner.fit`` with AdaptDLScheduler on a fresh one. Prints one JSON line: the last epoch
each reported."""

from __future__ import annotations

import json
import sys
import tempfile

import ray
from ray import tune

from adaptdl_ray import run_job
from adaptdl_ray.tune import AdaptDLScheduler, AdaptDLTrainableCreator


def train(config):
    import torch

    import adaptdl_core.torch as adl
    adl.init_process_group("gloo")
    data = torch.utils.data.TensorDataset(torch.randn(32, 2), torch.randn(32, 1))
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model = adl.AdaptiveDataParallel(model, optimizer)
    loader = adl.AdaptiveDataLoader(data, batch_size=8)
    for epoch in adl.remaining_epochs_until(2):
        for x, y in loader:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
        tune.report({"epoch": epoch})


def _init():
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             object_store_memory=100 * 2**20)


def main() -> int:
    storage = tempfile.mkdtemp()
    out = {}
    _init()
    try:
        out["run_job"] = run_job(train, storage_path=storage, name="job", verbose=0
                                 ).metrics["epoch"]
    finally:
        ray.shutdown()
    _init()  # a new cluster, where the job id of this driver repeats
    try:
        tuner = tune.Tuner(
            AdaptDLTrainableCreator(train),
            tune_config=tune.TuneConfig(scheduler=AdaptDLScheduler(), num_samples=1),
            run_config=tune.RunConfig(name="sweep", storage_path=storage, verbose=0))
        out["fit"] = [None if r.error else r.metrics["epoch"] for r in tuner.fit()]
    finally:
        ray.shutdown()
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
