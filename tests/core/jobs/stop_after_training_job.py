"""A quickstart-shaped epoch loop (a training loop, then a validation loop, then a report
of the training loop's last ``loss``) that asks to stop at a chosen point after the
training loop of one epoch: the report must still see ``loss`` and a resumption must start
the next epoch. Prints one JSON line per report and per interrupt (rank 0)."""

import argparse
import json

import torch

import adaptdl_core.torch as adl
from adaptdl_core import env

p = argparse.ArgumentParser()
p.add_argument("--epochs", type=int, default=4)
p.add_argument("--stop-epoch", type=int, default=1)
p.add_argument("--stop-at", choices=["last-batch", "validation", "none"], default="none")
args = p.parse_args()

adl.init_process_group("gloo")
torch.manual_seed(0)
x = torch.randn(96, 4)
data = torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True))
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
model = adl.AdaptiveDataParallel(model, optimizer)
loader = adl.AdaptiveDataLoader(data, batch_size=16)
valid = adl.AdaptiveDataLoader(data, batch_size=16)
rank = env.replica_rank()


def emit(**event):
    if rank == 0:
        print(json.dumps(event), flush=True)


for epoch in adl.remaining_epochs_until(args.epochs):
    for i, (xb, yb) in enumerate(loader):
        if args.stop_at == "last-batch" and epoch == args.stop_epoch and \
                i == len(loader) - 1 and rank == 0 and env.num_restarts() == 0:
            # Asked before the loop's last step: agreed at the loop's last boundary.
            emit(event="interrupt", epoch=epoch)
            adl.request_checkpoint_and_exit()
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        for j, (xb, yb) in enumerate(valid):
            if args.stop_at == "validation" and epoch == args.stop_epoch and j == 1 \
                    and rank == 0 and env.num_restarts() == 0:
                emit(event="interrupt", epoch=epoch)
                adl.request_checkpoint_and_exit()
            torch.nn.functional.mse_loss(model(xb), yb)
    emit(event="report", epoch=epoch, loss=loss.item(), restart=env.num_restarts())
