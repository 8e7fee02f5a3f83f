"""Quickstart (README): python -m adaptdl_core.launch --replicas 2 --checkpoint-path /tmp/qs
examples/quickstart.py, or under Ray Tune: python examples/quickstart.py --tune"""
import sys

import torch

import adaptdl_core.torch as adl
from adaptdl_core import env


def train(config, report=print):
    adl.init_process_group("gloo")                    # joins the job; 1 process needs nothing
    torch.manual_seed(0)                              # the same data on every replica
    x = torch.randn(2048, 8)
    data = torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True) + 0.1 * torch.randn(2048, 1))
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])
    model = adl.AdaptiveDataParallel(model, optimizer)                 # restored after a restart
    loader = adl.AdaptiveDataLoader(data, batch_size=64, shuffle=True)  # global batch size
    loader.autoscale_batch_size(1024)                 # optional: the goodput-optimal batch
    for epoch in adl.remaining_epochs_until(config["epochs"]):  # resumes at the same sample
        for xb, yb in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            loss.backward()
            optimizer.step()
        if env.replica_rank() == 0:                   # (under Tune, rank 0's reports count)
            report({"epoch": epoch, "loss": loss.item(),
                    "passes": adl.data_progress().data_passes})  # passes over the data


def tune_train(config):
    from ray import tune
    train(config, report=tune.report)


if __name__ == "__main__" and "--tune" in sys.argv:
    from ray import tune
    from adaptdl_ray.tune import AdaptDLScheduler, AdaptDLTrainableCreator
    tuner = tune.Tuner(AdaptDLTrainableCreator(tune_train),
                       param_space={"lr": tune.loguniform(1e-3, 1e-1), "epochs": 5},
                       tune_config=tune.TuneConfig(scheduler=AdaptDLScheduler(), num_samples=4,
                                                   metric="loss", mode="min"))
    print("best config:", tuner.fit().get_best_result().config)
elif __name__ == "__main__":
    train({"lr": 0.05, "epochs": 5})
