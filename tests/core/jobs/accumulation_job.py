"""Gradient averaging over replicas and accumulation micro-batches, checked exactly.

Least squares on float64 data with 2 micro-batches of 4 samples per replica and
optimizer step (set directly: the check is about averaging, not about the goodput
choice, which is held fixed). After each step's last backward pass every replica gathers
all replicas' samples of the step and compares the model's gradient with the gradient
of the mean loss over all of them, X^T (X w - y) / N. Prints one JSON line: steps
checked, the largest absolute difference, noise measurements recorded.
"""

import json
import sys

import torch
import torch.distributed as dist

import adaptdl_core.torch as adl
from adaptdl_core import env

LOCAL_BSZ, MICROS = 4, 2


def main():
    adl.init_process_group("gloo")
    replicas = env.num_replicas()
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(512, 6, generator=gen, dtype=torch.float64)
    y = x @ torch.linspace(-1, 1, 6, dtype=torch.float64) + torch.randn(512, generator=gen,
                                                                        dtype=torch.float64)
    model = torch.nn.Linear(6, 1, bias=False).double()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ddp = adl.AdaptiveDataParallel(model, opt)
    batch = LOCAL_BSZ * MICROS * replicas
    loader = adl.AdaptiveDataLoader(torch.utils.data.TensorDataset(x, y), batch_size=batch,
                                    shuffle=True)
    loader.autoscale_batch_size(batch, gradient_accumulation=True)
    loader._state.local_bsz, loader._state.accum_steps = LOCAL_BSZ, MICROS - 1
    loader._cycle.choose = lambda current, initial: current
    checked, worst, xs, ys = 0, 0.0, [], []
    for _epoch in adl.remaining_epochs_until(3):
        for xb, yb in loader:
            opt.zero_grad()
            (0.5 * (ddp(xb).squeeze(1) - yb).pow(2).mean()).backward()
            xs.append(xb)
            ys.append(yb)
            if not loader.is_accumulation_step:
                parts = [None] * replicas
                dist.all_gather_object(parts, (xs, ys))
                xs, ys = [], []
                if all(len(b) == LOCAL_BSZ for px, py in parts for b in py) and \
                        all(len(py) == MICROS for _, py in parts):
                    big_x = torch.cat([b for px, _ in parts for b in px])
                    big_y = torch.cat([b for _, py in parts for b in py])
                    w = model.weight.detach().reshape(-1)
                    expect = big_x.T @ (big_x @ w - big_y) / len(big_y)
                    worst = max(worst, float((model.weight.grad.reshape(-1) - expect).abs().max()))
                    checked += 1
            opt.step()
    print(json.dumps({"checked": checked, "max_err": worst,
                      "updates": ddp.gns.num_updates if ddp.gns is not None else 0}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
