"""Training functions run by the Ray Tune tests (imported by the worker actors).

``counting_job`` trains a tiny linear model on items that carry their own index and
appends what every replica sees to ``config["record_dir"]`` (one JSON line per event):
the sample indices of each batch with the epoch, replica count and restart number, so a
test can check that every epoch saw every sample exactly once across resizes.
"""

from __future__ import annotations

import json
import os
import time

import torch
from ray import tune

import adaptdl_core.env as env
import adaptdl_core.torch as adl


class IndexedData(torch.utils.data.Dataset):
    """``size`` items ``(index, x, y)`` of a noisy linear regression."""

    def __init__(self, size: int):
        g = torch.Generator().manual_seed(7)
        self.x = torch.randn(size, 2, generator=g)
        self.y = self.x @ torch.tensor([1.0, -1.0]) + 0.1 * torch.randn(size, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return i, self.x[i], self.y[i]


def counting_job(config: dict) -> None:
    """Config: ``record_dir``, ``epochs``, ``size``, ``batch_size``, ``sleep`` (seconds per
    batch), ``report_every`` (batches between reports), optional ``autoscale`` (max batch)."""
    torch.manual_seed(0)
    adl.init_process_group("gloo")
    rank, restarts, replicas = env.replica_rank(), env.num_restarts(), env.num_replicas()
    path = os.path.join(config["record_dir"], f"restart{restarts}-rank{rank}.jsonl")
    log = open(path, "a", buffering=1)
    loader = adl.AdaptiveDataLoader(IndexedData(config["size"]),
                                    batch_size=config["batch_size"], shuffle=True)
    if config.get("autoscale"):
        loader.autoscale_batch_size(config["autoscale"], local_bsz_bounds=(2, 64))
    net = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    model = adl.AdaptiveDataParallel(net, opt)
    log.write(json.dumps({"event": "start", "replicas": replicas, "restarts": restarts,
                          "nodes": env.num_nodes(), "epoch": adl.current_epoch(),
                          "trial_id": tune.get_context().get_trial_id()}) + "\n")
    for epoch in adl.remaining_epochs_until(config["epochs"]):
        # A restart at the very end of an epoch resumes with no batch left in it.
        loss = torch.tensor(float("nan"))
        for step, (idx, x, y) in enumerate(loader):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x).squeeze(1), y)
            loss.backward()
            opt.step()
            log.write(json.dumps({"event": "batch", "epoch": epoch, "idx": idx.tolist(),
                                  "replicas": replicas, "restarts": restarts}) + "\n")
            time.sleep(config.get("sleep", 0.0))
            if (step + 1) % config.get("report_every", 5) == 0:
                tune.report({"epoch": epoch, "loss": loss.item(),
                             "report_key": f"{epoch}:{loader.current_index}"})
        tune.report({"epoch": epoch, "loss": loss.item(), "report_key": f"{epoch}:end"})
    log.write(json.dumps({"event": "finished"}) + "\n")
