"""A small elastic job whose steps behave like a GPU model's on a machine that has none.

A step of a real model on a GPU takes time in proportion to its local batch, so a second
replica halves it; on a laptop with two cores, more replicas of a CPU model only share the
same cores. This job trains a small regression model and, after each batch, waits as long
as a compute-bound step of that local batch would take (``--ms-per-sample``), so that the
throughput model AdaptDL fits sees replicas that pay, as on a cluster of GPUs. It is what
the command-line walkthrough (examples/cli_session.sh) submits. Everything else is an
ordinary adaptdl_core script: it resumes exactly after a stop, on any number of replicas.

    python -m adaptdl_core.launch --replicas 2 examples/simulated_gpu_job.py --epochs 5
"""

import argparse
import time

import torch

import adaptdl_core.torch as adl
from adaptdl_core import env

p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
p.add_argument("--epochs", type=int, default=100)
p.add_argument("--samples", type=int, default=96, help="samples in the dataset")
p.add_argument("--batch-size", type=int, default=16, help="global batch size")
p.add_argument("--ms-per-sample", type=float, default=10.0,
               help="milliseconds a step takes per sample of its local batch")
args = p.parse_args()

adl.init_process_group("gloo")
torch.manual_seed(0)
x = torch.randn(args.samples, 16)
data = torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True))
model = torch.nn.Linear(16, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
model = adl.AdaptiveDataParallel(model, optimizer)
loader = adl.AdaptiveDataLoader(data, batch_size=args.batch_size, shuffle=True)
for epoch in adl.remaining_epochs_until(args.epochs):
    for xb, yb in loader:
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        loss.backward()
        optimizer.step()
        time.sleep(args.ms_per_sample * len(xb) / 1000)  # the step a GPU would take
    if env.replica_rank() == 0 and epoch % 20 == 0:
        print(f"epoch {epoch}: loss {loss.item():.4f} on {env.num_replicas()} replica(s)",
              flush=True)
